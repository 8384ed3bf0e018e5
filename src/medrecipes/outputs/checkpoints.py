"""A run's checkpoint folders as the trainer names them, and the newest one that is whole."""

import os
import re

# A run's checkpoint folders in its output_dir, as the trainer names them.
CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def checkpoint_step(path: str) -> int | None:
    """The step of a `checkpoint-<step>` folder (a name or a path), else None."""
    match = CHECKPOINT.match(os.path.basename(os.path.normpath(path)))
    return int(match.group(1)) if match else None


def checkpoint_steps(output_dir: str) -> list[int]:
    """The steps of the `checkpoint-<step>` folders in `output_dir`, in order."""
    if not os.path.isdir(output_dir):
        return []
    return sorted(step for name in os.listdir(output_dir) if (step := checkpoint_step(name)) is not None)


TRAINER_STATE = "trainer_state.json"  # the trainer writes it last into a checkpoint


def newest_complete_checkpoint(output_dir: str, warn=None) -> str | None:
    """The newest checkpoint folder in `output_dir` that holds the trainer state, which the
    trainer writes last: the one a run resumes from, whose state a report reads, and the one a
    failed or interrupted run says it keeps. `warn`, a logger, logs each newer folder skipped (a
    save killed by an older version, or by a process that did not stage its checkpoints)."""
    for step in reversed(checkpoint_steps(output_dir)):
        path = os.path.join(output_dir, f"checkpoint-{step}")
        if os.path.isfile(os.path.join(path, TRAINER_STATE)):
            return path
        if warn is not None:
            warn.warning("ignoring %s: it has no %s, so its save did not finish", path, TRAINER_STATE)
    return None


def kept(output_dir: str) -> str:
    """What a run that stops (a failed save, an interrupt) keeps, in the line it prints."""
    checkpoint = newest_complete_checkpoint(output_dir)
    if checkpoint is None:
        return f"no checkpoint of this run was saved yet in {output_dir}; the same command starts it again"
    return f"{checkpoint} is kept whole, and the same command resumes from it"
