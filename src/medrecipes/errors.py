"""The one exception type for mistakes a user can fix.

A `UserError` carries a single line that names the file, key or row, what is wrong and
what to do. The recipe scripts and the `medrecipes` command print it and exit with code 2,
without a traceback; anything else is a bug and keeps its traceback.
"""

import codecs
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from difflib import get_close_matches
from functools import wraps


class UserError(Exception):
    """A mistake in a recipe, a command line or an input file, explained in one line."""


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest valid names, or '' when none is close."""
    close = get_close_matches(name, list(choices), n=3, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(f"'{c}'" for c in close) + "?)"


def check_choice(value: str, choices: Sequence[str], where: str) -> None:
    """Raise the one-line error for a setting (`where`: "file: key") whose value is not one of
    `choices`, with the closest names and the valid ones."""
    if value not in choices:
        valid = " or ".join(choices) if len(choices) == 2 else ", ".join(choices)
        raise UserError(f"{where} '{value}' is unknown{did_you_mean(value, choices)}; use {valid}")


def check_output_folder(path: str, where: str) -> None:
    """A folder a run will write into (made if need be) must not be, or be inside, an existing
    file (a URL is not checked here)."""
    if "://" in path:
        return
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        file = path if existing == os.path.abspath(path) else existing
        raise UserError(f"{where}: {file} is a file; name a folder to write into")


def unreadable(where: str, err: BaseException) -> UserError:
    """The one line for a data file that `datasets` could not parse (a DatasetGenerationError,
    whose cause says what and where)."""
    if isinstance(err.__cause__ or err, UnicodeDecodeError):
        return not_utf8(where, err.__cause__ or err)
    cause = str(err.__cause__ or err).splitlines()[0]
    return UserError(f"{where}: cannot read it ({cause}); fix or drop the bad rows")


def first_to_report() -> bool:
    """Whether this process prints the user error it found: under torchrun (and so `accelerate
    launch`), only the first rank of a node to find one, so that an error every rank finds, such
    as a recipe's typo, is printed once and not once per rank. The ranks of a node share the folder
    of their launch attempt (the parent of each rank's TORCHELASTIC_ERROR_FILE folder, removed by
    the launcher when it ends); the first to create a marker there reports. Any other process
    reports its own error."""
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not error_file:
        return True
    marker = os.path.join(os.path.dirname(os.path.dirname(error_file)), "medrecipes-user-error")
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    except OSError:  # no shared folder after all: better twice than not at all
        return True
    return True


def not_utf8(where: str, err: UnicodeDecodeError) -> UserError:
    """The one line for a text file that is not UTF-8."""
    return UserError(f"{where}: not UTF-8 text ({err.reason} at byte {err.start}); save it as UTF-8")


TEXT_SUFFIXES = (".json", ".jsonl", ".csv", ".txt")


def check_text_file(path: str, where: str | None = None, decode: bool = True) -> None:
    """A local data file that is empty or, for a text format, not UTF-8 (checked when `decode`):
    one line, where a reader would fail on its first row, or (pyarrow keeps the bytes as they
    come) only when a row is used."""
    if not os.path.isfile(path):
        return
    where = f"{where}: {path}" if where else path
    if os.path.getsize(path) == 0:
        raise UserError(f"{where}: the file is empty; give a file with rows")
    if not decode or not path.endswith(TEXT_SUFFIXES):
        return
    decoder, offset = codecs.getincrementaldecoder("utf-8")(), 0
    try:
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                decoder.decode(block)
                offset += len(block)
        decoder.decode(b"", final=True)
    except UnicodeDecodeError as err:
        err.start += offset  # from the start of the file, not of the block
        raise not_utf8(where, err) from None


def exit_on_user_error(main: Callable) -> Callable:
    """Run `main`; turn a UserError into its one line on stderr (once per launch, see
    first_to_report) and exit code 2."""

    @wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except UserError as err:
            if first_to_report():
                print(f"error: {err}", file=sys.stderr)
            sys.exit(2)

    return wrapper
