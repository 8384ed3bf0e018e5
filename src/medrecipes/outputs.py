"""Where commands write: never over their own input, never over an earlier result unless the
user says so, and atomically, so that a kill leaves the old result or the new one, never a part.

A result is written beside its final path and renamed into place: one rename for a file
(`os.replace`) or a new folder; a folder that replaces an older one is swapped with it in one
step on Linux (elsewhere the older one is moved aside first), then the older one is removed.
"""

import ctypes
import os
import re
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from medrecipes.errors import UserError

# A run's checkpoint folders in its output_dir, as the trainer names them.
CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
REPLACED = ".replaced"  # the older folder's name, beside the staged one, while it is replaced


def checkpoint_step(path: str) -> int | None:
    """The step of a `checkpoint-<step>` folder (a name or a path), else None."""
    match = CHECKPOINT.match(os.path.basename(os.path.normpath(path)))
    return int(match.group(1)) if match else None


def checkpoint_steps(output_dir: str) -> list[int]:
    """The steps of the `checkpoint-<step>` folders in `output_dir`, in order."""
    if not os.path.isdir(output_dir):
        return []
    return sorted(step for name in os.listdir(output_dir) if (step := checkpoint_step(name)) is not None)


def same_path(a: str, b: str) -> bool:
    """Whether two paths name the same file or folder (links and relative paths resolved)."""
    if os.path.exists(a) and os.path.exists(b):
        return os.path.samefile(a, b)
    return os.path.realpath(a) == os.path.realpath(b)


def holds_something(path: str) -> bool:
    """A file, or a folder with anything in it."""
    return os.path.isfile(path) or (os.path.isdir(path) and bool(os.listdir(path)))


def check_new_output(path: str, where: str, inputs: Iterable[str] = (), overwrite: bool = False) -> None:
    """Refuse, in one line, to write `path` over one of `inputs` (always) or over something that
    exists (unless `overwrite`, the command's --overwrite)."""
    for source in inputs:
        if same_path(path, source):
            raise UserError(f"{where}: {path} is also what this command reads; write to another path")
    if not overwrite and holds_something(path):
        raise UserError(f"{where}: {path} already exists; name a new path, or pass --overwrite to replace it")


def _exchange(a: str, b: str) -> bool:
    """Swap two paths in one step (Linux's renameat2 with RENAME_EXCHANGE); False where the C
    library or the filesystem cannot (then nothing moved)."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def publish(staged: str, final: str) -> None:
    """Rename the staged file or folder into place; readers see all of it or none. A folder that
    replaces another is swapped with it in one step where the system can, so that no moment
    exists without one of the two; elsewhere the old one is moved aside first."""
    if os.path.isdir(final) and not os.path.islink(final):
        if _exchange(staged, final):
            shutil.rmtree(staged, ignore_errors=True)  # now the old folder
            return
        replaced = staged + REPLACED
        os.rename(final, replaced)
        os.rename(staged, final)  # a kill before this leaves no `final`: `finish_publish` ends the move
        shutil.rmtree(replaced, ignore_errors=True)
    else:
        os.replace(staged, final)


def finish_publish(staged: str, final: str) -> bool:
    """Complete a `publish` that was killed between its two renames (where a folder cannot be
    swapped in one step): the staged result was whole before the first rename, so it goes into
    place and the older one is removed. True where there was such a publish to complete."""
    replaced = staged + REPLACED
    if not os.path.exists(replaced):
        return False
    if not os.path.exists(final) and os.path.isdir(staged):
        os.rename(staged, final)
    shutil.rmtree(replaced, ignore_errors=True)
    return True


@contextmanager
def staged(final: str, folder: bool) -> Iterator[str]:
    """A path beside `final` to write the result into; published to `final` when the block ends
    without an error, removed otherwise."""
    parent = os.path.dirname(os.path.abspath(final))
    os.makedirs(parent, exist_ok=True)
    path = os.path.join(parent, f".{os.path.basename(os.path.abspath(final))}.partial-{os.getpid()}")
    if folder:
        os.makedirs(path)
    try:
        yield path
    except BaseException:
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.exists(path):
            os.remove(path)
        raise
    publish(path, final)
