"""recipes/cpt.py end to end, as a user runs it: one process, scratch, DDP and ZeRO on CPU (resume:
test_long_runs.py)."""

import json
import math
import re
from functools import partial
from pathlib import Path

import pytest
from conftest import AVX512_BF16_CPU, BNB_LINE, LAUNCH, NO_EVAL, PYTHON, ROOT, log_history, run, run_recipe
from transformers import AutoConfig, AutoModelForCausalLM

TINY = "recipes/tiny_cpt.yaml"


cpt = partial(run_recipe, "recipes/cpt.py")


def train_losses(output_dir) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in log_history(output_dir) if "loss" in e}


@pytest.fixture(scope="module")
def tiny_run(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("cpt")
    cpt(
        TINY,
        "--model_name_or_path",
        tiny_model,
        "--output_dir",
        out,
        "--max_steps",
        "12",
        "--eval_steps",
        "4",
        "--save_steps",
        "4",
        "--logging_steps",
        "2",
        "--eval_tasks",
        "usmle",
        "--eval_tasks_limit",
        "8",
    )
    return out


def test_each_eval_set_reports_loss_and_perplexity(tiny_run):
    evals = [e for e in log_history(tiny_run) if "eval_medical_text_loss" in e]
    assert [e["step"] for e in evals] == [0, 4, 8, 12]  # eval_on_start, then every 4 steps
    for name in ("medical_text", "usmle"):
        entries = [e for e in log_history(tiny_run) if f"eval_{name}_loss" in e]
        assert len(entries) == 4
        for entry in entries:
            assert entry[f"eval_{name}_perplexity"] == pytest.approx(math.exp(entry[f"eval_{name}_loss"]), rel=1e-6)
    assert evals[-1]["eval_medical_text_loss"] < evals[0]["eval_medical_text_loss"] - 0.3


def test_eval_tasks_log_their_accuracy_at_each_evaluation(tiny_run):
    scores = [e for e in log_history(tiny_run) if "eval_usmle_acc" in e]
    assert [e["step"] for e in scores] == [0, 4, 8, 12]  # eval_on_start, then every 4 steps
    assert all(e["eval_usmle_acc"] in {k / 8 for k in range(9)} and "eval_usmle_acc_norm" in e for e in scores)
    assert "eval_usmle_acc" in json.loads((Path(tiny_run) / "eval_results.json").read_text())
    report = json.loads((Path(tiny_run) / "eval_tasks" / "step-4.json").read_text())["tasks"]["usmle"]
    assert report["n"] == 8 and report["accuracy"] == scores[1]["eval_usmle_acc"]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(next(Path(tiny_run).glob("runs/*")))).Reload()
    # ... and once more after training (which trainer_state.json predates) where the best
    # checkpoint loaded at the end is not the last step's, whose evaluation is recorded as it was
    state = json.loads((Path(tiny_run) / "trainer_state.json").read_text())
    again = [12] if state["best_global_step"] != 12 else []
    assert [e.step for e in events.Scalars("eval/usmle_acc")] == [0, 4, 8, 12, *again]
    final = json.loads((Path(tiny_run) / "eval_results.json").read_text())
    if not again:
        assert final["eval_usmle_acc"] == scores[-1]["eval_usmle_acc"]


def fake_trainer(log_history, best_step=None, sets=("text", "usmle")):
    """What `evaluated_at_last_step` reads of a trainer: a run of 12 steps, its best checkpoint
    (loaded at the end) at `best_step`, and its eval sets."""
    from types import SimpleNamespace

    best = f"out/checkpoint-{best_step}" if best_step else None
    state = SimpleNamespace(
        global_step=12, log_history=log_history, best_model_checkpoint=best, best_global_step=best_step
    )
    args = SimpleNamespace(load_best_model_at_end=best_step is not None)
    return SimpleNamespace(state=state, args=args, eval_dataset=dict.fromkeys(sets) if sets else object())


def evaluation(step, name=None, loss=1.0):
    prefix = f"eval_{name}_" if name else "eval_"
    return {f"{prefix}loss": loss, f"{prefix}runtime": 0.1, "epoch": 1.0, "step": step}


def test_the_final_evaluation_records_the_last_steps_instead_of_repeating_it():
    from medrecipes.training.run import evaluated_at_last_step

    last = [evaluation(12, "text", 2.0), evaluation(12, "usmle", 3.0), {"eval_usmle_acc": 0.5, "step": 12}]
    logs = [evaluation(8, "text"), evaluation(8, "usmle"), {"loss": 4.0, "step": 12}, *last]
    recorded = {"eval_text_loss": 2.0, "eval_text_runtime": 0.1, "eval_usmle_loss": 3.0, "eval_usmle_runtime": 0.1}
    assert evaluated_at_last_step(fake_trainer(logs)) == {**recorded, "eval_usmle_acc": 0.5, "epoch": 1.0}
    assert evaluated_at_last_step(fake_trainer(logs, best_step=12)) is not None  # the best is the last
    assert evaluated_at_last_step(fake_trainer(logs, best_step=8)) is None  # an earlier best is evaluated again
    assert evaluated_at_last_step(fake_trainer(logs[:-2])) is None  # a set not evaluated at the last step
    assert evaluated_at_last_step(fake_trainer(logs[:3])) is None  # no evaluation at the last step
    one_set = [evaluation(12, loss=2.0)]
    assert evaluated_at_last_step(fake_trainer(one_set, sets=None)) == {
        "eval_loss": 2.0,
        "eval_runtime": 0.1,
        "epoch": 1.0,
    }


def test_the_report_of_a_real_run(tiny_run, tmp_path):
    """`medrecipes report` on what the recipe wrote: loss against tokens seen, the eval task's
    accuracy with its interval, by subject at the best and last evaluation, the calibration of
    the last evaluation, throughput; and the run's record (script, resolved recipe, data mixture)."""
    from medrecipes.report import read_inputs, write_report

    (run,), _ = read_inputs([str(tiny_run)])
    assert run.record["script"] == "recipes/cpt.py" and run.record["recipe"]["max_steps"] == 12
    assert sorted(run.reports) == [0, 4, 8, 12] and run.best_step in (4, 8, 12)
    images = write_report([str(tiny_run)], str(tmp_path / "report.html"))
    assert sorted(images) == ["accuracy", "calibration", "comparison", "loss", "subjects", "throughput"]
    page = (tmp_path / "report.html").read_text()
    assert "data/usmle_sample/train.jsonl" in page and "recipes/cpt.py" in page


def test_keeps_best_checkpoints_plus_last(tiny_run):
    scores = {e["step"]: e["eval_medical_text_loss"] for e in log_history(tiny_run) if "eval_medical_text_loss" in e}
    best_two = sorted((s for s in (4, 8, 12)), key=scores.get)[:2]
    kept = sorted(int(p.name.split("-")[1]) for p in Path(tiny_run).glob("checkpoint-*"))
    assert kept == sorted(set(best_two) | {12})


def test_final_model_loads_with_its_tokenizer(tiny_run):
    final = Path(tiny_run) / "final"
    model = AutoModelForCausalLM.from_pretrained(final)
    assert model.config.num_hidden_layers == 2
    assert (final / "tokenizer.json").is_file() and (final / "chat_template.jinja").is_file()


@pytest.mark.long
def test_pretraining_from_scratch_uses_the_preset_and_token_budget(tiny_model, tmp_path):
    result = cpt(
        "recipes/tiny_pretrain.yaml",
        "--tokenizer_name_or_path",
        tiny_model,
        "--output_dir",
        tmp_path,
        "--total_tokens",
        "2048",
    )
    assert "derived from the recipe: max_steps = 4" in result.stdout
    assert "derived from the recipe: gradient_accumulation_steps = 2" in result.stdout
    config = AutoConfig.from_pretrained(tmp_path / "final")
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size) == (12, 512, 2560)
    assert max(train_losses(tmp_path)) > 0


@pytest.mark.parametrize(
    "config", ["ddp", *(pytest.param(c, marks=pytest.mark.long) for c in ("zero2", "zero3", "zero3_offload", "fsdp"))]
)  # make test: DDP; make test-long: the sharded ones (offload compiles DeepSpeed's CPU Adam on first use)
def test_two_processes_with_each_accelerate_config_as_shipped(tiny_model, tmp_path, config):
    # 2 CPU processes over gloo (the files say 8 GPUs; --cpu would silently start only one). The
    # configs' mixed_precision (bf16) is not overridden: the recipe, which leaves bf16 to the
    # machine, follows the launcher.
    launcher = ("--config_file", f"accelerate_configs/{config}.yaml")
    result = cpt(
        TINY,
        "--model_name_or_path",
        tiny_model,
        "--output_dir",
        tmp_path,
        "--global_batch_tokens",
        "2048",
        "--total_tokens",
        "6144",
        "--eval_steps",
        "3",
        "--save_steps",
        "3",
        "--logging_steps",
        "1",
        "--eval_tasks",
        "usmle",
        "--eval_tasks_limit",
        "4",
        launcher=(*LAUNCH, *launcher, "--num_processes", "2"),
    )
    # 8 sequences x 128 tokens x 2 processes fill the 2048-token step without accumulation.
    assert "derived from the recipe: gradient_accumulation_steps = 1" in result.stdout
    losses = train_losses(tmp_path)
    assert sorted(losses) == [1, 2, 3] and all(math.isfinite(v) and v > 0 for v in losses.values())
    # Every process scores the questions with the sharded model; the log has one value per evaluation.
    assert [e["step"] for e in log_history(tmp_path) if "eval_usmle_acc" in e] == [0, 3]
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "final").num_parameters() > 0
    # A dense model uses every parameter each step: DDP is not asked to look for unused ones, and
    # torch says nothing about the search (models.loading.settle_unused_parameters).
    assert "find_unused_parameters" not in result.stderr
    # The precision the launch chose, where this CPU would choose another: said once, not once a process.
    assert result.stderr.count("bf16 is true because ACCELERATE_MIXED_PRECISION is bf16") == 1


def test_bad_recipe_is_one_line_and_exit_2(tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text((ROOT / TINY).read_text().replace("learning_rate:", "learning_rat:"))
    result = run(PYTHON, "recipes/cpt.py", recipe, env=AVX512_BF16_CPU)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and re.search(r"unknown key 'learning_rat' \(did you mean 'learning_rate'", errors[0])
    assert "Traceback" not in result.stderr
    assert BNB_LINE not in result.stderr  # bitsandbytes is imported (by peft), its known-harmless line dropped


@pytest.mark.parametrize(
    "launcher",
    [
        pytest.param(c, marks=pytest.mark.long)
        for c in (("--multi_gpu",), ("--config_file", "accelerate_configs/zero3.yaml"))
    ],
    ids=["ddp", "zero3"],
)
def test_bad_recipe_under_a_launcher_is_one_line_from_the_first_rank(tmp_path, launcher):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text((ROOT / TINY).read_text().replace("learning_rate:", "learning_rat:"))
    launch = (*LAUNCH, *launcher, "--num_processes", "2")
    result = run(*launch, "recipes/cpt.py", recipe, env=AVX512_BF16_CPU, timeout=300)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "unknown key 'learning_rat'" in errors[0], result.stderr[-3000:]
    # Each rank exits 2 without a traceback of its own; what follows is the launcher's report of it.
    assert "exitcode  : 2" in result.stderr and result.returncode != 0
    frames = [line for line in result.stderr.splitlines() if line.strip().startswith('File "')]
    assert not [f for f in frames if f'"{ROOT / "recipes"}' in f or f'"{ROOT / "src"}' in f]
    assert "UserError" not in result.stderr
    assert BNB_LINE not in result.stdout + result.stderr


@pytest.mark.skipif(
    not (ROOT / ".venv" / ".install-stamp").exists(), reason="needs the environment `make install` builds"
)
def test_make_validates_a_recipe_before_the_launcher_starts(tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text((ROOT / TINY).read_text().replace("learning_rate:", "learning_rat:"))
    result = run("make", "--no-print-directory", "cpt", "CONFIG=accelerate_configs/ddp.yaml", f"RECIPE={recipe}")
    assert result.returncode == 2  # the launcher, had it started, would have exited 1
    ours = [line for line in result.stderr.splitlines() if not re.match(r"make(\[\d+\])?:", line)]
    assert ours == [f"error: {recipe}: unknown key 'learning_rat' (did you mean 'learning_rate'?)"]


@pytest.mark.long  # two runs and a refused resume
def test_resuming_a_checkpoint_of_another_model_is_one_line_before_training(tiny_run, tmp_path):
    from medrecipes.models.tiny import build_tiny_model

    wider = build_tiny_model(str(tmp_path / "wider"), [str(ROOT / "data/medical_text/train.jsonl")], hidden_size=96)
    checkpoint = Path(tiny_run) / "checkpoint-12"
    command = [PYTHON, "recipes/cpt.py", TINY, "--model_name_or_path", wider, "--output_dir", tmp_path / "out",
               "--resume_from_checkpoint", checkpoint, *NO_EVAL]  # fmt: skip
    result = run(*command)  # another run's checkpoint (its run.json names another model): refused as such first
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(f"error: resume_from_checkpoint: {checkpoint} is another run's (model ")
    )
    result = run(*command, "--resume_from_another_run", "true")  # on purpose: then its shapes must fit
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: resume_from_checkpoint: {checkpoint} does not fit this run's model "
        "(hidden_size 64, here 96; intermediate_size 128, here 192; head_dim 16, here 24); name a checkpoint of this model"
    )
    assert not (tmp_path / "out" / "checkpoint-1").exists()
