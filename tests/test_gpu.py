"""The recipes on a GPU, run as a user runs them: CPT and GRPO train with the GPU's defaults (bf16,
TF32, fused AdamW, the chunked LM head's Triton kernel, Liger's kernels where installed) and log
MFU, and Liger's kernels leave CPT's losses as they were. SFT's learning on a GPU and the kernels'
maths are the `gpu` cases of test_sft_recipe.py and test_fast_defaults.py. Marked `gpu`: skipped
without CUDA (conftest); `bash benchmarks/gpu_session.sh tests` runs them on a GPU machine."""

import importlib.util
import math
from functools import partial
from pathlib import Path

import pytest
import torch
from conftest import NO_EVAL, log_history, run_recipe

from medrecipes.training.mixins import fused_lm_head_on

pytestmark = pytest.mark.gpu

ON_GPU = ("--use_cpu", "false", "--report_to", "none")
LIGER = importlib.util.find_spec("liger_kernel") is not None
CPT = "recipes/tiny_cpt.yaml"

cpt = partial(run_recipe, "recipes/cpt.py")
grpo = partial(run_recipe, "recipes/grpo.py")


def run_arguments(output_dir):
    """The training arguments the run resolved, as the trainer saved them with the final model."""
    return torch.load(Path(output_dir) / "final" / "training_args.bin", weights_only=False)


def training_logs(output_dir) -> list[dict]:
    return [e for e in log_history(output_dir) if "loss" in e and "learning_rate" in e]


def test_cpt_trains_with_the_gpu_defaults(tiny_model, tmp_path):
    cpt(
        *(CPT, "--model_name_or_path", tiny_model, "--output_dir", tmp_path, *ON_GPU),
        *("--max_steps", "12", "--eval_steps", "6", "--save_steps", "6", "--logging_steps", "2"),
        *("--eval_tasks", "usmle", "--eval_tasks_limit", "8"),
    )
    args = run_arguments(tmp_path)
    assert args.bf16 and args.tf32 and fused_lm_head_on(args) and args.optim == "adamw_torch_fused"
    assert args.use_liger_kernel == LIGER
    logs = training_logs(tmp_path)
    assert logs and all(math.isfinite(e["loss"]) and 0 < e["mfu"] < 1 for e in logs)
    evals = [e for e in log_history(tmp_path) if "eval_medical_text_loss" in e]
    assert evals[-1]["eval_medical_text_loss"] < evals[0]["eval_medical_text_loss"] - 0.3
    assert all(0 <= e["eval_usmle_acc"] <= 1 for e in log_history(tmp_path) if "eval_usmle_acc" in e)


@pytest.mark.skipif(not LIGER, reason="liger-kernel is not installed")
def test_liger_kernels_leave_the_losses(tiny_model, tmp_path):
    """Five steps with and without Liger (in separate processes: Liger patches model classes for
    the process): the first loss is the same model on the same batch, the next ones drift only by
    bf16 rounding."""
    losses = {}
    for liger in ("true", "false"):
        out = tmp_path / liger
        cpt(
            *(CPT, "--model_name_or_path", tiny_model, "--output_dir", out, *ON_GPU, *NO_EVAL),
            *("--max_steps", "5", "--logging_steps", "1", "--use_liger_kernel", liger),
        )
        assert run_arguments(out).use_liger_kernel == (liger == "true")
        losses[liger] = [e["loss"] for e in training_logs(out)]
    assert len(losses["true"]) == 5
    assert losses["true"][0] == pytest.approx(losses["false"][0], rel=1e-2)
    assert losses["true"] == pytest.approx(losses["false"], rel=3e-2)


def test_grpo_trains_with_a_reference_model(chat_model, tmp_path):
    """Generation, the rewards, the reference model's log-probabilities (beta > 0) and the
    evaluation, all on the GPU."""
    grpo(
        *("recipes/tiny_grpo.yaml", "--model_name_or_path", chat_model, "--output_dir", tmp_path, *ON_GPU),
        *("--beta", "0.04", "--max_steps", "2", "--eval_steps", "2", "--eval_on_start", "false"),
    )
    assert run_arguments(tmp_path).bf16
    logs = training_logs(tmp_path)
    assert len(logs) == 2 and all(math.isfinite(e["loss"]) and e["kl"] >= 0 and "reward" in e for e in logs)
    evaluation = [e for e in log_history(tmp_path) if "eval_usmle_test_acc" in e]
    assert evaluation and 0 <= evaluation[-1]["eval_usmle_test_acc"] <= 1
