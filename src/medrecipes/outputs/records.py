"""What wrote a result: the record (marker) written with each of our results, which says the command
that wrote it and, for a folder, the files it wrote; and the staging path a result is written at
before it is renamed into place."""

import json
import os
import shutil

MARKER = ".medrecipes.json"  # what wrote a result: inside a folder, `.<name>.medrecipes.json` beside a file
LOCK = ".medrecipes.lock"  # held by the process training in a run's folder
# `check_writable`'s file, there for an instant: every process of a launch checks output_dir while
# parsing its recipe, so the writing one can find another's probe in the folder it claims.
PROBE = ".medrecipes-probe-"


def ours_in_passing(name: str) -> bool:
    """A file name in a result's folder that is our bookkeeping, never a user's or the result's."""
    return name in (MARKER, LOCK) or name.startswith(PROBE)


# Results written before the marker existed: a run's record.
EARLIER_MARKERS = {"run.json": "run"}


def same_path(a: str, b: str) -> bool:
    """Whether two paths name the same file or folder (links and relative paths resolved)."""
    if os.path.exists(a) and os.path.exists(b):
        return os.path.samefile(a, b)
    return os.path.realpath(a) == os.path.realpath(b)


def holds_something(path: str) -> bool:
    """A file, or a folder with anything in it but our lock, marker and probes."""
    return os.path.isfile(path) or (os.path.isdir(path) and not all(map(ours_in_passing, os.listdir(path))))


def beside(path: str, suffix: str) -> str:
    """A hidden file beside `path`: ".NAME<suffix>"."""
    head, name = os.path.split(os.path.abspath(path))
    return os.path.join(head, f".{name}{suffix}")


def _record_path(path: str) -> str:
    """Where the record of what wrote `path` lies: inside a folder, beside a file."""
    return os.path.join(path, MARKER) if os.path.isdir(path) else beside(path, MARKER)


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
    """Every file under `folder`, as paths relative to it, but our marker, lock and probes."""
    found = (os.path.relpath(os.path.join(d, n), folder) for d, _, names in os.walk(folder) for n in names)
    return sorted(f for f in found if not ours_in_passing(f))


def _recorded(path: str, key: str):
    """What the record of our result at `path` holds under `key`, or None."""
    try:
        with open(_record_path(path), encoding="utf-8") as f:
            return json.load(f).get(key)
    except (OSError, ValueError, AttributeError):
        return None


def not_written(path: str) -> str | None:
    """A file inside our folder result at `path` that the result did not hold when it was
    written (a user's file put there since); None where there is none or nothing was recorded."""
    recorded = _recorded(path, "files")
    if not isinstance(recorded, list):
        return None
    foreign = [f for f in _files_in(path) if f not in set(recorded)]
    shown = [f for f in foreign if not os.path.basename(f).endswith(MARKER)]  # a marker's file, not the marker
    return (shown or foreign or [None])[0]


def changed_since(path: str) -> str | None:
    """A file of our folder result at `path` that is no longer as written (its size or modification
    time differ from the record: a person edited it, e.g. a model card's README.md), or one it
    wrote that is gone; None where all are as written or nothing was recorded."""
    recorded = _recorded(path, "stats")
    if not isinstance(recorded, dict):
        return None
    for name, saved in sorted(recorded.items()):
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            return name
        stat = os.stat(file)
        if [stat.st_size, stat.st_mtime_ns] != saved:
            return name
    return None


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
        stats = {name: os.stat(os.path.join(path, name)) for name in record["files"]}
        record["stats"] = {name: [stat.st_size, stat.st_mtime_ns] for name, stat in stats.items()}
    target = _record_path(path)
    with open(target + ".tmp", "w", encoding="utf-8") as f:
        json.dump(record, f)
    os.replace(target + ".tmp", target)


PARTIAL = ".partial-"  # a result being written beside its final path: ".NAME.partial-PID"
# Where a training run stages its checkpoints and final model: output_dir/_staging/<name>, then
# renamed into place (`writes.publish`). The same scheme as a result beside its final path, in a
# folder every process of a launch can name (each writes its shards there, and a process id is
# not shared); the leading underscore keeps HF's push of output_dir off it.
STAGING = "_staging"


# What a staged result adds to its name (a process id of up to 7 digits), and the record beside a
# file, ".NAME.medrecipes.json".
STAGING_EXTRA = len(".") + len(PARTIAL) + 7


def staging_path(final: str, pid: int | str = "") -> str:
    """Where the process `pid` writes the result `final` before publishing it (without a pid, the
    prefix every such path shares)."""
    return beside(final, f"{PARTIAL}{pid}")


def discard(path: str) -> None:
    """Remove a partial result, a folder or a file, if it is there."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)
