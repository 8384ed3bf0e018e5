"""The HF Trainer and TRL's trainers as the recipes use them: training, saving and teardown,
and mixins for what the recipes log (perplexity, MCQ accuracy, GRPO's per-set metrics) and
for a learning rate of its own for the embeddings."""

import logging
import math
import os

from transformers import Trainer
from transformers.trainer_utils import get_last_checkpoint

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
    """Evaluate every eval set once more, record the metrics beside the training ones, and log
    the multiple-choice report (accuracy by subject) of each set that has one."""
    from medrecipes.evaluation import format_report

    metrics = trainer.evaluate()
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)
    for name, report in getattr(trainer, "mcq_reports", {}).items():
        logger.info(format_report(name, report))
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


class GRPOEvalMetricsMixin:
    """Reports GRPO's evaluation metrics (reward per function, KL, completion length, ...) under
    the eval set's prefix, `eval_<set>_reward`, and returns them from `evaluate`.

    GRPOTrainer keeps them in `_metrics["eval"]` and adds them as `eval_<metric>` in `log`, so
    with several eval sets they would mix in one series and miss from evaluate()'s result.
    """

    def evaluation_loop(
        self, dataloader, description, prediction_loss_only=None, ignore_keys=None, metric_key_prefix="eval"
    ):
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)
        for key, values in self._metrics["eval"].items():
            finite = [v for v in values if not math.isnan(v)]
            if finite:
                output.metrics[f"{metric_key_prefix}_{key}"] = sum(finite) / len(finite)
        self._metrics["eval"].clear()
        return output


class EmbeddingLearningRateMixin:
    """Trains the input embeddings, and an output layer tied to them, at `args.embedding_learning_rate`.

    The trainer's own optimizer is built first, so that weight-decay groups and optimizer
    choices stay the trainer's; the embedding parameters then move into groups of their own
    with the other learning rate. The schedule scales every group alike.
    """

    def create_optimizer(self, model=None):
        optimizer = super().create_optimizer(model)
        learning_rate = getattr(self.args, "embedding_learning_rate", None)
        if learning_rate is None:
            return optimizer
        model = self.model if model is None else model
        embedding = {id(p) for p in model.get_input_embeddings().parameters() if p.requires_grad}
        moved = []
        for group in optimizer.param_groups:
            params = [p for p in group["params"] if id(p) in embedding]
            if params:
                group["params"] = [p for p in group["params"] if id(p) not in embedding]
                moved.append({**group, "params": params, "lr": learning_rate})
        if not moved:
            logger.warning("embedding_learning_rate is set but the embeddings are not trained; it has no effect")
            return optimizer
        optimizer.param_groups[:] = [g for g in optimizer.param_groups if g["params"]]
        for group in moved:
            optimizer.add_param_group(group)
        count = sum(getattr(p, "ds_numel", p.numel()) for g in moved for p in g["params"])
        logger.info("embeddings (%s parameters) train at learning rate %s", f"{count:,}", learning_rate)
        return optimizer


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
