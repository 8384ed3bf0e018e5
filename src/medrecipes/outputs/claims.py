"""Every command's output claimed before the work: the name itself checked (length, parent, a
symlink there), never over the command's own input, never over anything this project did not
write, over an earlier result of ours only when the user says so; staging left by a killed
command removed; a lock that a second command on the same output meets; a training run's folder
locked for the life of the run."""

import atexit
import contextlib
import os
import tempfile
from collections.abc import Iterable

from medrecipes.errors import UserError
from medrecipes.locations import absent
from medrecipes.outputs.checkpoints import CHECKPOINT, FINAL
from medrecipes.outputs.records import (
    LOCK,
    MARKER,
    PROBE,
    STAGING,
    STAGING_EXTRA,
    beside,
    changed_since,
    discard,
    holds_something,
    not_written,
    staging_path,
    written_kind,
)

_HELD_LOCKS: dict[str, int] = {}  # folder -> the lock's descriptor, open for the life of the process


_MADE_FOR: dict[str, list[str]] = {}  # an output's lock -> the folders its claim made, removed if left empty


def check_writable(path: str, where: str, folder: bool = False) -> None:
    """`path` (a `folder` to write into, else a file) can be written: not a thing of the other
    kind (a file result would replace a folder the user made), and the nearest existing folder
    on its way is a folder (not a file) and takes a new file, tried for real (permissions, a
    read-only disk, root or not)."""
    if "://" in path:
        return
    if not path.strip():  # os.path.abspath would make it the working folder
        raise UserError(f"{where}: the path is empty; name a {'folder' if folder else 'file'} to write to")
    if path.strip() == "-":  # a file named '-' is what it would be
        raise UserError(
            f"{where}: '-' is standard output to many tools, and this writes a {'folder' if folder else 'file'}; "
            "give its path"
        )
    if os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path):  # /dev/null, a pipe
        raise UserError(f"{where}: {path} is {absent(path)}; name a {'folder' if folder else 'file'} to write to")
    if folder and os.path.isfile(path):
        raise UserError(f"{where}: {path} is a file; name a folder to write into")
    if not folder and os.path.isdir(path):
        raise UserError(f"{where}: {path} is a folder; name the file to write, in it or beside it")
    existing = os.path.abspath(path)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if existing != os.path.abspath(path) and not os.path.isdir(existing):
        raise UserError(f"{where}: cannot create {path}: {existing} is a file; name a path under a folder")
    folder = existing if os.path.isdir(existing) else os.path.dirname(existing)
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=PROBE)
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
    check_not_read(path, inputs, where)
    check_named_format(path, where, kind)
    if kind != "calibration":  # the one result saved with a model, a run's final/ included, by design
        check_run_names(path, where)
    if kind != "run":  # a run's folder is locked from inside (`lock_folder`), by its writing process
        lock = beside(path, LOCK)
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


def check_not_read(path: str, inputs: Iterable[str], where: str) -> None:
    """An output that is, contains or lies inside a local path the command reads (Hub ids and URLs
    are skipped): refused in one line."""
    for source in inputs:
        if source and "://" not in source and os.path.lexists(source) and (how := _relation(path, source)):
            what = "is also what" if how == "is" else f"{how} {source}, which"
            raise UserError(f"{where}: {path} {what} this command reads; write to another path")


def check_run_names(path: str, where: str, run: bool = False) -> None:
    """A new output may sit in a run's folder (an evaluation beside it), but not under the names the
    run writes itself, nor inside them: its final model, a checkpoint (a resume would take it for
    one) or staging; reached by a symbolic link too. A `run` put in a checkpoint is told how that
    run resumes, which is what it may have meant."""
    for inner in _path_and_above(os.path.realpath(path)):
        folder, name = os.path.split(inner)
        if (name in (FINAL, STAGING) or CHECKPOINT.match(name)) and written_kind(folder) == "run":
            kept = "final model" if name == FINAL else name
            at = "where" if inner == os.path.realpath(path) else "inside where"
            resumes = (
                f" (a run resumes from its checkpoints when its recipe is run again with output_dir {folder})"
                if run and CHECKPOINT.match(name)
                else ""
            )
            raise UserError(
                f"{where}: {path} is {at} the run in {folder} keeps its {kept}; write it elsewhere{resumes}"
            )


def _path_and_above(path: str):
    """`path` made absolute, then each folder above it up to the root's child."""
    inner = os.path.abspath(path)
    while inner != os.path.dirname(inner):
        yield inner
        inner = os.path.dirname(inner)


def _result_around(path: str) -> str | None:
    """The nearest folder above `path` that holds a result this project wrote, or None."""
    above = list(_path_and_above(path))[1:]
    return next((folder for folder in above if os.path.isdir(folder) and written_kind(folder)), None)


def _check_earlier_result(path: str, kind: str, where: str, overwrite: bool) -> None:
    if not holds_something(path):
        return
    found = written_kind(path)
    if found != kind:
        what = f"holds a '{found}' result" if found else "holds files that medrecipes did not write"
        if not found and (within := _result_around(path)):  # a run's final/ or checkpoint, an eval's folder...
            what = f"is part of the '{written_kind(within)}' result in {within}"
        raise UserError(
            f"{where}: {path} {what}; name a new path (nothing there is replaced, "
            f"--overwrite included: it replaces only an earlier '{kind}' result)"
        )
    if not overwrite:  # calibration.json's path is its model's: no other to name
        other = "" if kind == "calibration" else "name a new path, or "
        raise UserError(f"{where}: {path} already exists; {other}pass --overwrite to replace it")
    foreign = not_written(path) if os.path.isdir(path) else None
    if foreign is not None:
        raise UserError(
            f"{where}: {path} is an earlier '{kind}' result, but {foreign} in it was put there since; "
            "move that file out, or name a new path (--overwrite replaces only what medrecipes wrote)"
        )
    edited = changed_since(path) if os.path.isdir(path) else None
    if edited is not None:
        raise UserError(
            f"{where}: {path} is an earlier '{kind}' result, but {edited} in it was changed (or removed) since it "
            "was written; keep a copy of your edit elsewhere and remove it there, or name a new path "
            "(--overwrite replaces only what medrecipes wrote, as it wrote it)"
        )


# What a file's name says it holds, and the format each kind of file result is written in: a
# name that says another (eval's JSON as x.csv) is a file no reader of that name can read.
NAMED_FORMATS = {".json": "JSON", ".jsonl": "JSON Lines", ".csv": "CSV", ".tsv": "TSV", ".parquet": "Parquet",
                 ".arrow": "Arrow", ".yaml": "YAML", ".yml": "YAML", ".html": "HTML", ".htm": "HTML",
                 ".md": "Markdown", ".txt": "text", ".xlsx": "Excel", ".pdf": "PDF", ".png": "PNG"}  # fmt: skip
WRITTEN_AS = {"eval": (".json",), "calibration": (".json",), "perplexity": (".json",), "pairs": (".jsonl", ".json"),
              "pass-rate": (".jsonl", ".json")}  # fmt: skip


def check_named_format(path: str, where: str, kind: str) -> None:
    """One line where a file result's name says another format than the `kind` is written in
    (`WRITTEN_AS`); a name without a known suffix is the user's own choice."""
    suffix = os.path.splitext(path)[1].lower()
    written = WRITTEN_AS.get(kind)
    if written and suffix in NAMED_FORMATS and suffix not in written:
        raise UserError(
            f"{where}: {path} is named as {NAMED_FORMATS[suffix]}, and {kind} writes {NAMED_FORMATS[written[0]]}; "
            f"name it {os.path.splitext(os.path.basename(path))[0]}{written[0]}"
        )


def _check_name(path: str, where: str, kind: str) -> None:
    """The final path itself: no control character in it, a name the filesystem takes with our staging around it, and no
    symbolic link there (a result would replace the user's link; a run may write into a linked
    folder)."""
    if control := next((c for c in path if ord(c) < 32 or ord(c) == 127), None):  # a line break pasted in
        raise UserError(
            f"{where}: {path!r} holds a control character ({control!r}), which splits or hides the name in logs "
            "and shells; name it without"
        )
    folder, name = os.path.split(os.path.abspath(path))
    try:
        longest = os.pathconf(folder if os.path.isdir(folder) else "/", "PC_NAME_MAX")
    except (OSError, ValueError):
        longest = 255
    room = longest - max(STAGING_EXTRA, len(".") + len(MARKER))
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
    prefix, mine = os.path.basename(staging_path(path)), os.path.basename(staging_path(path, os.getpid()))
    for entry in os.listdir(head):
        # ".NAME.partial-PID", or its ".replaced" older folder of a publish cut short
        if entry.startswith(prefix) and entry != mine and entry.removeprefix(prefix).split(".")[0].isdigit():
            discard(os.path.join(head, entry))


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
    lock = beside(path, LOCK)
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
