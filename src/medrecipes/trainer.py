"""The HF Trainer as the recipes use it: perplexity logged beside every evaluation loss."""

import math

from transformers import Trainer


class PerplexityMixin:
    """Adds `eval_<set>_perplexity` = exp(`eval_<set>_loss`) to the logs of every evaluation.

    Done in `log` rather than a callback because callbacks see the logs only after they have
    been recorded in the trainer state and written to TensorBoard.
    """

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        for key in [k for k in logs if k.startswith("eval") and k.endswith("_loss")]:
            logs[key.removesuffix("loss") + "perplexity"] = math.exp(min(logs[key], 80.0))
        super().log(logs, start_time)


class CausalLMTrainer(PerplexityMixin, Trainer):
    """HF Trainer for continued pretraining and pretraining from scratch."""


def eval_loss_summary(log_history: list[dict]) -> list[str]:
    """One line per evaluation loss: its first and last logged value, e.g. before and after training."""
    lines = []
    keys = dict.fromkeys(k for entry in log_history for k in entry if k.startswith("eval") and k.endswith("_loss"))
    for key in keys:
        values = [(entry["step"], entry[key]) for entry in log_history if key in entry]
        (first_step, first), (last_step, last) = values[0], values[-1]
        lines.append(f"{key}: {first:.4f} at step {first_step} -> {last:.4f} at step {last_step}")
    return lines
