"""A training run's life after its trainer is built: train (or finish from the last checkpoint),
save the final model atomically, evaluate at the end without evaluating twice, and end the run
with every process torn down. `recipes/*.py` call these in this order."""

import atexit
import json
import logging
import math
import os
import shutil
import sys
import threading
from typing import NoReturn

from medrecipes.allocator import keep_freed_memory
from medrecipes.errors import UserError, first_to_report
from medrecipes.outputs.checkpoints import TRAINER_STATE
from medrecipes.outputs.writes import full_disk_is_one_line, publish
from medrecipes.plan.hardware import hardware
from medrecipes.runs.folder import RunFolder
from medrecipes.runs.record import record_finished
from medrecipes.runs.resume import kept
from medrecipes.training.callbacks import StopsRun
from medrecipes.training.resume import check_resumable
from medrecipes.training.run_folder import say_resumed

logger = logging.getLogger(__name__)


def train_and_save(trainer, checkpoint: str | None) -> str:
    """Train (resuming from `checkpoint`), record the metrics and state, and save the model
    and its tokenizer to output_dir/final; returns that folder.

    A run that a callback stopped early (preemption, non-finite gradients) ends the process
    here instead, with the callback's exit code: what follows the training (final model,
    evaluation, push) belongs to the run that finishes.
    """
    if trainer.args.device.type == "cpu":
        keep_freed_memory()  # freed buffers stay in the process for the next step
    if checkpoint is not None:
        check_resumable(checkpoint, trainer.model, trainer.args)
    say_resumed(trainer.args)
    if checkpoint is not None and 0 < trainer.args.max_steps <= _steps_done(checkpoint):
        return _finish_from(trainer, checkpoint)
    # A disk that fills while the run writes its logs (the TensorBoard writer's thread raises at the
    # next write) or anything else of its own, saves aside (they have a line of their own).
    say_accumulation_past_an_epoch(trainer)
    say_half_precision_weights(trainer)
    out = trainer.args.output_dir
    with full_disk_is_one_line(out, f"{out} (the run's logs and checkpoints)", kept=lambda: kept(out)):
        result = trainer.train(resume_from_checkpoint=checkpoint)
    stopped = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, StopsRun) and cb.stop_reason]
    if stopped:
        reason, code = stopped[0].stop_reason, stopped[0].exit_code
        if code == 0 and trainer.args.should_log:  # every process stops alike: said once
            logger.warning(reason)
        end_run(trainer, 0 if code == 0 else f"error: {reason}")
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()
    final_dir = save_final(trainer)
    record_finished(trainer.args, trainer.state, hardware(trainer))
    return final_dir


def say_accumulation_past_an_epoch(trainer) -> None:
    """One line where gradient_accumulation_steps is more than the batches of an epoch: transformers
    ends an optimizer step at the epoch's end, so each step accumulates only the batches there are,
    and the batch the recipe asks for is never reached. Counted from the rows (a dataloader built to
    count would join accelerate's, which a checkpoint saves by index). A stream has no length, and
    GRPO's batches are of generations, which its own settings divide: nothing to say of either."""
    args = trainer.args
    try:
        count = len(trainer.train_dataset)
    except TypeError:
        return
    if hasattr(args, "num_generations"):
        return
    rows = args.per_device_train_batch_size * args.world_size
    batches = count // rows if args.dataloader_drop_last else math.ceil(count / rows)
    if 0 < batches < args.gradient_accumulation_steps:
        logger.warning(
            "gradient_accumulation_steps %d is more than the %d batches an epoch holds: each step ends at the epoch's "
            "end, a batch of %d rows, not %d; lower it to %d or less, or lower per_device_train_batch_size",
            args.gradient_accumulation_steps, batches, batches * rows, args.gradient_accumulation_steps * rows, batches,
        )  # fmt: skip


# Significand bits of the half-precision formats, the implicit leading one counted.
SIGNIFICAND_BITS = {"bfloat16": 8, "float16": 11}


def say_half_precision_weights(trainer) -> None:
    """Trainable weights held in bfloat16 or float16 with no float32 copy for the optimizer (DeepSpeed
    keeps one) take a step only where it is over half their last bit, about 2**-bits of the weight:
    an Adam-style step is about learning_rate, so a weight above learning_rate * 2**bits does not
    move. Where that is a tenth of them or more, said with the share and the fix."""
    import torch

    if trainer.is_deepspeed_enabled or not trainer.args.should_log:
        return
    trainable = [p for p in trainer.model.parameters() if p.requires_grad]
    half = [p for p in trainable if str(p.dtype).removeprefix("torch.") in SIGNIFICAND_BITS]
    if not half:
        return
    dtype = str(half[0].dtype).removeprefix("torch.")
    rate = trainer.args.learning_rate
    threshold = rate * 2 ** SIGNIFICAND_BITS[dtype]
    with torch.no_grad():
        still = sum(int((p.abs() > threshold).sum()) for p in half)
    total = sum(p.numel() for p in trainable)
    if still >= total / 10:
        logger.warning(
            "%.0f%% of the %s trainable weights are held in %s and above %d x learning_rate %g: a step of about "
            "learning_rate is under half their last bit and rounds away, so they do not train; load the model in "
            "float32 (dtype: float32) and compute in %s with %s: true, or train under DeepSpeed (float32 copies)",
            100 * still / total, f"{total:,}", dtype, 2 ** SIGNIFICAND_BITS[dtype], rate, dtype,
            "bf16" if dtype == "bfloat16" else "fp16",
        )  # fmt: skip


def _steps_done(checkpoint: str) -> int:
    with open(os.path.join(checkpoint, TRAINER_STATE), encoding="utf-8") as f:
        return json.load(f)["global_step"]


def _finish_from(trainer, checkpoint: str) -> str:
    """A run whose newest checkpoint is at max_steps (killed while writing final/, say): its model
    is loaded from the checkpoint and saved as final/, with no step trained. The trainer would
    train one step more (it looks at max_steps only after a step)."""
    from transformers import TrainerState

    if trainer.is_deepspeed_enabled and trainer.accelerator.state.deepspeed_plugin.zero_stage == 3:
        raise UserError(
            f"output_dir: {checkpoint} is at max_steps {trainer.args.max_steps} but final/ was not written; "
            "under ZeRO-3 it is written by a run that trains: raise max_steps, or load that checkpoint's model"
        )
    trainer.state = TrainerState.load_from_json(os.path.join(checkpoint, TRAINER_STATE))
    best = trainer.state.best_model_checkpoint if trainer.args.load_best_model_at_end else None
    source = best if best and os.path.isdir(best) else checkpoint  # what the end of training would load
    logger.info(
        "%s is at max_steps %d: final/ is saved from %s, no step trained", checkpoint, trainer.args.max_steps, source
    )
    trainer._load_from_checkpoint(source)  # the load a resume does before its first step
    final_dir = save_final(trainer)
    record_finished(trainer.args, trainer.state, hardware(trainer))
    return final_dir


def save_final(trainer) -> str:
    """Save the model and its tokenizer to output_dir/final as checkpoints are saved: into the
    staging folder, then renamed into place once every process has written its part, so a kill
    leaves the previous final/ or the new one, whole. Returns the folder."""
    args = trainer.args
    folder = RunFolder(args.output_dir)
    final_dir = folder.final
    staged = os.path.join(folder.staging, os.path.basename(final_dir))
    if args.should_save:
        shutil.rmtree(staged, ignore_errors=True)
        os.makedirs(staged)
    trainer.accelerator.wait_for_everyone()
    with full_disk_is_one_line(args.output_dir, final_dir, os.path.dirname(staged), kept(args.output_dir)):
        # An internal save: the trainer's own push of output_dir would race `hub.push.push_run`, which
        # sends final/ with its model card.
        trainer.save_model(staged, _internal_call=True)
        if trainer.is_world_process_zero():
            trainer.processing_class.save_pretrained(staged)
    trainer.accelerator.wait_for_everyone()
    if args.should_save:
        publish(staged, final_dir)
        shutil.rmtree(os.path.dirname(staged), ignore_errors=True)
        logger.info("final model saved to %s", final_dir)
    trainer.accelerator.wait_for_everyone()
    return final_dir


def end_run(trainer, status: int | str = 0) -> NoReturn:
    """End the process with `status` (an exit code, or a message for stderr, printed once per
    launch, and exit code 1, as SystemExit takes them) once the process group is torn down.

    A run of several processes ends without the interpreter's shutdown. gloo's worker threads
    (DeepSpeed, DDP and FSDP on CPU) live as long as their process group object, which
    `destroy_process_group` does not free while the wrapped model still holds it. A worker
    that drops the last reference to a Python tensor while the interpreter shuts down is
    stopped by Python in the middle of a C++ frame: the process aborts with "terminate called
    without an active exception" after a good run, and the launcher reports the run as
    failed. So the exit handlers run (loggers, trackers, temporary folders), other threads
    are waited for, output is flushed, and the process leaves with os._exit.
    """
    several = trainer.accelerator.num_processes > 1
    trainer.accelerator.end_training()
    if not several:
        raise SystemExit(status)
    if isinstance(status, str):
        if first_to_report():  # every process stops with the same message: print it once
            print(status, file=sys.stderr)
        status = 1
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # what the interpreter's shutdown would run first
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def evaluate_and_record(trainer) -> dict:
    """Evaluate every eval set once more and record the metrics beside the training ones (the
    multiple-choice reports, accuracy by subject, are logged by `eval_callback`). Where the run
    already evaluated the model in hand, at its last step, that evaluation is recorded instead
    of a second pass over the same weights (`evaluated_at_last_step`)."""
    metrics = evaluated_at_last_step(trainer) or trainer.evaluate()
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)
    return metrics


def evaluated_at_last_step(trainer) -> dict | None:
    """The metrics the run logged when it evaluated every eval set at its last step, if the model
    in hand is that step's: no best checkpoint was loaded at the end, or the best is the last.
    None otherwise (the final evaluation then runs). With the best checkpoint from an earlier
    step the evaluation runs again, so that the multiple-choice reports written for the last
    step (output_dir/eval_tasks) are those of the model that is saved."""
    state = trainer.state
    if (
        trainer.args.load_best_model_at_end
        and state.best_model_checkpoint
        and state.best_global_step != state.global_step
    ):
        return None
    logged = [
        e for e in state.log_history if e.get("step") == state.global_step and any(k.startswith("eval_") for k in e)
    ]
    metrics = {key: value for entry in logged for key, value in entry.items() if key != "step"}
    sets = trainer.eval_dataset
    runtimes = [f"eval_{name}_runtime" for name in sets] if isinstance(sets, dict) else ["eval_runtime"]
    if not all(key in metrics for key in runtimes):
        return None
    logger.info("the model was evaluated at its last step %d: those metrics are recorded", state.global_step)
    return metrics


def eval_loss_summary(log_history: list[dict]) -> list[str]:
    """One line per evaluation loss: its first and last logged value, e.g. before and after training."""
    lines = []
    keys = dict.fromkeys(k for entry in log_history for k in entry if k.startswith("eval") and k.endswith("_loss"))
    for key in keys:
        values = [(entry["step"], entry[key]) for entry in log_history if key in entry]
        (first_step, first), (last_step, last) = values[0], values[-1]
        lines.append(f"{key}: {first:.4f} at step {first_step} -> {last:.4f} at step {last_step}")
    return lines
