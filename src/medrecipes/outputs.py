"""Where commands write: never over their own input, never over an earlier result unless the
user says so, and atomically, so that a kill leaves the old result or the new one, never a part.

A result is written beside its final path and renamed into place: one rename for a file
(`os.replace`), and for a folder one rename too, or two when it replaces an older folder (the
older one is moved aside first and removed after).
"""

import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from medrecipes.errors import UserError


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


def publish(staged: str, final: str) -> None:
    """Rename the staged file or folder into place; readers see all of it or none."""
    if os.path.isdir(final) and not os.path.islink(final):
        replaced = staged + ".replaced"
        os.rename(final, replaced)
        os.rename(staged, final)
        shutil.rmtree(replaced, ignore_errors=True)
    else:
        os.replace(staged, final)


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
