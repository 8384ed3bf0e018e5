"""Where commands write: never over their own input, never over anything this project did not
write, over an earlier result of ours only when the user says so, and atomically, so that a
kill leaves the old result or the new one, never a part. Every command and recipe script
claims its output with `claim_output` before it starts work; a training run also locks its
folder (`lock_folder`).

A result is written beside its final path and renamed into place: one rename for a file
(`os.replace`) or a new folder; a folder that replaces an older one is swapped with it in one
step on Linux (elsewhere the older one is moved aside first), then the older one is removed.
"""

import atexit
import contextlib
import ctypes
import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from medrecipes.errors import UserError

# A run's checkpoint folders in its output_dir, as the trainer names them.
CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
REPLACED = ".replaced"  # the older folder's name, beside the staged one, while it is replaced
MARKER = ".medrecipes.json"  # what wrote a result: inside a folder, `.<name>.medrecipes.json` beside a file
LOCK = ".medrecipes.lock"  # held by the process training in a run's folder
# Results written before the marker existed: a run's record.
EARLIER_MARKERS = {"run.json": "run"}
_HELD_LOCKS: dict[str, int] = {}  # folder -> the lock's descriptor, open for the life of the process
_MADE_FOR: dict[str, list[str]] = {}  # an output's lock -> the folders its claim made, removed if left empty


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


def same_path(a: str, b: str) -> bool:
    """Whether two paths name the same file or folder (links and relative paths resolved)."""
    if os.path.exists(a) and os.path.exists(b):
        return os.path.samefile(a, b)
    return os.path.realpath(a) == os.path.realpath(b)


def holds_something(path: str) -> bool:
    """A file, or a folder with anything in it but our lock and marker."""
    return os.path.isfile(path) or (os.path.isdir(path) and bool(set(os.listdir(path)) - {LOCK, MARKER}))


def _beside(path: str, suffix: str) -> str:
    """A hidden file beside `path`: ".NAME<suffix>"."""
    head, name = os.path.split(os.path.abspath(path))
    return os.path.join(head, f".{name}{suffix}")


def _record_path(path: str) -> str:
    """Where the record of what wrote `path` lies: inside a folder, beside a file."""
    return os.path.join(path, MARKER) if os.path.isdir(path) else _beside(path, MARKER)


def written_kind(path: str) -> str | None:
    """The kind of result ("run", "eval", "report", ...) this project wrote at `path`, or None
    for anything else: a file counts only while it is the very file written (same size and
    modification time as recorded), so a user's file put there since is not ours."""
    record = _record_path(path)
    if os.path.isdir(path) and not os.path.isfile(record):
        return next((kind for name, kind in EARLIER_MARKERS.items() if os.path.isfile(os.path.join(path, name))), None)
    try:
        with open(record, encoding="utf-8") as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict):
        return None
    if os.path.isfile(path):
        stat = os.stat(path)
        if (saved.get("size"), saved.get("mtime_ns")) != (stat.st_size, stat.st_mtime_ns):
            return None
    return saved.get("kind")


def written_about(path: str) -> str | None:
    """How this project made the result at `path` (a pairs file: from which questions, how the
    answers were drawn), while it is the very result written; None otherwise."""
    if written_kind(path) is None:
        return None
    try:
        with open(_record_path(path), encoding="utf-8") as f:
            return json.load(f).get("about")
    except OSError:  # a folder known by an earlier marker file has no record
        return None


def _files_in(folder: str) -> list[str]:
    """Every file under `folder`, as paths relative to it, but our marker and lock."""
    found = (os.path.relpath(os.path.join(d, n), folder) for d, _, names in os.walk(folder) for n in names)
    return sorted(f for f in found if f not in (MARKER, LOCK))


def _not_written(path: str) -> str | None:
    """A file inside our folder result at `path` that the result did not hold when it was
    written (a user's file put there since); None where there is none or nothing was recorded."""
    try:
        with open(_record_path(path), encoding="utf-8") as f:
            recorded = json.load(f).get("files")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(recorded, list):
        return None
    return next((f for f in _files_in(path) if f not in set(recorded)), None)


def mark(path: str, kind: str, about: str | None = None, whole: bool = False) -> None:
    """Record that this project wrote `path` as a result of `kind` (see `written_kind`), and
    optionally how it was made (`written_about`); a folder written `whole` (by `staged`, before it
    is published) records its files, so that a file put there since is known as not ours."""
    if os.path.isdir(path) and written_kind(path) == kind:
        return  # already marked: a run started again writes nothing
    record = {"kind": kind, "written_by": "medrecipes", **({"about": about} if about else {})}
    if os.path.isfile(path):
        stat = os.stat(path)
        record.update(size=stat.st_size, mtime_ns=stat.st_mtime_ns)
    elif os.path.isdir(path) and whole:
        record["files"] = _files_in(path)
    target = _record_path(path)
    with open(target + ".tmp", "w", encoding="utf-8") as f:
        json.dump(record, f)
    os.replace(target + ".tmp", target)


def check_writable(path: str, where: str, folder: bool = False) -> None:
    """`path` (a `folder` to write into, or either) can be written: the nearest existing folder
    on its way is a folder (not a file) and takes a new file, tried for real (permissions, a
    read-only disk, root or not)."""
    if "://" in path:
        return
    if folder and os.path.isfile(path):
        raise UserError(f"{where}: {path} is a file; name a folder to write into")
    existing = os.path.abspath(path)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if existing != os.path.abspath(path) and not os.path.isdir(existing):
        raise UserError(f"{where}: cannot create {path}: {existing} is a file; name a path under a folder")
    folder = existing if os.path.isdir(existing) else os.path.dirname(existing)
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".medrecipes-probe-")
    except OSError as err:
        raise UserError(
            f"{where}: cannot write {path}: {folder} is not writable ({err.strerror}); name a path you can write to"
        ) from None
    os.close(fd)
    os.remove(probe)


def _relation(output: str, source: str) -> str | None:
    out, src = os.path.realpath(output), os.path.realpath(source)
    if out == src:
        return "is"
    if src.startswith(out.rstrip(os.sep) + os.sep):
        return "contains"
    if out.startswith(src.rstrip(os.sep) + os.sep):
        return "lies inside"
    return None


def claim_output(
    path: str, kind: str, where: str, inputs: Iterable[str] = (), overwrite: bool = False, folder: bool = False
) -> None:
    """The one check before a command writes `path`, made before any long work so that a
    refusal costs nothing. Refused in one line: a path that cannot be written; one that is,
    contains or lies inside anything the command reads (`inputs`: recipe, model, data files
    and folders; Hub ids and URLs are skipped); one that holds anything but an earlier `kind`
    result of this project (`--overwrite` included: it replaces only our own result); and an
    earlier result of ours unless `overwrite` (a training run passes True and decides by its
    run record whether it resumes). A `folder` result may not replace a file. The final name is
    checked too (its length with our staging around it; no symbolic link there), and every result
    but a run's (locked from inside its folder) takes a lock beside it until it is in place, so
    that a second command on the same output is refused, and staging a killed command left there
    is removed; `--overwrite` of our folder result that holds a file it did not is refused."""
    if "://" in path:
        return
    check_writable(path, where, folder)
    _check_name(path, where, kind)
    for source in inputs:
        if source and "://" not in source and os.path.lexists(source) and (how := _relation(path, source)):
            what = "is also what" if how == "is" else f"{how} {source}, which"
            raise UserError(f"{where}: {path} {what} this command reads; write to another path")
    if kind != "run":  # a run's folder is locked from inside (`lock_folder`), by its writing process
        lock = _beside(path, LOCK)
        made = _make_folders(os.path.dirname(lock))
        try:
            _hold_lock(
                lock,
                f"{where}: another medrecipes command is writing {path}; wait for it to end, or name another path",
            )
        except UserError:
            _remove_empty(made)
            raise
        _MADE_FOR.setdefault(os.path.realpath(lock), made)  # a second claim of this process made none
        _remove_stale_staging(path)
    try:
        _check_earlier_result(path, kind, where, overwrite)
    except UserError:
        release(path)
        raise


def _check_earlier_result(path: str, kind: str, where: str, overwrite: bool) -> None:
    if not holds_something(path):
        return
    found = written_kind(path)
    if found != kind:
        what = f"a '{found}' result" if found else "files that medrecipes did not write"
        raise UserError(
            f"{where}: {path} holds {what}; name a new path (nothing there is replaced, "
            f"--overwrite included: it replaces only an earlier '{kind}' result)"
        )
    if not overwrite:
        raise UserError(f"{where}: {path} already exists; name a new path, or pass --overwrite to replace it")
    foreign = _not_written(path) if os.path.isdir(path) else None
    if foreign is not None:
        raise UserError(
            f"{where}: {path} is an earlier '{kind}' result, but {foreign} in it was put there since; "
            "move that file out, or name a new path (--overwrite replaces only what medrecipes wrote)"
        )


PARTIAL = ".partial-"  # a result being written beside its final path: ".NAME.partial-PID"
# What a staged result adds to its name (a process id of up to 7 digits), and the record beside a
# file, ".NAME.medrecipes.json".
_STAGING_EXTRA = len(".") + len(PARTIAL) + 7


def _staging(final: str, pid: int | str = "") -> str:
    """Where the process `pid` writes the result `final` before publishing it (without a pid, the
    prefix every such path shares)."""
    return _beside(final, f"{PARTIAL}{pid}")


def _check_name(path: str, where: str, kind: str) -> None:
    """The final path itself: a name the filesystem takes with our staging around it, and no
    symbolic link there (a result would replace the user's link; a run may write into a linked
    folder)."""
    folder, name = os.path.split(os.path.abspath(path))
    try:
        longest = os.pathconf(folder if os.path.isdir(folder) else "/", "PC_NAME_MAX")
    except (OSError, ValueError):
        longest = 255
    room = longest - max(_STAGING_EXTRA, len(".") + len(MARKER))
    if len(os.fsencode(name)) > room:
        raise UserError(
            f"{where}: the name {name[:40]}... is {len(os.fsencode(name))} bytes long; name it in at most {room}"
        )
    if os.path.islink(path) and not (kind == "run" and os.path.isdir(path)):
        target = os.readlink(path)
        broken = "" if os.path.exists(path) else " that leads nowhere (or round in a loop)"
        raise UserError(
            f"{where}: {path} is a symbolic link{broken} (to {target}); medrecipes does not replace a link: "
            "name the path it should write, or another path"
        )


def _remove_stale_staging(path: str) -> None:
    """Staging beside `path` left by a command that was killed while writing it (a kill -9 lets
    nothing clean up): once this process holds the output's lock, no other is writing there."""
    head = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(head):
        return
    prefix, mine = os.path.basename(_staging(path)), os.path.basename(_staging(path, os.getpid()))
    for entry in os.listdir(head):
        # ".NAME.partial-PID", or its ".replaced" older folder of a publish cut short
        if entry.startswith(prefix) and entry != mine and entry.removeprefix(prefix).split(".")[0].isdigit():
            _discard(os.path.join(head, entry))


def _hold_lock(lock: str, refusal: str) -> None:
    """Hold an advisory lock on the file `lock` for the rest of this process (or until
    `release`); a second process that asks is refused with `refusal`. The OS drops the lock when
    the process ends, however it ends (a kill -9 leaves nothing to clean up)."""
    import fcntl  # POSIX; the recipes run on Linux

    key = os.path.realpath(lock)
    if key in _HELD_LOCKS:
        return
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise UserError(refusal) from None
        try:
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)  # released and removed by its holder between our open and our lock: again
    _HELD_LOCKS[key] = fd


def release(path: str) -> None:
    """Let go of the lock `claim_output` took on the output `path` and remove its file, once the
    result is in place (or refused, or the process ends): in a process that goes on, such as a
    notebook or a test, another command may then write there, and a refused command leaves
    nothing behind."""
    lock = _beside(path, LOCK)
    fd = _HELD_LOCKS.pop(os.path.realpath(lock), None)
    if fd is not None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(lock)  # while still held: no other process holds this file
        os.close(fd)
        _remove_empty(_MADE_FOR.pop(os.path.realpath(lock), []))


def _make_folders(folder: str) -> list[str]:
    """Create `folder` and the folders above it that are missing; returns those made, outermost first."""
    missing = []
    while folder and not os.path.isdir(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    for made in reversed(missing):
        os.makedirs(made, exist_ok=True)
    return list(reversed(missing))


def _remove_empty(folders: list[str]) -> None:
    """Remove the folders a claim made, innermost first, where nothing was written into them."""
    for folder in reversed(folders):
        try:
            os.rmdir(folder)
        except OSError:
            return


@atexit.register
def release_all() -> None:
    """The output locks this process still holds (a command that stopped on an error), removed."""
    for lock in [lock for lock in _HELD_LOCKS if os.path.basename(lock) != LOCK]:
        head, name = os.path.split(lock)
        release(os.path.join(head, name[1 : -len(LOCK)]))


def lock_folder(path: str, where: str) -> None:
    """Hold the lock of the run folder `path` for the rest of this process: a second process
    training there is refused in one line."""
    _hold_lock(
        os.path.join(path, LOCK),
        f"{where}: another process is training in {path}; wait for it to end, or give this run its own output_dir",
    )


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


def _free_bytes(path: str) -> int | None:
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    try:
        return shutil.disk_usage(path or ".").free
    except OSError:
        return None


def _for_want_of_space(err: BaseException, free: int | None) -> bool:
    seen = err
    while seen is not None:  # the error, or one it was raised from or while handling
        if getattr(seen, "errno", None) in (errno.ENOSPC, errno.EDQUOT):
            return True
        seen = seen.__cause__ or seen.__context__
    return free is not None and free < LOW_SPACE


@contextmanager
def full_disk_is_one_line(path: str, what: str, partial: str | None = None, kept: str = "nothing was replaced"):
    """A write of `what` under `path` that fails for want of space (the disk or the user's quota
    full) becomes one line that says so, what is `kept` and how to go on, after removing the
    `partial` result, which would only hold the space; any other failure passes unchanged."""
    try:
        yield
    except (OSError, RuntimeError) as err:
        free = _free_bytes(path)
        if not _for_want_of_space(err, free):
            raise
        if partial is not None:
            _discard(partial)
        left = f"{free / 2**20:.1f} MiB free" if free is not None else "no free space"
        raise UserError(
            f"{what}: cannot write it, the disk holding {path} is full ({left}); {kept}. "
            "Free some space (old checkpoints, caches) or name an output on another disk, and run again"
        ) from None


def _discard(path: str) -> None:
    """Remove a partial result, a folder or a file, if it is there."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


@contextmanager
def staged(final: str, folder: bool, kind: str | None = None, about: str | None = None) -> Iterator[str]:
    """A path beside `final` to write the result into; published to `final` when the block ends
    without an error, removed otherwise. A `kind` marks the result as ours (`written_kind`), so
    that a later `claim_output` of that kind may replace it; `about` says how it was made."""
    parent = os.path.dirname(os.path.abspath(final))
    os.makedirs(parent, exist_ok=True)
    path = _staging(final, os.getpid())
    try:
        with full_disk_is_one_line(parent, final):
            if folder:
                os.makedirs(path)
            yield path
    except BaseException:
        _discard(path)
        release(final)
        raise
    if kind is not None and folder:
        mark(path, kind, about, whole=True)  # travels with the folder's rename
    publish(path, final)
    if kind is not None and not folder:
        mark(final, kind, about)
    release(final)
