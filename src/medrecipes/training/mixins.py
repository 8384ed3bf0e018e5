"""What the recipes' trainers add to HF's and TRL's where the trainer offers no hook (each mixin
says which): checkpoints written in a staging folder and renamed, token counts and gradient norms
in the logs, perplexity beside each eval loss, GRPO's per-set eval metrics, a learning rate of its
own for the embeddings, the fused LM-head loss, SFT's metrics read once per log, GRPO's compiled
decoding, and a streamed mixture's position in every checkpoint. What can be a callback is one
(`training.callbacks.recipe_callbacks`)."""

import json
import logging
import math
import os
import shutil
import time
from collections.abc import Mapping

import torch
from transformers import Trainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

from medrecipes.data.stream import STATE_FILE, TokenStream, blocks_per_step, restore_position
from medrecipes.errors import UserError
from medrecipes.models.loading import check_positions
from medrecipes.outputs.checkpoints import TRAINER_STATE, kept, newest_complete_checkpoint
from medrecipes.outputs.records import STAGING
from medrecipes.outputs.writes import full_disk_is_one_line, publish
from medrecipes.training.callbacks import NonFiniteGuard
from medrecipes.training.monitoring import ThroughputMonitor

logger = logging.getLogger(__name__)

# Devices where TRL's fused LM head runs eagerly without Triton. TRL scores only the labelled
# positions where its Triton kernel runs (CUDA, XPU) and every position elsewhere, zeroing the
# unlabelled ones, so that a static-shape device (Neuron, XLA) keeps one tile shape; on these the
# shape costs nothing and the unlabelled positions are pure work: an SFT row of 140 tokens trains 4,
# and the head over Gemma's 262k vocabulary is 63% of Gemma 3 270M's compute a token. Same loss and
# gradients; 3.4x faster a step of that SFT on 2 CPU cores (docs/benchmarks.md, benchmarks/fused_head.py).
EAGER_DEVICES = ("cpu", "mps")


def score_labelled_positions_only() -> None:
    """Make TRL's fused LM head score only the positions with a label on EAGER_DEVICES too (once per
    process; TRL's choice stands on every other device). Its choice is `trl.trainer.utils._use_triton`,
    read at each forward: TRL has no option for it. A TRL without that function is left as it is."""
    import trl.trainer.utils as trl_utils

    chosen = getattr(trl_utils, "_use_triton", None)
    if chosen is None or getattr(chosen, "labelled_only", False):
        return

    def compact(device) -> bool:
        return chosen(device) or device.type in EAGER_DEVICES

    compact.labelled_only = True
    trl_utils._use_triton = compact


class DeferredSFTMetricsMixin:
    """TRL's SFT loss with its per-batch metrics (entropy, token accuracy, tokens trained) kept on
    the device and read once per log, not in every micro-batch.

    TRL 1.16's `SFTTrainer.compute_loss` reads five values on the host in each micro-batch (two
    `> 0` tests, two `.item()` for the metrics, one for the token count): on a GPU each waits for
    every kernel queued before it, so the host stops queueing the next ones. TRL has no option to
    defer them; `compute_loss` is the trainer's public hook. This one computes TRL's loss the way
    TRL's own common path does (the fused head's log-probabilities over the labelled tokens, DFT
    weighting, the count across devices) and hands every other case (an auxiliary MoE loss, label
    smoothing, a custom loss function, sequence parallelism, outputs asked for) to TRL unchanged.
    The metrics are TRL's values: each micro-batch's entropy and accuracy per labelled token (0
    where it has none) and the running token count, averaged by TRL's `log` as before."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        args = self.args
        parallel = getattr(self.accelerator, "parallelism_config", None)
        if (
            return_outputs
            or self.aux_loss_enabled
            or self.compute_loss_func is not None
            or (self.label_smoother is not None and args.loss_type == "nll")
            or (parallel is not None and getattr(parallel, "sp_enabled", False))
        ):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        mode = "train" if self.model.training else "eval"
        inputs["use_cache"] = False
        outputs = model(**inputs, fused_lm_head=True)
        per_token_loss = -outputs.log_probs  # zero on ignored positions
        if args.loss_type == "dft":
            per_token_loss = per_token_loss * outputs.log_probs.exp().detach()
        num_tokens = outputs.label_mask.sum() if num_items_in_batch is None else num_items_in_batch
        loss = per_token_loss.sum() / torch.as_tensor(num_tokens).clamp(min=1)
        if args.average_tokens_across_devices and num_items_in_batch is not None:
            loss = loss * (self.accelerator.num_processes // self.get_tp_size())
        gather = self.accelerator.gather_for_metrics
        valid = gather(outputs.label_mask.sum()).sum().clamp(min=1)  # entropy and top-1 are 0 where unlabelled
        values = [gather(outputs.entropy.detach().sum()).sum() / valid, gather(outputs.is_top1.sum()).sum() / valid]
        if mode == "train":
            if "attention_mask" in inputs:
                seen = gather(inputs["attention_mask"].sum()).sum()
            else:  # padding-free: the flattened row's length, host metadata
                seen = gather(torch.tensor(inputs["position_ids"].size(1), device=loss.device)).sum()
            values.append(seen // self._tp_size)
        else:
            values.append(torch.zeros((), device=loss.device))
        self._deferred_metrics(mode).append(torch.stack([v.to(torch.float64) for v in values]))
        return loss

    def _deferred_metrics(self, mode: str) -> list:
        if not hasattr(self, "_deferred"):
            self._deferred = {"train": [], "eval": []}
        return self._deferred[mode]

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "train" if self.model.training else "eval"
        pending = self._deferred_metrics(mode)
        if pending:
            rows = torch.stack(pending).tolist()  # the one read of the values since the last log
            pending.clear()
            self._metrics[mode]["entropy"].extend(row[0] for row in rows)
            self._metrics[mode]["mean_token_accuracy"].extend(row[1] for row in rows)
            self._total_train_tokens += int(sum(row[2] for row in rows))
            self._metrics[mode]["num_tokens"] = [self._total_train_tokens]
        super().log(logs, start_time)


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


class RecipeTrainerMixin:
    """What every recipe's trainer does beyond the library's; put it first in the bases
    (`class T(RecipeTrainerMixin, SFTTrainer)`) and pass `callbacks.recipe_callbacks(...)`.

    - Atomic checkpoints: a checkpoint is written under output_dir/_staging and renamed to
      checkpoint-<step> once every process has written its part, so a process killed while
      saving leaves nothing that `resume.last_checkpoint` would resume from. HF's save_total_limit
      rotation, which runs inside the staging folder and finds one checkpoint there, is run
      again on output_dir once the checkpoint is published.
      Code that writes more into a checkpoint (data position, ...) goes in a `_save_checkpoint`
      of a class after this one in the bases, into `os.path.join(self._get_output_dir(trial),
      f"checkpoint-{self.state.global_step}")`, which is the staging folder during the save.
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
        callbacks = self.callback_handler.callbacks
        self.guard = next((cb for cb in callbacks if isinstance(cb, NonFiniteGuard)), None)
        self.monitor = next((cb for cb in callbacks if isinstance(cb, ThroughputMonitor)), None)
        if self.guard is not None and not hasattr(Trainer, "_get_grad_norm"):
            raise RuntimeError("the non-finite guard needs Trainer._get_grad_norm (transformers 5.17 or newer)")
        self._pending_counts = [0, 0]  # tokens and token positions on this process since the last sum
        self._staging_root: str | None = None
        self._deferred_push = False
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

    def _get_grad_norm(self, model, grad_norm=None):
        grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        if self.guard is not None:
            self.guard.inspect(self, model, grad_norm)
        return grad_norm

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
            return super().evaluate(*args, **kwargs)
        finally:
            if outer:
                self._evaluating = False
                if self.monitor is not None:
                    self.monitor.pause(time.perf_counter() - started)

    def create_model_card(self, *args, **kwargs) -> None:
        """One model card per run, ours: `hub.write_card` when the run pushes, `medrecipes card`
        after. TRL's trainers write their generic card to output_dir/README.md at every
        checkpoint, beside it and saying none of what ours does (data, evaluations, recipe)."""
        return None

    def _get_output_dir(self, trial):
        return self._staging_root or super()._get_output_dir(trial)

    def _push_from_checkpoint(self, checkpoint_folder):
        if self._staging_root is not None:  # push the folder once it has its final name
            self._deferred_push = True
            return
        super()._push_from_checkpoint(checkpoint_folder)

    def _save_checkpoint(self, model, trial):
        started = time.perf_counter()
        self._sum_token_counts()  # the saved state must hold the tokens seen up to this step
        run_dir = self._get_output_dir(trial)
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        staging_root = os.path.join(run_dir, STAGING)
        staged, final = os.path.join(staging_root, name), os.path.join(run_dir, name)
        if self.args.should_save:
            shutil.rmtree(staging_root, ignore_errors=True)  # what a killed save left behind
            os.makedirs(staging_root)
        self.accelerator.wait_for_everyone()
        self._staging_root = staging_root
        try:
            with full_disk_is_one_line(run_dir, final, partial=staging_root, kept=kept(run_dir)):
                super()._save_checkpoint(model, trial)
        finally:
            self._staging_root = None
        self.accelerator.wait_for_everyone()  # every process has written its shards and RNG state
        if self.state.best_model_checkpoint == staged:  # the trainer names the best where it was written
            self.state.best_model_checkpoint = final
            if self.args.should_save:
                self.state.save_to_json(os.path.join(staged, TRAINER_STATE))
        if self.args.should_save:
            publish(staged, final)
            shutil.rmtree(staging_root, ignore_errors=True)
            # The library's save_total_limit rotation, which ran in the staging folder, on the published ones.
            rotate_checkpoints(run_dir, self.args.save_total_limit, self.state.best_model_checkpoint)
        self.accelerator.wait_for_everyone()
        if self._deferred_push:
            self._deferred_push = False
            super()._push_from_checkpoint(final)
        if self.monitor is not None:
            self.monitor.pause(time.perf_counter() - started)


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


class GenerationKeepsModeMixin:
    """The model in the mode it had before GRPO generated its completions. TRL 1.16 sets it to
    training mode after transformers' continuous batching (`use_transformers_continuous_batching`)
    even during an evaluation, where the loss then reads the training loop's accumulation, which
    an evaluation before the first step (`eval_on_start`) has not set yet, and dropout would be on.
    TRL's generation method is the only hook."""

    def _generate_single_turn(self, *args, **kwargs):
        training = self.model.training
        try:
            return super()._generate_single_turn(*args, **kwargs)
        finally:
            self.model.train(training)


def compile_decoding(generation_config, device: str, backend: str = "inductor") -> None:
    """Let `generate` compile its decoding step over a static cache: TRL 1.16 builds its generation
    config with `disable_compile=True`, whatever the cache. On a GPU the step runs as CUDA graphs
    (transformers' `reduce-overhead`); transformers compiles on accelerators only, so elsewhere the
    compilation is asked for all devices (the CPU tests)."""
    from transformers.generation.configuration_utils import CompileConfig

    compile_config = CompileConfig(backend=backend, mode="reduce-overhead" if device == "cuda" else "default")
    compile_config._compile_all_devices = device != "cuda"
    generation_config.disable_compile = False
    generation_config.compile_config = compile_config


class CompiledGenerationMixin:
    """GRPO's generation with its decoding step compiled (`compile_generation`, over
    `cache_implementation: static`; `config.checks.resolve_grpo` asks for both)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if getattr(self.args, "compile_generation", False) and getattr(self, "generation_config", None) is not None:
            compile_decoding(self.generation_config, self.accelerator.device.type)


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
    - each checkpoint gets the stream's position, written in `_save_checkpoint` into the folder
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
                resume_from_checkpoint = newest_complete_checkpoint(self.args.output_dir)
            if resume_from_checkpoint:
                self._stream_base = restore_position(stream, resume_from_checkpoint, self.args)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        stream = self._token_stream()
        # Process 0 reads the stream (accelerate dispatches its batches) or reads what all read.
        if stream is not None and self.is_world_process_zero():
            folder = os.path.join(self._get_output_dir(trial), f"checkpoint-{self.state.global_step}")
            with open(os.path.join(folder, STATE_FILE), "w") as f:
                json.dump({**stream.state_at(self._stream_position()), "step": self.state.global_step}, f)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        stream = self._token_stream()
        if stream is not None and "loss" in logs:
            counts = stream.tokens_at(self._stream_position())
            logs.update({f"data/tokens/{name}": count for name, count in counts.items()})
        super().log(logs, start_time)
