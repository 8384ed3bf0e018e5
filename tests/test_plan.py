"""Tests for `medrecipes plan`: training arithmetic, parameter counts and the memory estimate."""

import json
from pathlib import Path

import pytest
import yaml

from medrecipes import cli
from medrecipes.plan import GIB, ModelShape, memory_per_device


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
