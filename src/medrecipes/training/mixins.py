"""What the recipes' trainers add to HF's and TRL's through their public methods (each mixin says
which): token counts and gradient norms in the logs, the hooks of the atomic checkpoints,
perplexity beside each eval loss, a learning rate of its own for the embeddings, the fused LM-head
loss, and a streamed mixture's position in every checkpoint. What reaches past a library's public
API lives in `transformers_seams` and `trl_seams`; what can be a callback is one
(`training.callbacks.recipe_callbacks`)."""

import json
import logging
import math
import os
import time
from collections.abc import Mapping

import torch
from transformers import Trainer
from trl import GRPOConfig

from medrecipes.data.stream import STATE_FILE, TokenStream, blocks_per_step, restore_position
from medrecipes.errors import UserError, did_you_mean
from medrecipes.models.loading import check_positions
from medrecipes.runs.resume import resume_point
from medrecipes.training.callbacks import NonFiniteGuard
from medrecipes.training.monitoring import ThroughputMonitor
from medrecipes.training.transformers_seams import TrainerSeams
from medrecipes.training.trl_seams import score_labelled_positions_only

logger = logging.getLogger(__name__)


class PerplexityMixin:
    """Adds `eval_<set>_perplexity` = exp(`eval_<set>_loss`) to the logs of every evaluation.

    Done in `log` rather than a callback because callbacks see the logs only after they have
    been recorded in the trainer state and written to TensorBoard.
    """

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        for key in [k for k in logs if k.startswith("eval") and k.endswith("_loss")]:
            logs[key.removesuffix("loss") + "perplexity"] = math.exp(min(logs[key], 80.0))
        super().log(logs, start_time)


def _rows(dataset) -> int | None:
    """The examples of a map-style dataset; None for a stream, whose length is not known. Rows that
    TRL packed count the examples in them (their `seq_lengths`), not the fewer rows they fill."""
    if dataset is None or not hasattr(dataset, "__len__"):
        return None
    if "seq_lengths" in (getattr(dataset, "column_names", None) or ()):
        import pyarrow.compute as pc

        return int(pc.sum(pc.list_value_length(dataset.data.column("seq_lengths"))).as_py() or 0)
    return len(dataset)


def _check_rows_left(given: int | None, left: int | None, trainer: str, args) -> None:
    """The trainer's own preparation (TRL truncates rows to max_length and drops those with
    nothing left to train on) may leave fewer rows than the recipe gave: say how many it
    dropped, and stop in one line where it dropped them all, not in the sampler's
    "num_samples=0" once training starts."""
    if not given or left is None or left == given:
        return
    length = getattr(args, "max_length", None)
    why = f"truncated to max_length {length}, rows with nothing left to train on dropped" if length else "its filters"
    if left == 0:
        raise UserError(
            f"no training rows are left of {given} once {trainer} prepared them ({why}); raise max_length, "
            "or see the rows as the model gets them with `medrecipes preview`"
        )
    logger.warning("%s dropped %d of %d training rows (%s)", trainer, given - left, given, why)


def _check_packed_tokens_left(dataset, given: int | None, trainer: str, args) -> None:
    """Packed rows keep every example, each cut to max_length: where the cut takes every answer, the
    run would train on no token (loss 0, no gradient) without a word. Stop in one line where the
    rows' labels (or the trained tokens' mask the loss reads) hold none."""
    columns = getattr(dataset, "column_names", None) or ()
    if "seq_lengths" not in columns or not hasattr(dataset, "data"):
        return
    import pyarrow.compute as pc

    read = {"assistant_masks": getattr(args, "assistant_only_loss", False),
            "completion_mask": getattr(args, "completion_only_loss", None) is not False}  # fmt: skip
    if "labels" in columns:
        trained = pc.sum(pc.not_equal(pc.list_flatten(dataset.data.column("labels")), -100)).as_py()
    elif mask := next((c for c in read if c in columns and read[c]), None):
        trained = pc.sum(pc.list_flatten(dataset.data.column(mask))).as_py()
    else:
        return
    if not trained:
        raise UserError(
            f"no token of the {given} training examples is left to train on once {trainer} packed them: each is cut "
            f"to max_length {args.max_length} before its answer; raise max_length, or see the rows as the model gets "
            "them with `medrecipes preview`"
        )


def _check_whole_batch(dataset, args) -> None:
    """With dataloader_drop_last, the DataLoader drops a last batch it cannot fill: with fewer rows
    than one batch of all processes it yields none, and the run saves an untrained model after 0
    steps. GRPO batches its completions (num_generations of each prompt), not its rows: TRL's sampler
    drops a generation batch of fewer prompts than it holds, drop_last or not (a pass_rate filter
    that keeps too few questions)."""
    if not hasattr(dataset, "__len__"):
        return
    if isinstance(args, GRPOConfig):
        prompts = args.generation_batch_size // args.num_generations
        if len(dataset) < prompts:
            raise UserError(
                f"the {len(dataset)} training question{'s' if len(dataset) != 1 else ''} fill no generation batch of "
                f"{prompts} prompts (generation_batch_size {args.generation_batch_size} / num_generations "
                f"{args.num_generations}), so no step would run; give more questions (a wider pass_rate range), or "
                "lower prompts_per_step"
            )
        return
    if not args.dataloader_drop_last:
        return
    batch = args.per_device_train_batch_size * args.world_size
    if len(dataset) < batch:
        raise UserError(
            f"dataloader_drop_last drops every batch: the {len(dataset)} training rows fill no batch of {batch} "
            f"(per_device_train_batch_size {args.per_device_train_batch_size} on {args.world_size} process"
            f"{'es' if args.world_size > 1 else ''}); lower the batch, or set dataloader_drop_last: false"
        )


def _check_best_metric_logged(args, metrics: dict, step: int) -> None:
    """metric_for_best_model among the metrics of an evaluation in training, every eval set's and
    task's together, refused in one line at the first: the trainer looks it up next and raises
    KeyError. The names a recipe evaluates are checked at parse (config.checks.check_best_metric); a
    library's own (TRL's rewards/accuracies, ...) are known only here."""
    wanted = args.metric_for_best_model
    name = f"eval_{wanted.removeprefix('eval_')}" if wanted else None  # as the trainer looks it up
    if name is None or name in metrics:
        return
    logged = sorted(k for k in metrics if k.startswith("eval_") and not k.endswith(("_runtime", "_per_second")))
    raise UserError(
        f"metric_for_best_model '{wanted}' is none of the metrics this run's evaluation logs ({', '.join(logged)})"
        f"{did_you_mean(name, logged)}; set one of them (the run stopped at its evaluation at step {step}, "
        "before saving it)"
    )


class RecipeTrainerMixin(TrainerSeams):
    """What every recipe's trainer does beyond the library's; put it first in the bases
    (`class T(RecipeTrainerMixin, SFTTrainer)`) and pass `callbacks.recipe_callbacks(...)`.

    - Atomic checkpoints (`transformers_seams.TrainerSeams`, which it inherits): a checkpoint is
      written under output_dir/_staging and renamed to checkpoint-<step> once every process has
      written its part, so a process killed while saving leaves nothing that
      `runs.resume.last_checkpoint` would resume from. HF's save_total_limit rotation, which runs
      inside the staging folder and finds one checkpoint there, is run again on output_dir once
      the checkpoint is published. A mixin after this one in the bases that writes more into a
      checkpoint (data position, ...) defines `write_into_checkpoint(folder)`, called with the
      staging folder during the save.
    - Tokens seen, without a sync per step: counted from the input shapes on each process and
      summed over processes at logging and saving steps into `state.num_input_tokens_seen`,
      which checkpoints keep (HF's own count, `include_num_input_tokens_seen`, reads a device
      value at every micro-batch; when a recipe turns it on, it is used instead).
    - The gradient norm of each step goes to `NonFiniteGuard` before the optimizer step; the
      counts, and the time spent evaluating and saving, go to `ThroughputMonitor`, whose
      metrics join each training log before the trainer records it.
    - TRL's fused LM head scores only the labelled positions on a CPU too
      (`score_labelled_positions_only`).
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # The staging folder is in place around the _save_checkpoint and log of the classes after
        # this one, and the token counts are summed before theirs: it must come first.
        if RecipeTrainerMixin in cls.__bases__ and cls.__bases__[0] is not RecipeTrainerMixin:
            raise TypeError(f"{cls.__name__}: put RecipeTrainerMixin first in the base classes")

    def __init__(self, *args, **kwargs):
        model, training_args = kwargs.get("model", args[0] if args else None), kwargs.get("args")
        if not isinstance(model, str) and training_args is not None:  # before the data is tokenized
            check_positions(model, training_args)
        given = _rows(kwargs.get("train_dataset"))
        score_labelled_positions_only()
        super().__init__(*args, **kwargs)
        _check_rows_left(given, _rows(self.train_dataset), type(self).__name__, self.args)
        _check_packed_tokens_left(self.train_dataset, given, type(self).__name__, self.args)
        _check_whole_batch(self.train_dataset, self.args)
        callbacks = self.callback_handler.callbacks
        self.guard = next((cb for cb in callbacks if isinstance(cb, NonFiniteGuard)), None)
        self.monitor = next((cb for cb in callbacks if isinstance(cb, ThroughputMonitor)), None)
        if self.guard is not None and not hasattr(Trainer, "_get_grad_norm"):
            raise RuntimeError("the non-finite guard needs Trainer._get_grad_norm (transformers 5.17 or newer)")
        self._pending_counts = [0, 0]  # tokens and token positions on this process since the last sum
        self._evaluating = False

    def training_step(self, model, inputs, *args, **kwargs):
        ids = inputs.get(getattr(self.model, "main_input_name", "input_ids")) if isinstance(inputs, Mapping) else None
        if isinstance(ids, torch.Tensor):  # shapes are host metadata: no device sync
            self._pending_counts[0] += ids.numel()
            self._pending_counts[1] += ids.numel() * ids.shape[-1]
        return super().training_step(model, inputs, *args, **kwargs)

    def _sum_token_counts(self) -> None:
        counts, self._pending_counts = self._pending_counts, [0, 0]
        if self.args.world_size > 1:  # every process logs and saves at the same steps
            total = torch.tensor(counts, device=self.args.device, dtype=torch.int64)
            counts = self.accelerator.reduce(total, reduction="sum").tolist()
        if self.args.include_num_input_tokens_seen in ("no", False):
            self.state.num_input_tokens_seen += counts[0]
        if self.monitor is not None:
            self.monitor.count(*counts)

    def grad_norm_taken(self, model, grad_norm) -> None:
        """The gradient norm of a step, before the optimizer step (`TrainerSeams._get_grad_norm`)."""
        if self.guard is not None:
            self.guard.inspect(self, model, grad_norm)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        self._sum_token_counts()
        if "loss" in logs and "learning_rate" in logs:  # a training log, not evaluation or the summary
            if self.args.include_num_input_tokens_seen in ("no", False):
                logs["num_input_tokens_seen"] = self.state.num_input_tokens_seen
            if self.monitor is not None:
                logs.update(self.monitor.training_metrics(self.state))
            if self.guard is not None and self.guard.skipped:
                logs["nonfinite_skipped"] = self.guard.skipped
        super().log(logs, start_time)

    def evaluate(self, *args, **kwargs):
        # With several eval sets the trainer's evaluate calls itself once per set: time the outer call.
        outer, self._evaluating = not self._evaluating, True
        started = time.perf_counter()
        try:
            metrics = super().evaluate(*args, **kwargs)
        finally:
            if outer:
                self._evaluating = False
                if self.monitor is not None:
                    self.monitor.pause(time.perf_counter() - started)
        if outer and self.is_in_train:
            _check_best_metric_logged(self.args, metrics, self.state.global_step)
        return metrics

    def create_model_card(self, *args, **kwargs) -> None:
        """One model card per run, ours: `hub.card.write_card` when the run pushes, `medrecipes card`
        after. TRL's trainers write their generic card to output_dir/README.md at every
        checkpoint, beside it and saying none of what ours does (data, evaluations, recipe)."""
        return None

    def checkpoint_starts(self) -> None:
        """Before a checkpoint is saved (`TrainerSeams._save_checkpoint`): the saved state must hold
        the tokens seen up to this step."""
        self._sum_token_counts()

    def checkpoint_saved(self, seconds: float) -> None:
        """After a checkpoint is in place: the time it took is not training time."""
        if self.monitor is not None:
            self.monitor.pause(seconds)


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


def fused_lm_head_on(args) -> bool:
    """`fused_lm_head` as the run takes it: as written, or (None) on where a GPU trains."""
    fused = getattr(args, "fused_lm_head", False)
    return args.device.type == "cuda" if fused is None else bool(fused)


class FusedLMHeadMixin:
    """Computes the causal-LM loss through TRL's chunked LM head when `fused_lm_head_on`.

    The head projects the hidden states onto the vocabulary in tiles and keeps only each
    token's log-probability, so the (batch, length, vocabulary) logits and their fp32 copy are
    never held; the loss is the same mean over the labelled tokens. TRL's SFT and GRPO trainers
    use the same head; it gathers a ZeRO-3-sharded output layer and handles FSDP2, which
    Liger's fused cross-entropy does not. Other forwards (generation, MCQ scoring) are the
    model's own.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fused_lm_head = fused_lm_head_on(self.args)
        if self.fused_lm_head:
            from trl.trainer.utils import add_fused_lm_head

            add_fused_lm_head(self.model)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.fused_lm_head and "labels" in inputs:
            inputs = {**inputs, "fused_lm_head": True}
        return super().compute_loss(
            model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
        )


class StreamTrainerMixin:
    """What a trainer does when its training data is a TokenStream (nothing otherwise):

    - on resume, the stream continues after the last block trained on (`data_stream.json` in the
      checkpoint folder), and the Trainer's own resume for an IterableDataset
      (`ignore_data_skip: false`: read and discard every batch trained so far, exact but as slow
      as the pipeline, and on top of a restored position it would skip data) is turned off;
    - each checkpoint gets the stream's position, written in `write_into_checkpoint` into the folder
      the checkpoint is being written to, so that it is part of the checkpoint from the start
      (an atomic save that stages and renames the folder, or a copy to object storage, includes it);
    - each training log gets `data/tokens/<source>`, the tokens trained on per source (in `log`,
      because callbacks see the logs only after they have been recorded).
    """

    _stream_base = (0, 0)  # (global step, blocks consumed) the current run started from

    def _token_stream(self) -> TokenStream | None:
        return self.train_dataset if isinstance(self.train_dataset, TokenStream) else None

    def _stream_position(self) -> int:
        step, samples = self._stream_base
        return samples + (self.state.global_step - step) * blocks_per_step(self.args)

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        stream = self._token_stream()
        if stream is not None:
            if self.args.dataloader_num_workers:
                raise UserError(
                    "a streaming mixture is read in the training process so that its position can be saved with "
                    "each checkpoint; set dataloader_num_workers: 0, or build the data first (medrecipes build-data)"
                )
            self.args.ignore_data_skip = True
            if resume_from_checkpoint is True:
                resume_from_checkpoint, _ = resume_point(self.args.output_dir)
            if resume_from_checkpoint:
                self._stream_base = restore_position(stream, resume_from_checkpoint, self.args)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def write_into_checkpoint(self, folder: str) -> None:
        """The stream's position into the checkpoint being saved (`TrainerSeams._save_checkpoint`
        calls it in the staging folder)."""
        stream = self._token_stream()
        # Process 0 reads the stream (accelerate dispatches its batches) or reads what all read.
        if stream is not None and self.is_world_process_zero():
            with open(os.path.join(folder, STATE_FILE), "w") as f:
                json.dump({**stream.state_at(self._stream_position()), "step": self.state.global_step}, f)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        stream = self._token_stream()
        if stream is not None and "loss" in logs:
            counts = stream.tokens_at(self._stream_position())
            logs.update({f"data/tokens/{name}": count for name, count in counts.items()})
        super().log(logs, start_time)
