"""Tests for `medrecipes merge-lora`: the merged model is plain and computes what base + adapter compute."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import CORPUS
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from medrecipes import cli
from medrecipes.models.tiny import build_tiny_model

SENTENCE = "The patient presented with chest pain radiating to the left arm."


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> str:
    return build_tiny_model(str(tmp_path_factory.mktemp("base")), [str(CORPUS)], "llama")


@pytest.fixture(scope="module")
def adapter(base, tmp_path_factory) -> str:
    """A LoRA adapter on q_proj and v_proj whose B matrices are non-zero, so that it changes the output."""
    model = AutoModelForCausalLM.from_pretrained(base)
    peft_model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            # PEFT starts B at zero, which makes a fresh adapter a no-op.
            if "lora_B" in name:
                param.normal_(std=0.2)
    path = str(tmp_path_factory.mktemp("adapter"))
    peft_model.save_pretrained(path)
    with open(os.path.join(path, "adapter_config.json")) as f:
        assert json.load(f)["base_model_name_or_path"] == base
    return path


def logits(model, tokenizer) -> torch.Tensor:
    inputs = tokenizer(SENTENCE, return_tensors="pt")
    with torch.no_grad():
        return model(**inputs).logits


def test_merged_model_is_plain_and_equals_base_plus_adapter(base, adapter, tmp_path, capsys):
    out = str(tmp_path / "merged")
    cli.main(["merge-lora", adapter, out])
    assert out in capsys.readouterr().out

    merged = AutoModelForCausalLM.from_pretrained(out)
    assert not isinstance(merged, PeftModel)
    assert not any("lora" in name for name, _ in merged.named_modules())
    assert type(merged.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    assert not os.path.exists(os.path.join(out, "adapter_config.json"))
    assert os.path.isfile(os.path.join(out, "generation_config.json"))
    base_model = AutoModelForCausalLM.from_pretrained(base)
    assert merged.generation_config.eos_token_id == base_model.generation_config.eos_token_id

    tokenizer = AutoTokenizer.from_pretrained(out)
    with_adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter)
    expected = logits(with_adapter, tokenizer)
    got = logits(merged, tokenizer)
    assert torch.allclose(got, expected, atol=1e-5)
    assert not torch.allclose(got, logits(base_model, tokenizer), atol=1e-3)


def test_tokenizer_saved_with_the_adapter_wins(base, adapter, tmp_path, capsys):
    adapter_copy = shutil.copytree(adapter, tmp_path / "adapter")
    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.chat_template = "{{ messages[0]['content'] }}"
    tokenizer.save_pretrained(adapter_copy)
    out = tmp_path / "merged"
    cli.main(["merge-lora", str(adapter_copy), str(out), "--dtype", "bfloat16"])
    capsys.readouterr()
    assert AutoTokenizer.from_pretrained(out).chat_template == "{{ messages[0]['content'] }}"
    assert AutoModelForCausalLM.from_pretrained(out, dtype="auto").dtype == torch.bfloat16


@pytest.mark.parametrize("folder", ["base", "missing"])
def test_folder_without_adapter_config(folder, base, tmp_path, capsys):
    path = base if folder == "base" else str(tmp_path / "missing")
    with pytest.raises(SystemExit) as info:
        cli.main(["merge-lora", path, str(tmp_path / "out")])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert err.startswith("error: merge-lora:")
    assert path in err
    assert not (tmp_path / "out").exists()


def test_adapter_config_without_base(adapter, tmp_path, capsys):
    adapter_copy = shutil.copytree(adapter, tmp_path / "adapter")
    config_path = adapter_copy / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = None
    config_path.write_text(json.dumps(config))
    with pytest.raises(SystemExit) as info:
        cli.main(["merge-lora", str(adapter_copy), str(tmp_path / "out")])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert "base_model_name_or_path" in err


def test_a_merge_keeps_the_system_prompt_its_adapters_run_trained_with(adapter, tmp_path):
    """The merge is asked as its adapter's run trained (serve, eval, generate say the prompt), also
    once that run's folder is moved or removed: merged_from.json keeps it."""
    import shutil

    from medrecipes.locations import trained_system_prompt

    final = shutil.copytree(adapter, tmp_path / "run" / "final")
    (tmp_path / "run" / "run.json").write_text(json.dumps({"recipe": {"system_prompt": "Answer briefly."}}))
    cli.main(["merge-lora", str(final), str(tmp_path / "merged")])
    assert json.loads((tmp_path / "merged" / "merged_from.json").read_text())["system_prompt"] == "Answer briefly."
    shutil.rmtree(tmp_path / "run")
    assert trained_system_prompt(str(tmp_path / "merged")) == (True, "Answer briefly.")
    cli.main(["merge-lora", adapter, str(tmp_path / "unknown")])  # an adapter with no run: nothing known
    assert "system_prompt" not in json.loads((tmp_path / "unknown" / "merged_from.json").read_text())
    assert trained_system_prompt(str(tmp_path / "unknown")) == (False, None)


def test_an_evaluation_of_the_merge_counts_as_one_of_the_adapters_run(adapter, tmp_path, capsys):
    """merge-lora records the adapter it folded in; `medrecipes eval` of the merged folder carries that
    record, so the LoRA run's card takes the evaluation (its final/ is the adapter), and no other run's."""
    from medrecipes.errors import UserError
    from medrecipes.hub.card import _check_scored_model
    from medrecipes.locations import weights_fingerprint

    out = tmp_path / "merged"
    cli.main(["merge-lora", adapter, str(out)])
    record = json.loads((out / "merged_from.json").read_text())
    assert record["adapter_fingerprint"] == weights_fingerprint(adapter) != weights_fingerprint(str(out))
    assert record["adapter"] == os.path.abspath(adapter)
    questions = tmp_path / "ori_pqal.json"
    questions.write_text(json.dumps({
        str(i): {"QUESTION": f"Does drug {i} help?", "CONTEXTS": ["A trial."], "final_decision": ("yes", "no")[i % 2]}
        for i in range(4)
    }))  # fmt: skip
    evaluation = tmp_path / "eval.json"
    cli.main(["eval", "--model", str(out), "--tasks", "pubmedqa", "--data", f"pubmedqa={questions}",
              "--output", str(evaluation)])  # fmt: skip
    settings = json.loads(evaluation.read_text())["settings"]
    assert settings["merged_adapter_fingerprint"] == weights_fingerprint(adapter)
    _check_scored_model(str(evaluation), adapter)  # the LoRA run's final/ is this adapter
    _check_scored_model(str(evaluation), str(shutil.copytree(adapter, tmp_path / "adapter-copy")))
    other = shutil.copytree(adapter, tmp_path / "other-adapter")
    (other / "adapter_model.safetensors").write_bytes(b"other weights")
    with pytest.raises(UserError, match="nor a merge-lora output of it"):
        _check_scored_model(str(evaluation), str(other))
    # A merged folder whose record is unreadable is only its own weights.
    (out / "merged_from.json").write_text("{not json")
    cli.main(["eval", "--model", str(out), "--tasks", "pubmedqa", "--data", f"pubmedqa={questions}",
              "--output", str(evaluation), "--overwrite"])  # fmt: skip
    assert json.loads(evaluation.read_text())["settings"]["merged_adapter_fingerprint"] is None
    with pytest.raises(UserError, match="nor a merge-lora output of it"):
        _check_scored_model(str(evaluation), adapter)


def test_a_run_starts_from_an_adapter_folder_as_the_model_it_made(base, adapter, tmp_path, capsys):
    """model_name_or_path an earlier stage's LoRA output: the model loads with the adapter folded
    into its base, every weight trainable (PEFT loads the base frozen); a new adapter or a quantised
    base on it would name the bare base as its own, so that is refused before anything loads."""
    from trl import ModelConfig

    from medrecipes.errors import UserError
    from medrecipes.models.loading import check_model_settings, load_model

    tokenizer = AutoTokenizer.from_pretrained(adapter if os.path.isfile(f"{adapter}/tokenizer.json") else base)
    model = load_model(ModelConfig(model_name_or_path=adapter), None, tokenizer)
    assert not any("lora" in name for name, _ in model.named_modules())
    assert all(p.requires_grad for p in model.parameters())
    with_adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter)
    assert torch.allclose(logits(model, tokenizer), logits(with_adapter, tokenizer), atol=1e-5)
    with pytest.raises(UserError, match="is a LoRA adapter.*merge it first"):
        check_model_settings(ModelConfig(model_name_or_path=adapter, use_peft=True))


def test_an_adapter_folder_is_planned_with_its_bases_shape(base, adapter, capsys):
    """The config of an adapter's folder, as a plan and a run's settling read it, is its base's
    (the folder holds no config.json); read without PEFT, which the plan keeps out of its process."""
    from medrecipes.cli import main
    from medrecipes.models.loading import load_config

    assert load_config(adapter).to_dict() == load_config(base).to_dict()
    main(["plan", "recipes/tiny_sft.yaml", "--model_name_or_path", adapter])
    assert "ddp fits on" in capsys.readouterr().out


def test_an_adapter_whose_base_changed_since_its_run_started_says_so(base, adapter, tmp_path, caplog):
    """A run's adapter (output_dir/final, beside run.json) whose base was trained again or copied
    over since the run started from it: folded into those other weights, with a warning; the base
    as the run had it, no word."""
    from medrecipes.errors import UserError
    from medrecipes.locations import SAMPLED, weights_fingerprint
    from medrecipes.models.loading import load_merged_adapter

    own_base = tmp_path / "base"
    shutil.copytree(base, own_base)
    final = tmp_path / "run" / "final"
    shutil.copytree(adapter, final)
    config = json.loads((final / "adapter_config.json").read_text())
    (final / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": str(own_base)}))
    record = {
        "script": "recipes/sft.py",
        "model": str(own_base),
        "weights": weights_fingerprint(str(own_base), SAMPLED),
    }
    (tmp_path / "run" / "run.json").write_text(json.dumps(record))
    with caplog.at_level("WARNING"):
        load_merged_adapter(str(final))
    assert "is not the model its run trained it on" not in caplog.text
    model = AutoModelForCausalLM.from_pretrained(own_base)
    with torch.no_grad():
        model.lm_head.weight.mul_(2)
    model.save_pretrained(own_base)  # the base trained again in place
    with caplog.at_level("WARNING"):
        load_merged_adapter(str(final))
    assert f"{final}: its base {own_base} is not the model its run trained it on" in caplog.text
    merged = subprocess.run(  # the command, which sets up no logging, marks it as a warning beside its error lines
        [sys.executable, "-m", "medrecipes.cli", "merge-lora", str(final), str(tmp_path / "merged")],
        capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert merged.returncode == 0, merged.stderr
    assert f"warning: {final}: its base {own_base} is not the model" in merged.stderr
    shutil.rmtree(own_base)
    build_tiny_model(str(own_base), [str(CORPUS)], "llama", hidden_size=96)  # rebuilt at another width
    caplog.clear()
    with caplog.at_level("WARNING"), pytest.raises(UserError, match="whose weights changed since the adapter's run"):
        load_merged_adapter(str(final))
    assert "is not the model its run trained it on" not in caplog.text  # not applied, then refused: one line


def test_an_adapter_config_of_another_rank_than_its_weights_names_r(adapter, tmp_path, capsys):
    """adapter_config.json's r edited (or copied from another run): the line names r and the rank
    the weights have, not the base model."""
    edited = tmp_path / "edited"
    shutil.copytree(adapter, edited)
    config = json.loads((edited / "adapter_config.json").read_text())
    (edited / "adapter_config.json").write_text(json.dumps({**config, "r": 4}))
    with pytest.raises(SystemExit) as exit:
        cli.main(["merge-lora", str(edited), str(tmp_path / "merged")])
    assert exit.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: {edited}/adapter_config.json: r 4, and the adapter's weights are of rank 8; set r: 8 (or copy "
        "adapter_config.json again from the run that saved these weights)"
    )


@pytest.mark.parametrize("edit", [{"use_dora": True}, {"target_modules": ["q_proj", "v_proj", "o_proj"]}])
def test_an_adapter_config_that_calls_for_weights_the_file_lacks_is_one_line(adapter, tmp_path, capsys, edit):
    """adapter_config.json edited to build more than the weights hold (DoRA's magnitudes, another
    module): PEFT warned and merged the missing tensors as initialised; refused, with what is missing."""
    edited = tmp_path / "edited"
    shutil.copytree(adapter, edited)
    config = json.loads((edited / "adapter_config.json").read_text())
    (edited / "adapter_config.json").write_text(json.dumps({**config, **edit}))
    with pytest.raises(SystemExit) as exit:
        cli.main(["merge-lora", str(edited), str(tmp_path / "merged")])
    line = capsys.readouterr().err.splitlines()[-1]
    assert exit.value.code == 2 and line.startswith(f"error: {edited}/adapter_config.json calls for "), line
    assert ("lora_magnitude_vector" if "use_dora" in edit else "lora_A, lora_B") in line
    assert line.endswith("copy adapter_config.json again from the run that saved these weights")
    assert not (tmp_path / "merged").exists()


def test_weights_that_hold_nan_are_one_line_wherever_they_load(base, adapter, tmp_path, capsys):
    """An adapter (or a model) saved by a run that diverged: merging, generating and evaluating
    with it would give NaN losses and empty answers without a word; the tensor is named."""
    from safetensors.torch import load_file, save_file

    diverged = tmp_path / "diverged"
    shutil.copytree(adapter, diverged)
    weights = load_file(diverged / "adapter_model.safetensors")
    name = next(k for k in sorted(weights) if "lora_A" in k)
    weights[name][0, 0] = float("nan")
    save_file(weights, diverged / "adapter_model.safetensors")
    nan_model = tmp_path / "nan-model"
    shutil.copytree(base, nan_model)
    model = AutoModelForCausalLM.from_pretrained(base)
    with torch.no_grad():
        model.model.norm.weight[0] = float("inf")
    model.save_pretrained(nan_model)
    for argv, words in ((["merge-lora", str(diverged), str(tmp_path / "merged")], "q_proj.weight holds NaN"),
                        (["generate", str(nan_model), "--prompt", "hi"], "model.norm.weight holds NaN or infinite")):  # fmt: skip
        with pytest.raises(SystemExit) as exit:
            cli.main(argv)
        line = capsys.readouterr().err.splitlines()[-1]
        assert exit.value.code == 2 and words in line, line
    assert not (tmp_path / "merged").exists()


def test_generation_settings_a_model_saved_out_of_range_are_said(base, tmp_path, caplog):
    """A generation_config.json sampling value out of generate()'s range is said where the model
    loads (medrecipes answers with its own settings; other tools would fail on it)."""
    from medrecipes.models.loading import load_for_inference

    edited = tmp_path / "edited"
    shutil.copytree(base, edited)
    config = json.loads((edited / "generation_config.json").read_text())
    (edited / "generation_config.json").write_text(json.dumps({**config, "do_sample": True, "temperature": -1.0}))
    with caplog.at_level("WARNING", logger="medrecipes.models.loading"):
        load_for_inference(str(edited))
    (line,) = [r.getMessage() for r in caplog.records if "generation_config.json" in r.getMessage()]
    assert "generation_config.json's temperature -1.0 is out of the range generate() samples with" in line


def test_a_chat_template_that_opens_no_answer_turn_is_said(base, tmp_path, caplog):
    """A template without its add_generation_prompt block: answers go on the question's turn, said
    where the tokenizer loads; one that renders no question at all is refused."""
    from medrecipes.errors import UserError
    from medrecipes.models.loading import load_tokenizer

    edited = tmp_path / "edited"
    shutil.copytree(base, edited)
    template = (edited / "chat_template.jinja").read_text()
    opened = "{%- if add_generation_prompt -%}\n{{- '<|im_start|>assistant\\n' -}}\n{%- endif -%}\n"
    assert opened in template
    (edited / "chat_template.jinja").write_text(template.replace(opened, ""))
    with caplog.at_level("WARNING", logger="medrecipes.models.templates"):
        load_tokenizer(str(edited))
    assert "its chat template writes nothing for add_generation_prompt" in caplog.text
    (edited / "chat_template.jinja").write_text("{% for m in messages %}{{ m['role'] }}{% endfor %}")
    with pytest.raises(UserError, match="renders a question's turn without the question"):
        load_tokenizer(str(edited))
