"""Results written atomically, so that a kill leaves the old result or the new one, never a part.

A result is written beside its final path and renamed into place: one rename for a file
(`os.replace`) or a new folder; a folder that replaces an older one is swapped with it in one
step on Linux (elsewhere the older one is moved aside first), then the older one is removed. A
full disk is one line that says what was kept."""

import ctypes
import errno
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager

from medrecipes.errors import UserError, causes
from medrecipes.outputs.claims import release
from medrecipes.outputs.records import discard, mark, staging_path

REPLACED = ".replaced"  # the older folder's name, beside the staged one, while it is replaced


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


# Below this many free bytes, a write that failed without saying why (torch's writer reports
# "unexpected pos" or an iostream error, not ENOSPC) is taken to have failed for want of space.
LOW_SPACE = 64 * 2**20


def _existing(path: str) -> str:
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    return path or "."


def _free_bytes(path: str) -> int | None:
    try:
        return shutil.disk_usage(_existing(path)).free
    except OSError:
        return None


def _out_of_entries(path: str) -> bool:
    """The file system holding `path` has no file entries (inodes) left, whatever its free bytes:
    a new file fails with ENOSPC too. A file system without a fixed count reports none at all."""
    try:
        found = os.statvfs(_existing(path))
    except OSError:
        return False
    return found.f_files > 0 and found.f_favail == 0


def _quota(err: BaseException) -> bool:
    return any(getattr(seen, "errno", None) == errno.EDQUOT for seen in causes(err))


def _for_want_of_space(err: BaseException, free: int | None) -> bool:
    for seen in causes(err):  # the error, or one it was raised from or while handling
        if getattr(seen, "errno", None) in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(os.strerror(code) in str(seen) for code in (errno.ENOSPC, errno.EDQUOT)):  # a Rust library's
            return True
    return free is not None and free < LOW_SPACE


@contextmanager
def full_disk_is_one_line(path: str, what: str, partial: str | None = None, kept="nothing was replaced"):
    """A write of `what` under `path` that fails for want of space (the disk or the user's quota
    full) becomes one line that says so, what is `kept` (or what a callable `kept` says then: a run
    saves checkpoints as it goes) and how to go on, after removing the `partial` result, which would
    only hold the space; any other failure passes unchanged."""
    try:
        yield
    except UserError:
        raise  # a write inside that said it already (a checkpoint's save inside the training loop)
    except Exception as err:
        free = _free_bytes(path)
        # Python's writes raise OSError and torch's RuntimeError, which an almost full disk explains;
        # another error (tokenizers' plain Exception) only when it says the disk is full.
        writes = isinstance(err, OSError | RuntimeError)
        if not _for_want_of_space(err, free if writes else None):
            raise
        if partial is not None:
            discard(partial)
        left = f"{free / 2**20:.1f} MiB free" if free is not None else "no free space"
        if _out_of_entries(path):
            why, fix = f"the disk holding {path} has no file entries (inodes) left, with {left}", "Remove files there"
        elif _quota(err):
            why, fix = f"your quota on the disk holding {path} is used up ({left} on the disk)", "Free some of yours"
        else:
            why, fix = f"the disk holding {path} is full ({left})", "Free some space"
        kept = kept() if callable(kept) else kept
        raise UserError(
            f"{what}: cannot write it, {why}; {kept}. {fix} (old checkpoints, caches) or name an output on "
            "another disk, and run again"
        ) from None


@contextmanager
def staged(final: str, folder: bool, kind: str | None = None, about: str | None = None) -> Iterator[str]:
    """A path beside `final` to write the result into; published to `final` when the block ends
    without an error, removed otherwise. A `kind` marks the result as ours (`written_kind`), so
    that a later `claim_output` of that kind may replace it; `about` says how it was made."""
    parent = os.path.dirname(os.path.abspath(final))
    os.makedirs(parent, exist_ok=True)
    path = staging_path(final, os.getpid())
    try:
        with full_disk_is_one_line(parent, final):
            if folder:
                os.makedirs(path)
            yield path
    except BaseException:
        discard(path)
        release(final)
        raise
    if kind is not None and folder:
        mark(path, kind, about, whole=True)  # travels with the folder's rename
    publish(path, final)
    if kind is not None and not folder:
        mark(final, kind, about)
    release(final)
