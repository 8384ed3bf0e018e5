"""The HF Trainer as the recipes use it: perplexity logged beside every evaluation loss."""

import logging
import math
import os

from transformers import Trainer
from transformers.trainer_utils import get_last_checkpoint

from medrecipes.data.stream import StreamTrainerMixin

logger = logging.getLogger(__name__)


def last_checkpoint(output_dir: str) -> str | None:
    """The newest checkpoint in `output_dir`, from which a run resumes automatically."""
    checkpoint = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
    if checkpoint is not None:
        logger.info("resuming from %s", checkpoint)
    return checkpoint


def train_and_save(trainer, checkpoint: str | None) -> str:
    """Train (resuming from `checkpoint`), record the metrics and state, and save the model
    and its tokenizer to output_dir/final; returns that folder."""
    result = trainer.train(resume_from_checkpoint=checkpoint)
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()
    final_dir = os.path.join(trainer.args.output_dir, "final")
    trainer.save_model(final_dir)
    if trainer.is_world_process_zero():
        trainer.processing_class.save_pretrained(final_dir)
        logger.info("final model saved to %s", final_dir)
    return final_dir


def end_run(trainer) -> None:
    """Tear the process group down while the interpreter is still whole.

    Left to interpreter shutdown, gloo's worker threads (DeepSpeed and DDP on CPU) can still
    hold tensors; freeing them then aborts the process now and then with "terminate called
    without an active exception", and the launcher reports the whole run as failed.
    """
    trainer.accelerator.end_training()


def evaluate_and_record(trainer) -> dict:
    """Evaluate every eval set once more and record the metrics beside the training ones."""
    metrics = trainer.evaluate()
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)
    return metrics


class PerplexityMixin:
    """Adds `eval_<set>_perplexity` = exp(`eval_<set>_loss`) to the logs of every evaluation.

    Done in `log` rather than a callback because callbacks see the logs only after they have
    been recorded in the trainer state and written to TensorBoard.
    """

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        for key in [k for k in logs if k.startswith("eval") and k.endswith("_loss")]:
            logs[key.removesuffix("loss") + "perplexity"] = math.exp(min(logs[key], 80.0))
        super().log(logs, start_time)


class MCQAccuracyMixin:
    """Adds `eval_<set>_acc` for every eval set that has multiple-choice rows in `mcq_sets`.

    Computed in `evaluation_loop`, beside the loss, so that it is logged with the other
    metrics of the same set. Every process answers every question: the sets are small, and
    under ZeRO-3 generation needs all processes anyway.
    """

    mcq_sets: dict = {}
    mcq_generation: dict = {}
    mcq_reports: dict = {}  # the latest full report of each set, predictions and subjects included

    def evaluation_loop(
        self, dataloader, description, prediction_loss_only=None, ignore_keys=None, metric_key_prefix="eval"
    ):
        from medrecipes.evaluation import evaluate_mcq

        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)
        rows = self.mcq_sets.get(metric_key_prefix.removeprefix("eval_"))
        if rows is not None:
            report = evaluate_mcq(self.model, self.processing_class, rows, **self.mcq_generation)
            self.mcq_reports = {**self.mcq_reports, metric_key_prefix.removeprefix("eval_"): report}
            output.metrics[f"{metric_key_prefix}_acc"] = report["accuracy"]
            output.metrics[f"{metric_key_prefix}_unparseable"] = report["unparseable"]
        return output


class CausalLMTrainer(StreamTrainerMixin, PerplexityMixin, Trainer):
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
