"""Tests for `medrecipes plan`: training arithmetic, parameter counts and the memory estimate."""

import json
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from medrecipes import cli
from medrecipes.plan.hardware import GIB, GPUS, gpu_type
from medrecipes.plan.memory import memory_per_device
from medrecipes.plan.shape import ModelShape, flops_per_token, model_shape


def write_recipe(tmp_path: Path, **keys) -> str:
    data = {"use_cpu": True, "report_to": "none", "output_dir": str(tmp_path / "out"), **keys}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


@pytest.fixture
def gemma_cpt(tmp_path) -> str:
    """The substance of the Gemma 3 4B continued-pretraining recipe."""
    return write_recipe(
        tmp_path,
        model_name_or_path="google/gemma-3-4b-pt",
        max_length=8192,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        num_train_epochs=8,
        activation_checkpointing=True,
    )


def plan_json(capsys, *argv: str) -> dict:
    cli.main(["plan", *argv, "--json"])
    return json.loads(capsys.readouterr().out)


def test_gemma_cpt_arithmetic(gemma_cpt, capsys):
    result = plan_json(capsys, gemma_cpt, "--num-gpus", "8", "--dataset-sequences", "4312")
    assert result["tokens_per_step"] == 524288  # 8 sequences x 8 GPUs x 8192 tokens
    assert result["sequences_per_step"] == 64
    assert round(result["steps_per_epoch"]) == 67
    assert result["total_steps"] == 539  # ceil(8 epochs x 4312 / 64)
    assert result["total_tokens"] == 539 * 524288
    # Gemma 3 4B's language model without the vision tower, from the packaged config (no network).
    assert 3.8e9 < result["num_parameters"] < 4.0e9
    assert result["model"]["vocab_size"] > 262_000
    memory = result["memory_gb"]
    assert set(memory) == {"ddp", "zero2", "zero3"}
    assert memory["zero3"] < memory["zero2"] < memory["ddp"]
    breakdown = result["memory_breakdown_gb"]
    # Activations do not depend on how model states are sharded.
    assert breakdown["ddp"]["activations"] == breakdown["zero3"]["activations"] > 0
    assert result["fits"] == {s: memory[s] <= 80 for s in memory}


def test_plan_follows_the_number_of_gpus(gemma_cpt, capsys):
    one = plan_json(capsys, gemma_cpt, "--dataset-sequences", "4312")
    eight = plan_json(capsys, gemma_cpt, "--num-gpus", "8", "--dataset-sequences", "4312")
    assert one["tokens_per_step"] * 8 == eight["tokens_per_step"]
    assert one["total_steps"] == 8 * 539
    assert one["memory_gb"]["ddp"] == eight["memory_gb"]["ddp"]
    assert one["memory_gb"]["zero3"] > eight["memory_gb"]["zero3"]


def test_plan_without_dataset_size_has_no_steps(gemma_cpt, capsys):
    result = plan_json(capsys, gemma_cpt)
    assert result["steps_per_epoch"] is None
    assert result["total_steps"] is None
    assert result["total_tokens"] is None
    cli.main(["plan", gemma_cpt])
    assert "unknown (pass --dataset-sequences)" in capsys.readouterr().out


def test_plan_resolves_token_budget_for_the_planned_gpus(tmp_path, capsys):
    path = write_recipe(
        tmp_path,
        init_from_scratch=True,
        architecture="small",
        tokenizer_name_or_path="some/tokenizer",
        per_device_train_batch_size=16,
        max_length=2048,
        global_batch_tokens=131072,
        total_tokens=11_000_000_000,
    )
    one = plan_json(capsys, path)
    assert one["gradient_accumulation_steps"] == 4
    assert one["tokens_per_step"] == 131072
    assert one["total_steps"] == 83924
    assert one["num_parameters"] == 179_331_840  # the "small" scratch preset
    four = plan_json(capsys, path, "--num-gpus", "4")
    assert four["gradient_accumulation_steps"] == 1
    assert four["tokens_per_step"] == 131072
    assert four["total_steps"] == 83924


def test_plan_text_output(gemma_cpt, capsys):
    cli.main(["plan", gemma_cpt, "--num-gpus", "8", "--dataset-sequences", "4312"])
    lines = capsys.readouterr().out.splitlines()
    per_step = next(line for line in lines if line.startswith("per step"))
    assert per_step.endswith("= 524,288 tokens")
    assert next(line for line in lines if line.startswith("total steps")).split()[-1] == "539"
    parameters = next(line for line in lines if line.startswith("parameters"))
    assert 3.8e9 < int(parameters.split()[-1].replace(",", "")) < 4.0e9
    assert sum(line.split()[0] in ("ddp", "zero2", "zero3") for line in lines if line.startswith("  ")) == 3


def test_unknown_gpu(gemma_cpt, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["plan", gemma_cpt, "--gpu", "h1000"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error:")
    assert "did you mean 'h100-80gb'" in err


def test_zero_gpus(gemma_cpt, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["plan", gemma_cpt, "--num-gpus", "0"])
    assert info.value.code == 2
    assert "--num-gpus" in capsys.readouterr().err


def test_plan_overrides_the_recipe(gemma_cpt, capsys):
    result = plan_json(capsys, gemma_cpt, "--per_device_train_batch_size", "2", "--max_length", "4096")
    assert result["tokens_per_step"] == 2 * 4096


def test_plan_of_a_recipe_without_model(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["plan", write_recipe(tmp_path)])
    assert info.value.code == 2
    assert "model_name_or_path" in capsys.readouterr().err


def test_a_recipe_starting_from_a_run_not_trained_yet_is_planned_with_its_architecture(capsys):
    # grpo_usmle.yaml starts from the 0.4B pretraining run's final checkpoint.
    recipe = str(ROOT / "recipes" / "grpo_usmle.yaml")
    with pytest.raises(SystemExit) as info:
        cli.main(["plan", recipe, "--model_name_or_path", "outputs/not-trained-yet/final"])
    message = capsys.readouterr().err
    assert info.value.code == 2
    assert "outputs/not-trained-yet/final: no such file or folder" in message and "--architecture" in message
    result = plan_json(
        capsys, recipe, "--model_name_or_path", "outputs/not-trained-yet/final", "--architecture", "medium-large"
    )
    assert result["num_parameters"] == 401_717_376  # the 0.4B preset, "401M" in its table
    assert result["grpo"] and result["reference_model"]


# ---------------------------------------------------------------------------
# memory_per_device

# 2**30 parameters make every model-state term a whole number of GiB, so sharding is exact.
SHAPE = ModelShape(num_parameters=2**30, hidden_size=4096, intermediate_size=16384, num_layers=32, vocab_size=2**15)


def model_states(parts: dict) -> float:
    return parts["weights"] + parts["gradients"] + parts["optimizer"]


def test_model_states_follow_the_zero_paper():
    memory = memory_per_device(SHAPE, 8, batch=1, seq=4096, checkpointing=False)
    # bf16 weights 2P, bf16 gradients 2P, fp32 master weights and Adam moments 12P.
    states = {s: (m["weights"], m["gradients"], m["optimizer"]) for s, m in memory.items()}
    assert states == {"ddp": (2, 2, 12), "zero2": (2, 0.25, 1.5), "zero3": (0.25, 0.25, 1.5)}


def test_grpo_reference_model_and_kv_cache():
    shape = ModelShape(2**30, 4096, 16384, num_layers=32, vocab_size=2**15, kv_width=1024)
    # 8 sequences of 1,024 tokens: 2 (k, v) x 32 layers x 1,024 x 1,024 x 8 x 2 bytes = 1 GiB.
    one = memory_per_device(shape, 1, 1, 1024, True, reference_bytes=2 * 2**30, generation=(8, 1024))["ddp"]
    assert (one["reference"], one["generation"]) == (2, 1)
    assert one["total"] == 2 + 12 + 2 + max(2 + one["activations"], 1)  # gradients are freed while generating
    eight = memory_per_device(shape, 8, 1, 1024, True, reference_bytes=2 * 2**30, generation=(8, 1024))
    assert eight["zero2"]["reference"] == 2 and eight["zero3"]["reference"] == 0.25  # only ZeRO-3 shards it
    assert eight["zero3"]["generation"] == 1 + 2 - 0.25  # the rest of the bf16 weights, gathered to generate
    assert memory_per_device(shape, 1, 1, 1024, True)["ddp"]["generation"] == 0


def test_dpo_and_kto_plans_count_the_reference_model_and_dpo_its_two_answers(tmp_path, capsys):
    def recipe(name: str, layout: str, **keys) -> str:
        data = {
            "path": str(ROOT / f"data/usmle_sample/{layout}_train.jsonl"),
            "format": layout.replace("pairs", "preference"),
        }
        folder = tmp_path / name
        folder.mkdir()
        return write_recipe(folder, model_name_or_path="google/gemma-3-4b-pt", dtype="bfloat16", max_length=1024,
                            per_device_train_batch_size=4, activation_checkpointing=True,
                            dataset_mixture={"sources": [data]}, **keys)  # fmt: skip

    dpo = plan_json(capsys, recipe("dpo", "pairs"))
    kto = plan_json(capsys, recipe("kto", "unpaired"))
    once = plan_json(capsys, recipe("once", "pairs", precompute_ref_log_probs=True))
    lora = plan_json(capsys, recipe("lora", "pairs", use_peft=True))
    assert (dpo["preference"], kto["preference"]) == ("pairs", "answers")
    assert dpo["reference_model"] and kto["reference_model"] and not once["reference_model"]
    assert not lora["reference_model"]  # the base with the adapter switched off
    ddp = dpo["memory_breakdown_gb"]["ddp"]
    assert ddp["reference"] == round(2 * dpo["num_parameters"] / GIB, 2)  # a frozen bf16 copy
    assert once["memory_breakdown_gb"]["ddp"]["reference"] == lora["memory_breakdown_gb"]["ddp"]["reference"] == 0
    # A pair's chosen and rejected answers train together: twice the activations of KTO's one answer.
    kto_activations = kto["memory_breakdown_gb"]["ddp"]["activations"]
    assert ddp["activations"] == pytest.approx(2 * kto_activations, abs=0.02)
    assert ddp["total"] == pytest.approx(
        ddp["weights"] + ddp["gradients"] + ddp["optimizer"] + ddp["activations"] + ddp["reference"], abs=0.05
    )
    cli.main(["plan", recipe("text", "pairs")])
    text = capsys.readouterr().out
    assert "preference        each sequence is one of the pairs (chosen and rejected" in text
    assert "reference model   yes, in ref" in text and "ref" in text.split("memory per device")[1]


def test_plan_takes_prompt_tokens_for_grpo_only(gemma_cpt, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["plan", gemma_cpt, "--prompt-tokens", "300"])
    assert info.value.code == 2 and "--prompt-tokens 300: is for GRPO recipes" in capsys.readouterr().err


def test_zero3_model_states_scale_with_one_over_devices():
    one = memory_per_device(SHAPE, 1, batch=1, seq=4096, checkpointing=True)
    eight = memory_per_device(SHAPE, 8, batch=1, seq=4096, checkpointing=True)
    assert model_states(eight["zero3"]) == model_states(one["zero3"]) / 8
    assert model_states(one["zero3"]) == model_states(one["ddp"]) == 16
    assert model_states(eight["ddp"]) == 16


def test_zero3_scaling_on_a_real_shape():
    shape = ModelShape(3_880_263_168, 2560, 10240, 34, 262208)
    one = memory_per_device(shape, 1, batch=8, seq=8192, checkpointing=True)
    eight = memory_per_device(shape, 8, batch=8, seq=8192, checkpointing=True)
    # Each part is rounded to 0.01 GiB.
    assert model_states(eight["zero3"]) == pytest.approx(model_states(one["zero3"]) / 8, abs=0.02)


def test_activation_estimate_and_checkpointing():
    full = memory_per_device(SHAPE, 1, batch=1, seq=4096, checkpointing=False)["ddp"]["activations"]
    kept = memory_per_device(SHAPE, 1, batch=1, seq=4096, checkpointing=True)["ddp"]["activations"]
    s, b, h, f, layers, vocab = 4096, 1, 4096, 16384, 32, 2**15
    per_layer = 2 * s * b * (6 * h + 4 * f)
    logits = 10 * s * b * vocab
    assert full == round((layers * per_layer + logits) / GIB, 2)
    assert kept == round((layers * 2 * s * b * h + per_layer + logits) / GIB, 2)
    assert kept < full / 5


def test_chunked_lm_head_leaves_the_logits_out(gemma_cpt, capsys):
    fused = plan_json(capsys, gemma_cpt)
    full = plan_json(capsys, gemma_cpt, "--fused_lm_head", "false")
    assert (fused["fused_loss"], full["fused_loss"]) == (True, False)
    logits = 10 * 8192 * 8 * fused["model"]["vocab_size"]  # tokens x vocabulary x 10 bytes
    extra = full["memory_breakdown_gb"]["ddp"]["activations"] - fused["memory_breakdown_gb"]["ddp"]["activations"]
    assert extra == pytest.approx(logits / GIB, abs=0.02)
    sft = plan_json(capsys, gemma_cpt, "--method", "sft")  # TRL's SFT trainer always uses the chunked head
    assert sft["fused_loss"] is True


def test_activations_grow_with_batch_and_sequence():
    def activations(batch, seq):
        return memory_per_device(SHAPE, 1, batch=batch, seq=seq, checkpointing=False)["ddp"]["activations"]

    # Each figure is rounded to 0.01 GiB.
    assert activations(2, 2048) == pytest.approx(2 * activations(1, 2048), abs=0.02)
    assert activations(1, 4096) == pytest.approx(2 * activations(1, 2048), abs=0.02)


def test_totals_add_up():
    memory = memory_per_device(SHAPE, 4, batch=2, seq=2048, checkpointing=True)
    for parts in memory.values():
        expected = parts["weights"] + parts["gradients"] + parts["optimizer"] + parts["activations"]
        assert parts["total"] == pytest.approx(expected, abs=0.01)


# ---------------------------------------------------------------------------
# LoRA and QLoRA

# Gemma 3 4B's text decoder, from the packaged config.
HIDDEN, Q_OUT, KV_OUT, MLP, LAYERS = 2560, 8 * 256, 4 * 256, 10240, 34
GEMMA_PARAMETERS = 3_880_263_168


def gemma_lora_adapters(r: int, targets=("q", "k", "v", "o", "gate", "up", "down")) -> int:
    """r*(in + out) summed over the adapted projections of every layer."""
    shapes = {
        "q": (HIDDEN, Q_OUT),
        "k": (HIDDEN, KV_OUT),
        "v": (HIDDEN, KV_OUT),
        "o": (Q_OUT, HIDDEN),
        "gate": (HIDDEN, MLP),
        "up": (HIDDEN, MLP),
        "down": (MLP, HIDDEN),
    }
    return LAYERS * sum(r * (shapes[t][0] + shapes[t][1]) for t in targets)


# Parameters of the linear layers bitsandbytes quantises; embeddings and norms are the rest.
GEMMA_LINEAR = LAYERS * (HIDDEN * Q_OUT * 2 + HIDDEN * KV_OUT * 2 + 3 * HIDDEN * MLP)


@pytest.fixture
def gemma_peft(tmp_path):
    """A Gemma 3 4B fine-tuning recipe; keys passed to it are added or replaced."""

    def recipe(**keys) -> str:
        base = {
            "model_name_or_path": "google/gemma-3-4b-pt",
            "max_length": 1024,
            "per_device_train_batch_size": 8,
            "activation_checkpointing": True,
            **({"lora_r": 128} if keys.get("use_peft") else {}),
        }
        return write_recipe(tmp_path, **{**base, **keys})

    return recipe


def test_qlora_adapters_and_4bit_base(gemma_peft, capsys):
    qlora = plan_json(capsys, gemma_peft(use_peft=True, load_in_4bit=True))
    full = plan_json(capsys, gemma_peft())
    assert qlora["method"] == "qlora"
    assert full["method"] == "full"
    assert full["adapter_parameters"] == 0
    assert qlora["num_parameters"] == GEMMA_PARAMETERS
    adapters = gemma_lora_adapters(128)
    assert qlora["adapter_parameters"] == adapters == 238_419_968
    ddp = qlora["memory_breakdown_gb"]["ddp"]
    base_bytes = ddp["weights"] * GIB - 2 * adapters  # the bf16 adapter weights are in the weights term
    # The 671M embedding parameters stay in bf16; the quantised linear layers cost ~0.53 bytes per
    # parameter (4 bits plus the fp32 absmax of each 64-parameter block).
    per_linear_parameter = (base_bytes - 2 * (GEMMA_PARAMETERS - GEMMA_LINEAR)) / GEMMA_LINEAR
    assert per_linear_parameter == pytest.approx(0.53, rel=0.1)
    assert base_bytes / GIB == pytest.approx(
        (GEMMA_LINEAR * (0.5 + 4 / 64) + 2 * (GEMMA_PARAMETERS - GEMMA_LINEAR)) / GIB, abs=0.02
    )
    assert ddp["gradients"] == round(2 * adapters / GIB, 2)
    assert ddp["optimizer"] == round(12 * adapters / GIB, 2)
    assert ddp["activations"] == full["memory_breakdown_gb"]["ddp"]["activations"]
    assert qlora["memory_gb"]["ddp"] < full["memory_gb"]["ddp"]
    # Without the logits (the chunked LM head), QLoRA of a 4B model at 8 x 1,024 tokens fits a 24 GB card.
    assert qlora["fits_by_gpu"] == {"24": True, "48": True, "80": True}
    assert full["fits_by_gpu"] == {size: full["memory_gb"]["ddp"] <= int(size) for size in ("24", "48", "80")}


def test_nested_quantisation_shrinks_the_constants(gemma_peft, capsys):
    plain = plan_json(capsys, gemma_peft(use_peft=True, load_in_4bit=True))
    nested = plan_json(capsys, gemma_peft(use_peft=True, load_in_4bit=True, use_bnb_nested_quant=True))
    saved = plain["memory_breakdown_gb"]["ddp"]["weights"] - nested["memory_breakdown_gb"]["ddp"]["weights"]
    # From 0.5 to 0.127 bits per quantised parameter.
    assert saved == pytest.approx(GEMMA_LINEAR * (0.5 - 0.127) / 8 / GIB, abs=0.02)


def test_8bit_optimizer_lowers_the_optimizer_term(gemma_peft, capsys):
    adamw = plan_json(capsys, gemma_peft(use_peft=True, load_in_4bit=True))
    eight_bit = plan_json(capsys, gemma_peft(use_peft=True, load_in_4bit=True, optim="paged_adamw_8bit"))
    adapters = gemma_lora_adapters(128)
    assert eight_bit["memory_breakdown_gb"]["ddp"]["optimizer"] == round(6 * adapters / GIB, 2)
    assert eight_bit["memory_breakdown_gb"]["ddp"]["optimizer"] < adamw["memory_breakdown_gb"]["ddp"]["optimizer"]
    assert eight_bit["memory_gb"]["ddp"] < adamw["memory_gb"]["ddp"]


def test_lora_lies_between_qlora_and_full(gemma_peft, capsys):
    qlora = plan_json(capsys, gemma_peft(use_peft=True, load_in_4bit=True))
    lora = plan_json(capsys, gemma_peft(use_peft=True))
    full = plan_json(capsys, gemma_peft())
    assert lora["method"] == "lora"
    assert lora["adapter_parameters"] == qlora["adapter_parameters"]
    assert lora["memory_breakdown_gb"]["ddp"]["weights"] == round(
        (2 * GEMMA_PARAMETERS + 2 * qlora["adapter_parameters"]) / GIB, 2
    )
    for strategy in ("ddp", "zero2", "zero3"):
        assert qlora["memory_gb"][strategy] < lora["memory_gb"][strategy] < full["memory_gb"][strategy]


def test_zero3_shards_the_frozen_base(gemma_peft, capsys):
    result = plan_json(capsys, gemma_peft(use_peft=True), "--num-gpus", "8")
    breakdown = result["memory_breakdown_gb"]
    assert breakdown["zero2"]["weights"] == breakdown["ddp"]["weights"]
    assert breakdown["zero3"]["weights"] == pytest.approx(breakdown["ddp"]["weights"] / 8, abs=0.01)
    assert breakdown["zero2"]["optimizer"] == pytest.approx(breakdown["ddp"]["optimizer"] / 8, abs=0.01)


def test_lora_target_modules(gemma_peft, capsys):
    default = plan_json(capsys, gemma_peft(use_peft=True))
    all_linear = plan_json(capsys, gemma_peft(use_peft=True, lora_target_modules="all-linear"))
    # Every linear layer of Gemma's decoder is one of the seven projections.
    assert all_linear["adapter_parameters"] == default["adapter_parameters"]
    q_v = plan_json(capsys, gemma_peft(use_peft=True, lora_r=16, lora_target_modules=["q_proj", "v_proj"]))
    assert q_v["adapter_parameters"] == gemma_lora_adapters(16, ("q", "v"))


def test_lora_target_modules_matching_nothing(gemma_peft, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["plan", gemma_peft(use_peft=True, lora_target_modules=["c_attn"])])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert "lora_target_modules" in err and "q_proj" in err


def test_4bit_without_peft_is_refused(gemma_peft, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["plan", gemma_peft(load_in_4bit=True)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert "use_peft" in err


def test_gradient_checkpointing_counts_as_activation_checkpointing(gemma_peft, capsys):
    on = plan_json(capsys, gemma_peft(activation_checkpointing=None, gradient_checkpointing=True))
    off = plan_json(capsys, gemma_peft(activation_checkpointing=False))
    assert on["activation_checkpointing"] is True
    assert on["memory_breakdown_gb"]["ddp"]["activations"] < off["memory_breakdown_gb"]["ddp"]["activations"]


def test_plan_text_names_the_method(gemma_peft, capsys):
    cli.main(["plan", gemma_peft(use_peft=True, load_in_4bit=True)])
    lines = capsys.readouterr().out.splitlines()
    method = next(line for line in lines if line.startswith("method"))
    assert "qlora" in method and "238,419,968 adapter parameters" in method and "4-bit" in method
    assert next(line for line in lines if line.startswith("ddp fits on")).endswith("24 GB yes, 48 GB yes, 80 GB yes")
    cli.main(["plan", gemma_peft()])
    assert "full fine-tuning" in next(
        line for line in capsys.readouterr().out.splitlines() if line.startswith("method")
    )


def test_flops_per_token_is_6n_plus_the_attention_term():
    # 1B-ish: 1e9 parameters of which 0.1e9 an untied input embedding, 16 layers of width 2048.
    shape = ModelShape(int(1e9), 2048, 8192, 16, 50000, embedding_parameters=int(1e8), attention_width=2048)
    assert flops_per_token(shape, 4096) == 6 * 9e8 + 12 * 16 * 2048 * 4096
    assert flops_per_token(shape, 4096, trains_base=False) == 4 * 9e8 + 12 * 16 * 2048 * 4096


def test_gemma3_shape_counts_attention_width_and_tied_embedding():
    from medrecipes.models.scratch import packaged_config

    shape = model_shape(packaged_config("google--gemma-3-4b-pt"))
    assert shape.attention_width == 8 * 256  # 8 heads of 256, narrower than the 2,560 hidden size
    assert shape.embedding_parameters == 0  # tied: the output layer multiplies with it


@pytest.mark.parametrize(
    "name, gpu",
    [
        ("NVIDIA H100 80GB HBM3", "h100-80gb"),
        ("NVIDIA H200", "h200-141gb"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
        ("NVIDIA A100 80GB PCIe", "a100-80gb"),
        ("NVIDIA GeForce GTX 1080", None),
    ],
)
def test_device_names_find_their_peak(name, gpu):
    assert gpu_type(name) == gpu
    if gpu:
        assert GPUS[gpu][1] >= 312


def _answer(argv: list[str], capsys) -> tuple[list[str], str]:
    """A command's `error:` lines and its output, run in this process."""
    try:
        cli.main(argv)
    except SystemExit:
        pass
    captured = capsys.readouterr()
    return [line for line in captured.err.splitlines() if line.startswith("error:")], captured.out


@pytest.mark.parametrize("recipe", ["recipes/tiny_grpo.yaml", "recipes/tiny_cpt.yaml", "recipes/tiny_pretrain.yaml"])
def test_launch_plan_refuses_exactly_the_gpu_counts_that_plan_refuses(recipe, capsys):
    """One derivation for a number of processes: where plan refuses a count, so does launch-plan,
    with the same line; where plan takes it, launch-plan gives its processes."""
    refused = 0
    for gpus in (1, 2, 3, 4, 5, 6, 8):
        plan_error, _ = _answer(["plan", recipe, "--num-gpus", str(gpus), "--architecture", "tiny"], capsys)
        launch_error, out = _answer(["launch-plan", recipe, "--nodes", "1", "--gpus-per-node", str(gpus)], capsys)
        assert plan_error == launch_error, (recipe, gpus)
        assert plan_error or f"NUM_PROCESSES={gpus}" in out
        refused += bool(plan_error)
    assert refused or recipe != "recipes/tiny_grpo.yaml"  # 16 completions do not divide into 3, 5 or 6 processes


def test_launch_plan_takes_the_accelerate_configs_processes_a_node(tmp_path, capsys):
    """An accelerate config of 4 processes on a machine: 4 a node unless --gpus-per-node says
    otherwise, which is said (the launch passes NUM_PROCESSES, replacing the config's)."""

    config = yaml.safe_load((ROOT / "accelerate_configs" / "ddp.yaml").read_text()) | {"num_processes": 4}
    (tmp_path / "four.yaml").write_text(yaml.safe_dump(config))
    plan = ["launch-plan", "recipes/tiny_cpt.yaml", "--nodes", "2", "--accelerate-config", str(tmp_path / "four.yaml")]
    errors, out = _answer(plan, capsys)
    assert not errors and "NUM_PROCESSES=8" in out  # 2 nodes of 4
    cli.main([*plan, "--gpus-per-node", "2"])
    captured = capsys.readouterr()
    assert "NUM_PROCESSES=4" in captured.out
    assert "starts 4 processes a machine, and --gpus-per-node 2 replaces it" in captured.err


def test_a_recipe_that_leaves_checkpointing_unset_gets_the_plans_choice(gemma_peft, capsys, caplog):
    from medrecipes.config import parse_recipe
    from medrecipes.plan.summary import settle_checkpointing

    # LoRA on Gemma 3 4B, 8 rows of 1,024 a device: about 14 GiB without checkpointing (the plan's
    # figure), 6 with it.
    path = gemma_peft(use_peft=True, activation_checkpointing=None)
    roomy, tight = (plan_json(capsys, path, "--method", "sft", "--gpu", gpu) for gpu in ("h100-80gb", "a10g-24gb"))
    assert roomy["activation_checkpointing_by"] == tight["activation_checkpointing_by"] == "plan"
    assert roomy["activation_checkpointing"] is False and tight["activation_checkpointing"] is True
    assert roomy["memory_gb"]["ddp"] > tight["memory_gb"]["ddp"]
    assert "the plan's choice" in (cli.main(["plan", path, "--method", "sft"]), capsys.readouterr().out)[1]
    # The run decides the same way for its device, before the model loads, under both names TRL reads.
    for capacity, expected in ((80, False), (24, True)):
        recipe, args, model_args = parse_recipe("sft", [path])
        assert args.checkpointing_by_plan and args.activation_checkpointing is True  # until the plan decides
        with caplog.at_level("INFO", logger="medrecipes.plan.summary"):  # whatever an earlier test set above it
            settle_checkpointing(recipe, args, model_args, capacity_gib=capacity)
        assert args.activation_checkpointing is args.gradient_checkpointing is expected
        assert f"activation checkpointing {'on' if expected else 'off'}: the memory plan" in caplog.text
    # Written in the recipe, either way: as written, and the plan says whose choice it is.
    for written in (True, False):
        chosen = gemma_peft(use_peft=True, activation_checkpointing=written)
        assert (
            plan_json(capsys, chosen, "--method", "sft", "--gpu", "a10g-24gb")["activation_checkpointing"] is written
        )
        recipe, args, model_args = parse_recipe("sft", [chosen])
        settle_checkpointing(recipe, args, model_args, capacity_gib=24 if not written else 80)
        assert args.activation_checkpointing is written and not args.checkpointing_by_plan
    # A CPU run: the memory the machine has available is the capacity.
    import psutil

    path = gemma_peft(use_peft=True, activation_checkpointing=None)  # the fixture writes one file
    for available, expected in ((80, False), (8, True)):
        recipe, args, model_args = parse_recipe("sft", [path, "--use_cpu", "true"])
        memory = psutil.virtual_memory()._replace(available=available * 2**30)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(psutil, "virtual_memory", lambda memory=memory: memory)
            settle_checkpointing(recipe, args, model_args)
        assert args.activation_checkpointing is args.gradient_checkpointing is expected


def test_a_plan_of_gpus_for_a_cpu_recipe_says_it_trains_on_cpus(capsys):
    # --architecture: the recipe's starting model is the demo's output, absent in a fresh clone
    cli.main(["plan", "recipes/tiny_sft.yaml", "--num-gpus", "4", "--architecture", "tiny"])
    out, err = capsys.readouterr()
    assert "devices           4 x h100-80gb" in out
    assert "warning: recipes/tiny_sft.yaml has use_cpu: true, so it trains on CPUs, not on the 4 x h100-80gb" in err
    cli.main(["plan", "recipes/tiny_sft.yaml", "--use_cpu", "false", "--architecture", "tiny"])
    assert "warning" not in capsys.readouterr().err


def test_a_plan_whose_warm_up_takes_every_planned_step_says_so(gemma_cpt, capsys):
    # 4312 sequences of 64 a step: 68 steps an epoch; a warm-up of 100 steps is the whole run.
    argv = ["plan", gemma_cpt, "--num-gpus", "8", "--dataset-sequences", "4312", "--num_train_epochs", "1"]
    cli.main([*argv, "--warmup_steps", "100"])
    assert "warmup_steps 100 is a warm-up of 100 steps, the whole run (68 steps)" in capsys.readouterr().err
    cli.main([*argv, "--warmup_steps", "10"])
    assert "warm-up" not in capsys.readouterr().err
