"""Trainer callbacks shared by the recipes, and `recipe_callbacks`, the list every recipe runs with.

A recipe's trainer combines them with `mixins.RecipeTrainerMixin`, which feeds them what a
callback cannot see (the gradient norm before the optimizer step, token counts, the log
dictionary before it is recorded) and writes checkpoints atomically.
"""

import logging
import math
import os
import shutil
import signal
import threading

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from medrecipes.config.library_checks import warmup_note
from medrecipes.outputs.checkpoints import checkpoint_step, checkpoint_steps
from medrecipes.training.monitoring import ThroughputMonitor

logger = logging.getLogger(__name__)


class StopsRun(TrainerCallback):
    """A callback that may end a run before max_steps; `train_and_save` then exits with
    `exit_code` and `stop_reason` instead of saving the final model."""

    exit_code = 1

    def __init__(self):
        self.stop_reason: str | None = None


class PreemptionHandler(StopsRun):
    """On SIGTERM, SIGUSR1 or SIGHUP: checkpoint at the end of the current optimizer step and exit 0.

    Kubernetes sends SIGTERM and kills after terminationGracePeriodSeconds; SLURM sends the
    signal named by `--signal` before a time limit or a preemption; a terminal or SSH session
    that closes sends SIGHUP to the run started in it (whose default ends it where it is). The handler only records
    the signal. The run acts on it where a checkpoint resumes exactly: between micro-batches
    the saved random-number state would be one that an uninterrupted run never has. With
    several processes they agree, at every step, over a CPU (gloo) group, so that no GPU work
    waits and no process stops alone when only some received the signal.

    If the checkpoint is not written `grace_seconds` after the signal, the process exits with
    128 + SIGTERM, as a killed process would: atomic checkpoints make that safe, the previous
    complete checkpoint is resumed.
    """

    exit_code = 0
    signals = (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)
    expired_exit_code = 128 + signal.SIGTERM

    def __init__(self, grace_seconds: float):
        super().__init__()
        self.grace_seconds = grace_seconds
        self.received: int | None = None
        self._previous: dict = {}
        self._group = None

    def on_train_begin(self, args, state, control, **kwargs):
        if threading.current_thread() is threading.main_thread():  # Python handles signals there only
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handle)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1 and self._group is None:
            self._group = dist.new_group(backend="gloo")

    def _handle(self, signum, frame):
        if self.received is None:
            self.received = signum
            timer = threading.Timer(self.grace_seconds, self._expire)
            timer.daemon = True
            timer.start()

    def _expire(self):
        logger.error(
            "%s: no checkpoint within preemption_grace_seconds (%s s); exiting without one, "
            "the last complete checkpoint stays",
            signal.Signals(self.received).name,
            self.grace_seconds,
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(self.expired_exit_code)

    def on_step_end(self, args, state, control, **kwargs):
        requested = self.received is not None
        if self._group is not None:
            flag = torch.tensor([int(requested)])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
            requested = bool(flag.item())
        if requested and self.stop_reason is None and state.global_step < state.max_steps:
            name = signal.Signals(self.received).name if self.received else "a signal to another process"
            self.stop_reason = (
                f"{name}: stopped at step {state.global_step} with checkpoint-{state.global_step}; "
                "run the same command again to resume"
            )
            if args.should_log:  # every process agreed: said once
                logger.warning("%s received: saving checkpoint-%d and exiting", name, state.global_step)
            control.should_save = True
            control.should_training_stop = True
            control.should_evaluate = False
            # Loading the best checkpoint back would spend the grace time on nothing.
            args.load_best_model_at_end = False
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self.received is None:  # keep the handlers after a signal: the grace timer bounds the rest
            for sig, previous in self._previous.items():
                signal.signal(sig, previous)
            self._previous = {}
        if self._group is not None:
            # Destroyed now, not when the interpreter exits: a gloo group's worker threads live
            # as long as the group object, and one freed during interpreter shutdown can abort
            # the process ("terminate called without an active exception") after a good run.
            dist.destroy_process_group(self._group)
            self._group = None


class NonFiniteGuard(StopsRun):
    """A NaN or infinite gradient norm, seen before the optimizer step: skip the step or stop.

    The gradient norm is all-reduced, so every process takes the same decision (a loss is per
    process, and a non-finite loss always reaches the norm through its gradients). Skipping
    drops every gradient: torch optimizers leave a parameter without a gradient untouched, so
    weights and optimizer moments stay as they were, while the step still counts (its batch is
    consumed, the schedule moves on). `skip` allows `max_skips` such steps, then stops; `stop`
    stops at the first. Stopping saves a checkpoint of the untouched weights and exits 1.

    Reading the norm is one host-device sync per optimizer step, the only one the guard adds; the
    recipes leave the trainer's `logging_nan_inf_filter` (a read of every micro-batch's loss) off,
    since a non-finite loss always reaches the norm read here. Under DeepSpeed the engine steps inside backward: the norm arrives after the
    update, so the guard stops without saving, and the last checkpoint is the last good state.
    With fp16 the gradient scaler skips overflowing steps itself and the guard stands aside.
    """

    def __init__(self, policy: str = "skip", max_skips: int = 3):
        super().__init__()
        self.policy = policy
        self.max_skips = max_skips
        self.skipped = 0
        self._stop_at_step_end = False
        self._save = True

    def inspect(self, trainer, model, grad_norm) -> None:
        """Called by RecipeTrainerMixin with the gradient norm of the step about to be taken."""
        if grad_norm is None or trainer.args.fp16:
            return
        grad_norm = grad_norm.item() if isinstance(grad_norm, torch.Tensor) else float(grad_norm)
        if math.isfinite(grad_norm):
            return
        step = trainer.state.global_step + 1
        deepspeed = trainer.is_deepspeed_enabled
        if not deepspeed:
            model.zero_grad(set_to_none=True)
        if self.policy == "skip" and self.skipped < self.max_skips and not deepspeed:
            self.skipped += 1
            logger.warning(
                "step %d: gradient norm is %s; step skipped (%d of at most %d)",
                step,
                grad_norm,
                self.skipped,
                self.max_skips,
            )
            return
        self._stop_at_step_end, self._save = True, not deepspeed
        why = "the skips allowed are used up" if self.policy == "skip" else "nonfinite_policy is stop"
        where = (
            f"checkpoint-{step} holds the weights before it"
            if self._save
            else "DeepSpeed applied the update; the last checkpoint holds the last good weights"
        )
        self.stop_reason = (
            f"step {step}: gradient norm is {grad_norm} and {why}; {where}. Lower learning_rate "
            "or check the data at that step, then run the same command to resume"
        )
        logger.error(self.stop_reason)

    def on_step_end(self, args, state, control, **kwargs):
        if self._stop_at_step_end:
            self._stop_at_step_end = False
            control.should_training_stop = True
            control.should_save = self._save
            control.should_evaluate = False
            args.load_best_model_at_end = False  # the run failed; keep the weights it stopped with
        return control


class KeepBestCheckpoints(TrainerCallback):
    """After each save, keep the best `keep` checkpoints by `metric_for_best_model` and the
    newest `keep_last` (1 by default), and delete the others.

    HF's `save_total_limit` keeps the newest N and the single best; a long run wants the best
    few by eval loss to compare or average as well as the newest to resume from. The trainer's
    best checkpoint is always kept so that `load_best_model_at_end` finds it.
    """

    def __init__(self, keep: int | None, keep_last: int | None = None):
        self.keep_best = keep
        self.keep_last = keep_last or 1

    def on_save(self, args, state, control, **kwargs):
        if not args.should_save:
            return
        steps = checkpoint_steps(args.output_dir)
        kept = set(steps[-self.keep_last :])
        if self.keep_best:
            metric = args.metric_for_best_model
            metric = metric if metric.startswith("eval_") else f"eval_{metric}"
            scores = {entry["step"]: entry[metric] for entry in state.log_history if metric in entry}
            ranked = sorted((s for s in steps if s in scores), key=scores.get, reverse=args.greater_is_better)
            kept |= set(ranked[: self.keep_best])
        best = checkpoint_step(state.best_model_checkpoint) if state.best_model_checkpoint else None
        if best is not None:
            kept.add(best)
        for step in steps:
            if step not in kept:
                logger.info("removing checkpoint-%d (neither among the last %d nor the best)", step, self.keep_last)
                shutil.rmtree(os.path.join(args.output_dir, f"checkpoint-{step}"), ignore_errors=True)


class CopyCheckpoints(TrainerCallback):
    """Hands each saved checkpoint to `copier` (`submit(folder)`, copying in the background)
    and waits for the copies (`wait()`) at the end of training: a `mirror.BackgroundMirror` to
    object storage, or a `hub.checkpoints.CheckpointPusher` to Hub branches. `per_node`: every node copies
    what it saved (object storage, with save_on_each_node), rather than only the first process."""

    def __init__(self, copier, per_node: bool = False):
        self.copier = copier
        self.per_node = per_node

    def _copies(self, args, state) -> bool:
        return args.should_save if self.per_node else state.is_world_process_zero

    def on_save(self, args, state, control, **kwargs):
        if self._copies(args, state):
            self.copier.submit(os.path.join(args.output_dir, f"checkpoint-{state.global_step}"))

    def on_train_end(self, args, state, control, **kwargs):
        if self._copies(args, state):
            self.copier.wait()


class ResumedSchedule(TrainerCallback):
    """A run resumed with another max_steps than its checkpoint was saved with (raised after it
    finished, as docs/long-runs.md offers): the trainer rebuilds its schedule for the new count, but
    the restored optimizer holds the rate the old one had reached (0 at the end of a cosine or
    linear decay), which its first step would take. The rate is set to the new schedule's at this
    step, and said. A DeepSpeed-held scheduler restores itself and is left as it is."""

    def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        if state.global_step == 0 or not isinstance(lr_scheduler, torch.optim.lr_scheduler.LambdaLR):
            return
        step = lr_scheduler.last_epoch
        rates = [base * rate(step) for base, rate in zip(lr_scheduler.base_lrs, lr_scheduler.lr_lambdas, strict=True)]
        held = [group["lr"] for group in optimizer.param_groups]
        if all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12) for a, b in zip(rates, held, strict=True)):
            return
        for group, rate in zip(optimizer.param_groups, rates, strict=True):
            group["lr"] = rate
        lr_scheduler._last_lr = rates  # what get_last_lr() (the logged learning_rate) reads until its next step
        if args.should_log:
            logger.warning(
                "resuming at step %d with a schedule of %d steps: the learning rate is %.3g, the new schedule's "
                "at this step, not the %.3g the checkpoint's schedule had reached",
                step, state.max_steps, rates[0], held[0],
            )  # fmt: skip


class IntervalsOfThisStart(TrainerCallback):
    """A resumed run logs, evaluates and saves at the intervals its recipe gives now (a run resumed
    with save_steps lowered saves more often from there): transformers takes them from the
    checkpoint's trainer_state.json, as the start that wrote it set them."""

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step > 0:
            state.compute_steps(args, state.max_steps)


class WarmupWithinRun(TrainerCallback):
    """A run counted in epochs learns its step count once its data is there: a warm-up that takes
    every step of it is said then (`library_checks.warmup_note`; a run of max_steps is told at parse)."""

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step == 0 and args.max_steps <= 0 and args.should_log:
            if note := warmup_note(args, state.max_steps):
                logger.warning(note)


def recipe_callbacks(recipe, training_args) -> list[TrainerCallback]:
    """The callbacks a recipe's trainer runs with: preemption, the non-finite guard, monitoring,
    the schedule and intervals of a resumed run, a warm-up as long as the run, and, as the recipe asks, checkpoint mirroring, Hub revisions and retention (last, so that
    copies are taken before old checkpoints are deleted)."""
    callbacks = [
        PreemptionHandler(recipe.preemption_grace_seconds),
        NonFiniteGuard(recipe.nonfinite_policy, recipe.max_nonfinite_skips),
        ThroughputMonitor(recipe.gpu_hour_price, recipe.peak_tflops),
        ResumedSchedule(),
        IntervalsOfThisStart(),
        WarmupWithinRun(),
    ]
    if recipe.checkpoint_mirror_url:
        from medrecipes.mirror import BackgroundMirror

        callbacks.append(CopyCheckpoints(BackgroundMirror(recipe.checkpoint_mirror_url), per_node=True))
    if recipe.push_checkpoint_revisions:
        from medrecipes.hub.checkpoints import CheckpointPusher, hub_repo_id

        args = training_args
        callbacks.append(CopyCheckpoints(CheckpointPusher(hub_repo_id(args), args.hub_token, args.hub_private_repo)))
    # save_total_limit is the trainer's own rotation (RecipeTrainerMixin runs it on published checkpoints).
    if recipe.keep_last_checkpoints or recipe.keep_best_checkpoints:
        callbacks.append(KeepBestCheckpoints(recipe.keep_best_checkpoints, recipe.keep_last_checkpoints))
    return callbacks
