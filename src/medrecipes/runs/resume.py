"""Where a run starts: the checkpoint it resumes from (the newest whole one in output_dir, a
damaged newer one set aside with a warning, or the one `resume_from_checkpoint` names), an
interrupted save completed first, and a checkpoint of another run refused in one line before
training. Whether a checkpoint fits the model in hand is the trainer's side
(`training.resume.check_resumable`)."""

import logging
import os

from medrecipes.config.schema import world_size
from medrecipes.errors import UserError
from medrecipes.outputs.checkpoints import TRAINER_STATE, checkpoint_damage, checkpoint_steps
from medrecipes.outputs.records import STAGING
from medrecipes.outputs.writes import REPLACED, finish_publish
from medrecipes.runs.record import PROCESSES, identity_differences, read_record

logger = logging.getLogger(__name__)


def resume_point(output_dir: str) -> tuple[str | None, list[tuple[str, str, bool]]]:
    """(the checkpoint a run in `output_dir` resumes from, each newer one set aside with why and
    whether it is damaged rather than unfinished or another run's): the
    one rule that the resume, the line an interrupted run prints, and the report's state all ask.

    The newest checkpoint that is whole: renamed into place by `RecipeTrainerMixin`, holding the
    trainer state, which the trainer writes last, and readable as the trainer will read it
    (`checkpoint_damage`); and this run's: saved by a run of the same script, model, data and
    starting weights (its stamp, `record.stamp_checkpoint`). Set aside: a folder without the state
    (a save killed by an older version, or by a process that did not stage its checkpoints), one
    another run saved, and a damaged one (a disk that lost part of a file, a copy cut short)."""
    skipped = []
    ours = read_record(output_dir) if os.path.isdir(output_dir) else None
    for step in reversed(checkpoint_steps(output_dir)):
        path = os.path.join(output_dir, f"checkpoint-{step}")
        if not os.path.isfile(os.path.join(path, TRAINER_STATE)):
            skipped.append((path, f"it has no {TRAINER_STATE}, so its save did not finish", False))
            continue
        theirs = _stamp(path)
        if ours and theirs and (differs := identity_differences(theirs, ours)):
            skipped.append((path, f"another run saved it ({'; '.join(differs)})", False))
            continue
        problem = checkpoint_damage(path)
        if problem is None:
            return path, skipped
        skipped.append((path, problem, True))
    return None, skipped


def last_checkpoint(output_dir: str) -> str | None:
    """The checkpoint a run resumes from automatically (`resume_point`), each one set aside said
    in a warning; damaged folders and none whole is one line."""
    path, skipped = resume_point(output_dir)
    for folder, why, _ in skipped:
        logger.warning("ignoring %s: %s", folder, why)
    if path is not None:
        logger.info("resuming from %s", path)
        _say_what_differs(path)
        return path
    damaged = [f"{os.path.basename(folder)}: {why}" for folder, why, damage in skipped if damage]
    if damaged:
        raise UserError(
            f"output_dir: no checkpoint in {output_dir} can be resumed ({'; '.join(damaged)}); move them "
            "aside to start over, or set overwrite_output_dir: true to delete them"
        )
    return None


def _say_what_differs(checkpoint: str) -> None:
    """What the trainer resumes without a word but not as the run was: a checkpoint with no
    optimizer state (a copy that left it out: the optimizer starts again), or one saved by another
    number of processes (each step's batch and the data still to come are not the run's)."""
    names = [name for _, _, files in os.walk(checkpoint) for name in files]
    optimizer = any("optim" in name for name in names)  # optimizer.pt, DeepSpeed's and FSDP's shards
    # transformers restores the optimizer only beside scheduler.pt, and skips both without it (DeepSpeed's own aside)
    scheduler = "scheduler.pt" in names or any("optim_states" in name for name in names)
    if not (optimizer and scheduler):
        held = "no optimizer state" if not optimizer else "its optimizer state but no scheduler.pt"
        logger.warning(
            "%s holds %s (save_only_model, or a copy that left it out): the run resumes its weights and step, and "
            "the optimizer and the learning-rate schedule start again (moments at zero, warm-up from step 0's "
            "rate); resume from a checkpoint with its optimizer.pt and scheduler.pt to continue them",
            checkpoint, held,
        )  # fmt: skip
    saved, now = (_stamp(checkpoint) or {}).get(PROCESSES), world_size()
    if isinstance(saved, int) and saved != now:
        logger.warning(
            "%s was saved by a run of WORLD_SIZE %d and resumes in one of %d: a step's batch is per_device_train_batch_size "
            "x %d, not x %d, and the data to come is not what the run would have read; launch %d to resume it as it was",
            checkpoint, saved, now, now, saved, saved,
        )  # fmt: skip


def kept(output_dir: str) -> str:
    """What a run that stops (a failed save, an interrupt) keeps, in the line it prints: the
    checkpoint the same command would resume from (`resume_point`)."""
    checkpoint, _ = resume_point(output_dir)
    if checkpoint is None:
        return f"no checkpoint of this run was saved yet in {output_dir}; the same command starts it again"
    return f"{checkpoint} is kept whole, and the same command resumes from it"


def _stamp(checkpoint: str) -> dict | None:
    """The identity of the run that saved `checkpoint` (`record.stamp_checkpoint`); None for a
    checkpoint saved before runs stamped theirs, or whose stamp cannot be read (the checkpoint's
    other files say whether it is whole)."""
    try:
        return read_record(checkpoint)
    except UserError:
        return None


def finish_interrupted_saves(output_dir: str) -> None:
    """Put in place a checkpoint or final/ whose save was killed as it replaced an older folder
    of the same name (`outputs.writes.finish_publish`); a save killed earlier is discarded by the next."""
    staging = os.path.join(output_dir, STAGING)
    names = os.listdir(staging) if os.path.isdir(staging) else []
    for name in (n.removesuffix(REPLACED) for n in names if n.endswith(REPLACED)):
        if finish_publish(os.path.join(staging, name), os.path.join(output_dir, name)):
            logger.info("%s: completed its save, interrupted as it replaced the older one", name)


def resumes_from_output_dir(args) -> bool:
    """Whether the run resumes from output_dir's newest checkpoint (no checkpoint named)."""
    return args.resume_from_checkpoint is None or str(args.resume_from_checkpoint).lower() == "true"


def checkpoint_to_resume(args, recipe=None) -> str | None:
    """The checkpoint a run starts from: the one `resume_from_checkpoint` names (a checkpoint
    folder of this run, or of another run where the recipe sets `resume_from_another_run`), else
    the newest whole one in output_dir (also with `resume_from_checkpoint: true`)."""
    named = args.resume_from_checkpoint
    if resumes_from_output_dir(args):
        with args.main_process_first(local=args.save_on_each_node, desc="completing an interrupted save"):
            if args.should_save:
                finish_interrupted_saves(args.output_dir)
        checkpoint = last_checkpoint(args.output_dir)
        if checkpoint is None and named is not None:  # `true`: asked to resume, and there is nothing to
            logger.warning(
                "resume_from_checkpoint: true, and %s holds no checkpoint: the run starts at step 0", args.output_dir
            )
        return checkpoint
    check_named_checkpoint(named, args.output_dir, recipe)
    logger.info("resuming from %s (resume_from_checkpoint)", named)
    return named


def check_named_checkpoint(named: str, output_dir: str, recipe=None) -> None:
    """The checkpoint `resume_from_checkpoint` names is there, whole, and this run's (or the recipe
    sets `resume_from_another_run`): what the run refuses, and `medrecipes validate` checks."""
    if not os.path.exists(named):
        inside = os.path.join(output_dir, named)
        fix = (
            f"output_dir's is {inside}: name it so"
            if not os.path.isabs(named) and os.path.isdir(inside)
            else "name a checkpoint-<step> folder, or leave the key out to resume from output_dir's newest"
        )
        raise UserError(
            f"resume_from_checkpoint: {named} does not exist (a relative path is read from the working directory, "
            f"{os.getcwd()}); {fix}"
        )
    if not os.path.isfile(os.path.join(named, TRAINER_STATE)):
        raise UserError(
            f"resume_from_checkpoint: {named} is not a complete checkpoint (no {TRAINER_STATE}); "
            "name a checkpoint-<step> folder, or leave the key out to resume from output_dir's newest"
        )
    problem = checkpoint_damage(named)
    if problem is not None:
        raise UserError(f"resume_from_checkpoint: {named} cannot be resumed: {problem}; name a whole checkpoint")
    if not getattr(recipe, "resume_from_another_run", False):
        _refuse_another_run(named, output_dir)


def _refuse_another_run(checkpoint: str, output_dir: str) -> None:
    """A named checkpoint whose run (the run.json of its folder's run) is another run than this
    one: another script, starting model or data. Its weights would load into this run's model and
    the result would be saved as this run's: one line, unless the recipe says so."""
    theirs = read_record(os.path.dirname(os.path.abspath(checkpoint))) or {}
    ours = read_record(output_dir) or {}
    differs = identity_differences(theirs, ours)
    if theirs and ours and differs:
        raise UserError(
            f"resume_from_checkpoint: {checkpoint} is another run's ({'; '.join(differs)}); name a checkpoint "
            "of this run, or set resume_from_another_run: true to start from it on purpose"
        )
