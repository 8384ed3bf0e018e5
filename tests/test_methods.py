"""The registry of training methods (`config.methods`): each method declared once, everything that
branches on a method reading it there, so that a new method is one registration and one recipe
script. A toy method, written here as a user would write it, goes through parse, plan, training,
the card and the report with no file of the package changed."""

import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from medrecipes.config import METHODS, method_named
from medrecipes.config.methods import register_method
from medrecipes.errors import UserError

ROOT = Path(__file__).resolve().parent.parent

# A method of its own: continued pretraining with the input embeddings frozen, declared with its
# config class, and its script naming the data and the trainer, as recipes/cpt.py does.
TOY_SCRIPT = textwrap.dedent(
    '''
    """Continued pretraining with the input embeddings frozen."""
    from dataclasses import dataclass, field

    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from medrecipes.config import CPTConfig, Method, register_method
    from medrecipes.data.pretraining import pretraining_data
    from medrecipes.models.loading import load_model, recipe_tokenizer
    from medrecipes.runs.settle import settle_run
    from medrecipes.training.run import end_run, train_and_save
    from medrecipes.training.run_folder import claim_run_folder
    from medrecipes.training.trainers import CausalLMTrainer


    @dataclass
    class FrozenEmbeddingsConfig(CPTConfig):
        frozen_embeddings: bool = field(default=True, metadata={"help": "Keep the input embeddings as loaded."})


    METHOD = register_method(
        Method("frozen-embeddings", FrozenEmbeddingsConfig, formats=("text", "usmle"), chat="none", script=__file__)
    )


    def main(recipe, training_args, model_args):
        if claim_run_folder(METHOD.name, recipe, training_args, model_args):
            return
        tokenizer = recipe_tokenizer(recipe, model_args)
        run = settle_run(METHOD.name, recipe, training_args, model_args, tokenizer)
        train, evals = pretraining_data(recipe, tokenizer, training_args.max_length)
        model = load_model(model_args, recipe, tokenizer, run.activation_checkpointing)
        model.get_input_embeddings().weight.requires_grad_(not training_args.frozen_embeddings)
        trainer = CausalLMTrainer(
            model=model,
            args=training_args,
            train_dataset=train,
            eval_dataset=evals or None,
            processing_class=tokenizer,
            data_collator=DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_token_id),
        )
        train_and_save(trainer, run.resume_from)
        end_run(trainer)
    '''
)


@pytest.fixture
def toy_script(tmp_path, monkeypatch):
    """The toy method's script, imported (which registers it); unregistered afterwards. The trainer
    pickles the training arguments with each checkpoint, so their class's module must be found."""
    path = tmp_path / "frozen_embeddings.py"
    path.write_text(TOY_SCRIPT, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("frozen_embeddings", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "frozen_embeddings", module)
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        METHODS.pop("frozen-embeddings", None)


def test_a_new_method_is_one_registration_and_one_script(toy_script, tiny_model, tmp_path):
    import torch
    from safetensors.torch import load_file

    from medrecipes.config import parse_recipe, recipe_method
    from medrecipes.hub.card import card_of_run
    from medrecipes.plan.summary import plan
    from medrecipes.report.page import write_report

    out, data = tmp_path / "run", tmp_path / "notes.jsonl"
    data.write_bytes((ROOT / "data/medical_text/train.jsonl").read_bytes())
    recipe_file = tmp_path / "frozen.yaml"
    recipe_file.write_text(
        yaml.safe_dump(
            {
                "model_name_or_path": tiny_model,
                "dtype": "float32",
                "dataset_mixture": {"sources": [{"path": "json", "data_files": str(data)}]},
                "eval_sets": {"text": {"path": "json", "data_files": str(ROOT / "data/medical_text/eval.jsonl")}},
                "max_length": 64,
                "frozen_embeddings": True,
                "use_cpu": True,
                "max_steps": 4,
                "per_device_train_batch_size": 4,
                "learning_rate": 1e-2,
                "eval_strategy": "no",
                "save_strategy": "steps",
                "save_steps": 2,
                "logging_steps": 1,
                "report_to": "none",
                "output_dir": str(out),
            }
        )
    )
    assert recipe_method(str(recipe_file)) == "frozen-embeddings"  # its own key tells it from CPT

    parsed = parse_recipe("frozen-embeddings", [str(recipe_file)])
    planned = plan(*parsed, str(recipe_file))
    assert planned["total_steps"] == 4 and not planned["grpo"] and planned["preference"] is None

    with pytest.raises(SystemExit) as ended:  # end_run: the process ends with the run's status
        toy_script.main(*parsed)
    assert ended.value.code == 0
    start = load_file(str(Path(tiny_model) / "model.safetensors"))
    trained = load_file(str(out / "final" / "model.safetensors"))
    embeddings = next(name for name in start if "embed_tokens" in name)
    moved = [name for name in start if name != embeddings and not torch.equal(start[name], trained[name])]
    assert torch.equal(start[embeddings], trained[embeddings]) and moved  # what the method does

    record = json.loads((out / "run.json").read_text())
    assert record["settled"]["method"] == "frozen-embeddings" and record["script"] == toy_script.__file__

    # The card and the report read run.json alone: made where the method is not registered and the
    # data is gone, the card names both as the run recorded them.
    data.unlink()
    METHODS.pop("frozen-embeddings")
    card_of_run(str(out), [], str(tmp_path / "card"), None, overwrite=False)
    card = (tmp_path / "card" / "README.md").read_text()
    revision = record["card"]["sources"][0]["revision"]
    assert revision.startswith("sha256:") and f"| {revision} |" in card, card
    assert "frozen-embeddings" in card and "frozen_embeddings: true" in card and toy_script.__file__ in card

    plots = write_report([str(out)], str(tmp_path / "report.html"))
    page = (tmp_path / "report.html").read_text()
    assert toy_script.__file__ in page and "frozen_embeddings" in page and plots, sorted(plots)


def test_the_builtin_methods_and_what_they_decide():
    assert list(METHODS) == ["cpt", "sft", "grpo", "dpo", "kto"]
    assert {m.script for m in METHODS.values()} == {f"recipes/{name}.py" for name in METHODS}
    for method in METHODS.values():
        assert (ROOT / method.script).is_file(), method.script
    assert [m.name for m in METHODS.values() if m.generates] == ["grpo"]
    assert method_named("dpo").sequences_per_example == 2 and method_named("kto").sequences_per_example == 1
    with pytest.raises(UserError, match="unknown method 'ppo'; one of cpt, sft"):
        method_named("ppo")
    with pytest.raises(ValueError, match="registered already"):
        register_method(method_named("sft"))


@pytest.mark.parametrize("method", [m for m in METHODS if m != "cpt"])
def test_a_source_in_a_format_the_method_does_not_train_on_is_refused_at_parse(method, tmp_path):
    """Every method names the formats it trains on; a source in another is one line when the recipe
    is read, for its training sources and its eval sets alike, before anything loads."""
    from medrecipes.config import parse_recipe

    trains = method_named(method)
    wrong = next(f for f in ("text", "usmle", "chat", "preference", "unpaired") if f not in trains.formats)
    right = trains.formats[0]
    for mixture, evals in ((wrong, right), (right, wrong)):
        recipe = tmp_path / f"{method}.yaml"
        recipe.write_text(
            yaml.safe_dump(
                {
                    "model_name_or_path": str(tmp_path / "model"),  # beside output_dir, not around it
                    "dataset_mixture": {"sources": [{"path": "json", "data_files": "a.jsonl", "format": mixture}]},
                    "eval_sets": {"held": {"path": "json", "data_files": "b.jsonl", "format": evals}},
                    "output_dir": str(tmp_path / "out"),
                    "use_cpu": True,
                }
            )
        )
        with pytest.raises(UserError) as err:
            parse_recipe(method, [str(recipe)])
        assert f"format {wrong} is not what {method.upper()} trains on" in str(err.value), str(err.value)


def test_a_card_of_a_run_that_recorded_no_card_facts_is_one_line(tmp_path):
    """A run.json written by an earlier medrecipes holds no card facts: `medrecipes card` says so in
    one line and writes nothing, rather than working them out from today's recipe and data."""
    from medrecipes.hub.card import card_of_run

    out = tmp_path / "run"
    (out / "final").mkdir(parents=True)
    (out / "trainer_state.json").write_text(json.dumps({"log_history": [], "global_step": 1}))
    record = {"script": "recipes/cpt.py", "command": "python recipes/cpt.py", "recipe": {"max_length": 64}}
    record["finished"] = {"global_step": 1, "hardware": "1 x CPU"}
    (out / "run.json").write_text(json.dumps(record))
    with pytest.raises(UserError, match="recorded no card facts .*train it again with this version"):
        card_of_run(str(out), [], str(tmp_path / "card"), None, overwrite=False)
    assert not (tmp_path / "card").exists()


def _damaged_records():
    """Each fact the card reads from run.json, left out and given a value of another kind."""
    from medrecipes.runs.described import CARD_FACTS

    for key in CARD_FACTS:
        yield f"card.{key} missing", ("card", key), None
        yield f"card.{key} of another kind", ("card", key), {"a": 1}
    yield "card.sources holding text", ("card", "sources"), ["not a row"]
    for path in (("script",), ("command",), ("settled", "method"), ("finished", "hardware")):
        yield f"{'.'.join(path)} missing", path, None
        yield f"{'.'.join(path)} a number", path, 3


@pytest.mark.parametrize(
    "path, value", [case[1:] for case in _damaged_records()], ids=[c[0] for c in _damaged_records()]
)
def test_a_card_fact_damaged_in_run_json_is_one_line(tmp_path, path, value):
    """A run.json edited or cut by hand: whatever fact the card reads is missing or of another kind,
    `medrecipes card` says which in one line and writes nothing."""
    from conftest import card_record

    from medrecipes.config import parse_recipe
    from medrecipes.hub.card import card_of_run

    out = tmp_path / "run"
    (out / "final").mkdir(parents=True)
    (out / "trainer_state.json").write_text(json.dumps({"log_history": [], "global_step": 1}))
    record = card_record("cpt", parse_recipe("cpt", [str(ROOT / "recipes/tiny_cpt.yaml")]))
    record["finished"]["global_step"] = 1
    *parents, key = path
    holder = record
    for name in parents:
        holder = holder[name]
    if value is None:
        del holder[key]
    else:
        holder[key] = value
    (out / "run.json").write_text(json.dumps(record))
    with pytest.raises(UserError, match=r"run\.json: (card facts without '|card fact '|'[\w.]+' is not text)"):
        card_of_run(str(out), [], str(tmp_path / "card"), None, overwrite=False)
    assert not (tmp_path / "card").exists()


@pytest.mark.parametrize(
    "left", [[], ["config.json"], ["adapter_config.json"]], ids=["empty", "no weights", "adapter config alone"]
)
def test_a_card_of_a_final_folder_that_is_not_whole_is_one_line(tmp_path, left):
    """final/ emptied or cut short after the run finished (its record whole): the card would
    describe weights that are not there, so it is one line naming what is missing, nothing written."""
    from conftest import card_record

    from medrecipes.config import parse_recipe
    from medrecipes.hub.card import card_of_run

    out = tmp_path / "run"
    (out / "final").mkdir(parents=True)
    for name in left:
        (out / "final" / name).write_text("{}")
    (out / "trainer_state.json").write_text(json.dumps({"log_history": [], "global_step": 1}))
    record = card_record("cpt", parse_recipe("cpt", [str(ROOT / "recipes/tiny_cpt.yaml")]))
    (out / "run.json").write_text(json.dumps(record))
    missing = "config.json" if not left else "weights"
    with pytest.raises(UserError, match=rf"final: no {missing} there, so the run's model is not whole"):
        card_of_run(str(out), [], str(tmp_path / "card"), None, overwrite=False)
    assert not (tmp_path / "card").exists()
