"""The one exception type for mistakes a user can fix.

A `UserError` carries a single line that names the file, key or row, what is wrong and
what to do. The recipe scripts and the `medrecipes` command print it and exit with code 2,
without a traceback; anything else is a bug and keeps its traceback.
"""

import codecs
import contextlib
import csv
import itertools
import json
import logging
import math
import os
import re
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
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


def quoted(value, width: int = 40) -> str:
    """A value as a message shows it: its JSON, cut at `width` characters with "..." where longer (cut
    bare, a text would end in an open quote and read as the whole value)."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= width else text[:width].rstrip() + "..."


def is_number(value) -> bool:
    """A number as JSON and YAML give one, true and false excluded (Python counts them as ints)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def typed(number: float) -> str:
    """A bound as a user would type it: a whole one in full (1048576, not 1.04858e+06), others as %g."""
    return str(int(number)) if float(number).is_integer() and abs(number) < 2**63 else f"{number:g}"


def check_choice(value: str, choices: Sequence[str], where: str) -> None:
    """Raise the one-line error for a setting (`where`: "file: key") whose value is not one of
    `choices`, with the closest names and the valid ones."""
    if value not in choices:
        valid = " or ".join(choices) if len(choices) == 2 else ", ".join(choices)
        raise UserError(f"{where} '{value}' is unknown{did_you_mean(value, choices)}; use {valid}")


def unreadable(where: str, err: BaseException, files: Iterable[str] = ()) -> UserError:
    """The one line for data that `datasets` could not parse (a DatasetGenerationError, whose
    cause says what, or pyarrow's error from a stream): the first line of `files` that is not
    JSON where there is one (pyarrow counts its "row" within a block of the file), else the
    cause."""
    if isinstance(err.__cause__ or err, UnicodeDecodeError):
        return not_utf8(where, err.__cause__ or err)
    bad = bad_line(files)
    if bad:
        return bad
    found, wanted = (getattr(err.__cause__, name, None) for name in ("table_column_names", "requested_column_names"))
    if found and wanted:  # datasets' CastError: a file whose columns are not the first file's
        other = sorted(set(found) ^ set(wanted))
        return UserError(
            f"{where}: its files do not share their columns (one has {', '.join(sorted(wanted))}, another differs "
            f"in {', '.join(other)}); give files of one layout, or name each file as its own source"
        )
    cause = str(err.__cause__ or err).splitlines()[0]
    return UserError(f"{where}: cannot read it ({cause}); fix or drop the bad rows")


def bad_line(files: Iterable[str]) -> UserError | None:
    """The one line for the first record of `files` (in order) that does not parse (a JSON
    Lines record that is not a JSON object, a CSV row of another width than its header) or Parquet
    file that does not read, or None where every JSON, JSON Lines, CSV and Parquet file among them does."""
    for path in files:
        if path.lower().endswith(".parquet") and os.path.isfile(path) and (whole := _not_parquet(path)):
            return UserError(whole)  # no line to drop: the file as a whole
        if bad := first_bad_line(path):
            return UserError(bad if bad.endswith(DOCUMENT_FIX) else f"{bad}; fix or drop that line")
    return None


# The fix of a JSON document that does not parse: its lines are not records, to drop.
DOCUMENT_FIX = "fix the document there (a comma missing at the end of a line is named on the next)"


@contextmanager
def bad_lines_named(files: Iterable[str]) -> Iterator[None]:
    """Around code that reads `files` with `datasets`, lazily (a stream) or not: a parse error
    (pyarrow's ArrowInvalid, or pandas' ValueError) becomes the one line naming the first bad
    line of the files; any other error passes unchanged."""
    try:
        yield
    except ValueError as err:
        bad = bad_line(files)
        if bad is None:
            raise
        raise bad from err


def _not_parquet(path: str) -> str | None:
    """'FILE: what it is instead' for a .parquet file whose footer pyarrow cannot read (a copy cut
    short, or text under the suffix); None where it reads."""
    import pyarrow
    import pyarrow.parquet

    try:
        pyarrow.parquet.ParquetFile(path).close()
    except (pyarrow.ArrowException, OSError) as err:
        with open(path, "rb") as handle:
            start = handle.read(64).lstrip()
        if start[:1] in (b"{", b"["):
            return f"{path}: holds JSON, not Parquet; name it .jsonl (or .json) for what it is"
        why = str(err).splitlines()[0] if str(err) else type(err).__name__
        return f"{path}: not a whole Parquet file ({why}); write or copy it again (a copy cut short loses its footer)"
    return None


def first_bad_line(path: str) -> str | None:
    """'FILE line N: what is wrong' for the first record of a JSON Lines or CSV file (or a JSON
    document) that does not parse; None where all do."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in (".jsonl", ".json", ".csv") or not os.path.isfile(path):
        return None
    if suffix == ".csv":
        return _first_ragged_row(path)
    with open(path, encoding="utf-8", errors="replace") as handle:
        start = handle.read(4096).lstrip()
        handle.seek(0)
        # One JSON document: a list, or an object over several lines (PubMedQA's, keyed by id) whose
        # first line is no JSON object of its own, as a JSON Lines record's is. Where it breaks.
        first = next((line for line in handle if line.strip()), "")
        if start.startswith("[") or (suffix == ".json" and start.startswith("{") and not _parses(first)):
            handle.seek(0)
            text = handle.read()
            try:
                document = json.loads(text, parse_int=_bounded_int, parse_float=_finite_float)
            except json.JSONDecodeError as err:
                return f"{path} line {err.lineno}: not JSON ({_where_in_line(err)}); {DOCUMENT_FIX}"
            except _TooBig as err:
                return f"{path} line {text.count(chr(10), 0, text.find(str(err))) + 1}: {_too_big(err)}"
            return _first_element_not_object(path, text) if isinstance(document, list) else None
        handle.seek(0)
        for number, line in enumerate(handle, 1):  # line by line: a corpus may not fit in memory
            if not line.strip():
                continue
            try:
                value = json.loads(line.rstrip("\r\n"), object_pairs_hook=_one_of_each_key, parse_int=_bounded_int,
                                   parse_float=_finite_float)  # fmt: skip
            except json.JSONDecodeError as err:
                return f"{path} line {number}: not JSON ({_where_in_line(err)})"
            except _TooBig as err:
                return f"{path} line {number}: {_too_big(err)}"
            except _RepeatedKey as err:
                return f"{path} line {number}: a key '{err}' appears twice in its object (pyarrow refuses it)"
            if not isinstance(value, dict):
                return f"{path} line {number}: a JSON {type(value).__name__}, not an object with named fields"
    return None


def _where_in_line(err: json.JSONDecodeError) -> str:
    """json's words and the column: "Unterminated string starting at column 10" (its own words of
    some errors end in "at", their position cut off)."""
    return f"{err.msg.removesuffix(' at')} at column {err.colno}"


class _TooBig(ValueError):
    """A JSON number no reader stores: a whole number beyond 64 bits, or one beyond a double's range."""


def _bounded_int(text: str) -> int:
    if not -(2**63) <= (value := int(text)) < 2**64:
        raise _TooBig(text)
    return value


def _finite_float(text: str) -> float:
    if math.isinf(value := float(text)):
        raise _TooBig(text)
    return value


def _too_big(err: _TooBig) -> str:
    shown = str(err) if len(str(err)) <= 24 else f"{str(err)[:20]}..."
    return f"the number {shown} is beyond what pyarrow stores in 64 bits (write it in quotes, as text)"


class _RepeatedKey(ValueError):
    """A key written twice in one JSON object (Python keeps the last, pyarrow refuses the row)."""


def _one_of_each_key(pairs: list) -> dict:
    keys = [key for key, _ in pairs]
    if repeated := next((key for key in keys if keys.count(key) > 1), None):
        raise _RepeatedKey(repeated)
    return dict(pairs)


def _first_element_not_object(path: str, text: str) -> str | None:
    """'FILE line N: ...' for the first element of a JSON array document that is not an object or
    repeats a key (pyarrow names it by its place in a block, from 0), found by decoding one element
    at a time; None where the document is not an array or all its elements are whole objects."""
    decoder = json.JSONDecoder(object_pairs_hook=_one_of_each_key)
    at = text.index("[") + 1
    count = 0
    while True:
        while at < len(text) and text[at] in " \t\r\n,":
            at += 1
        if at >= len(text) or text[at] == "]":
            return None
        line = text.count("\n", 0, at) + 1
        try:
            value, end = decoder.raw_decode(text, at)
        except _RepeatedKey as err:
            return (
                f"{path} line {line}: a key '{err}' appears twice in the object that starts there (pyarrow refuses it)"
            )
        count += 1
        if not isinstance(value, dict):
            return (
                f"{path} line {line}: element {count} of its array is a JSON {type(value).__name__}, not an object "
                "with named fields"
            )
        at = end


def first_to_report(what: str = "user-error") -> bool:
    """Whether this process prints the user error it found (or the line named `what`): under
    torchrun (and so `accelerate launch`), only the first rank of a node to find one, so that an
    error every rank finds, such as a recipe's typo, is printed once and not once per rank. The
    ranks of a node share the folder of their launch attempt (the parent of each rank's
    TORCHELASTIC_ERROR_FILE folder, removed by the launcher when it ends); the first to create a
    marker there reports. Any other process reports its own."""
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not error_file:
        return True
    marker = os.path.join(os.path.dirname(os.path.dirname(error_file)), f"medrecipes-{what}")
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    except OSError:  # no shared folder after all: better twice than not at all
        return True
    return True


def not_utf8(where: str, err: UnicodeDecodeError, path: str | None = None) -> UserError:
    """The one line for a text file that is not UTF-8: the byte's line as an editor counts it where
    `path` is the file `err.start` counts from."""
    at = f"byte {err.start}"
    if path is not None:
        with open(path, "rb") as f:
            line = f.read(err.start).count(b"\n") + 1
        at = f"line {line}, {at}"
    return UserError(f"{where}: not UTF-8 text ({err.reason} at {at}); save it as UTF-8")


TEXT_SUFFIXES = (".json", ".jsonl", ".csv", ".txt")


def check_text_file(path: str, where: str | None = None, decode: bool = True, header: bool = True) -> None:
    """A local data file that is empty or, for a text format, blank or not UTF-8 (checked when `decode`),
    nested too deep (JSON), written with another separator or, where its first line is a `header`,
    naming a column twice (CSV): one line, where a reader would fail on its first row, or (pyarrow
    keeps the bytes as they come) only when a row is used."""
    if not os.path.isfile(path):
        return
    where = f"{where}: {path}" if where else path
    if os.path.getsize(path) == 0:
        raise UserError(f"{where}: the file is empty; give a file with rows")
    if path.lower().endswith(".parquet") and _parquet_rows(path) == 0:  # datasets fails on it with a batch size of 0
        raise UserError(f"{where}: the Parquet file holds no rows; give a file with rows")
    if not decode or not path.endswith(TEXT_SUFFIXES):
        return
    decoder, offset, blank = codecs.getincrementaldecoder("utf-8")(), 0, True
    json_lines = path.lower().endswith((".jsonl", ".json"))
    line, brackets, many = 1, 0, []  # the line being read, its opening brackets, the lines with many
    glued = []  # the lines where one object may end and another start ("}{")
    try:
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                text = decoder.decode(block)  # every block: a bad byte anywhere is found here
                blank = blank and not text.strip()
                offset += len(block)
                if json_lines:  # in the same pass: a corpus is read once
                    glued += [line + text.count("\n", 0, m.start()) for m in GLUED.finditer(text)]
                    line, brackets = _count_brackets(text, line, brackets, many)
        decoder.decode(b"", final=True)
    except UnicodeDecodeError as err:
        err.start += offset  # from the start of the file, not of the block
        raise not_utf8(where, err, path) from None
    if blank:  # `datasets` reads no row from it and fails on the empty split it makes
        raise UserError(f"{where}: the file holds only blank lines and spaces; give a file with rows")
    if brackets > MANY_BRACKETS:
        many.append(line)
    if many and (deep := _first_line_with(path, many, "deep")):
        raise UserError(
            f"{where} line {deep}: its JSON nests arrays or objects deeper than a reader follows (pyarrow stops, or "
            "crashes); flatten it, or drop the row"
        )
    if glued and path.lower().endswith(".jsonl") and (twice := _first_line_with(path, glued, "more")):
        raise UserError(
            f"{where} line {twice}: holds more than one JSON object, and JSON Lines takes one a line (each would be "
            "a row, and every row after it would be counted a line off); put each on a line of its own"
        )
    if path.lower().endswith(".csv") and (separator := _other_separator(path)):
        raise UserError(
            f"{where}: its fields are separated by {separator!r}, and a .csv is read with commas (every line "
            "would be one cell); save it with commas, or as JSON Lines"
        )
    if header and path.lower().endswith(".csv"):
        check_csv_header(path, where)


def _parquet_rows(path: str) -> int | None:
    """The rows a Parquet file's footer counts; None where it has none to read (the reader names that)."""
    import pyarrow.parquet as pq

    try:
        return pq.read_metadata(path).num_rows
    except (OSError, ValueError):
        return None


# Opening brackets past which a JSON line is parsed to see whether it nests too deep to be read.
MANY_BRACKETS = 500


def _count_brackets(text: str, line: int, brackets: int, many: list[int]) -> tuple[int, int]:
    """The opening brackets of each line of `text`, a piece of a file read from `line` with
    `brackets` counted so far on it: the lines with over MANY_BRACKETS go to `many`; returns the
    line the piece ends in and its count so far."""
    *ended, rest = text.split("\n")
    for part in ended:
        if brackets + part.count("[") + part.count("{") > MANY_BRACKETS:
            many.append(line)
        line, brackets = line + 1, 0
    return line, brackets + rest.count("[") + rest.count("{")


# One JSON object closed and another opened on the same line.
GLUED = re.compile(r"\}[ \t]*\{")


def _json_trouble(line: str) -> str | None:
    """What keeps one JSON Lines line from being one row as a reader takes it: "deep" (nested past
    what Python's parser follows: a RecursionError there, and pyarrow's reader fails on it in a
    traceback, or in the process itself deeper down), "more" (a whole JSON value and more after it,
    json's "Extra data"; a "}{" inside a string is none), else None (fine, or not JSON: the reader
    names that)."""
    try:
        json.loads(line)
    except RecursionError:
        return "deep"
    except json.JSONDecodeError as err:
        return "more" if err.msg == "Extra data" else None
    except ValueError:
        return None
    return None


def _first_line_with(path: str, lines: list[int], trouble: str) -> int | None:
    """The first of `lines` (a JSON Lines file's, by number) with `trouble` (`_json_trouble`)."""
    wanted, last = set(lines), max(lines)
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, 1):
            if number in wanted and _json_trouble(line) == trouble:
                return number
            if number >= last:
                break
    return None


def check_csv_header(path: str, where: str | None = None) -> None:
    """A CSV header that names a column twice: the reader (pandas) keeps the second as 'NAME.1',
    which nothing reads. One line naming `where` (by default the file) and the line."""
    with open(path, encoding="utf-8", errors="replace", newline="") as handle:
        header = [cell.strip() for cell in next(csv.reader(handle), [])]
    if twice := next((name for i, name in enumerate(header) if name and name in header[:i]), None):
        raise UserError(
            f"{where or path} line 1: the header names column '{twice}' twice, and only one "
            "is read under that name; name each column once"
        )


def _other_separator(path: str) -> str | None:
    """The separator of a CSV file written with another than the comma (a spreadsheet set to a
    locale whose decimal mark is the comma writes ';'): its first line has none of it and
    `csv.Sniffer` finds another in its first lines; None otherwise."""
    with open(path, encoding="utf-8", newline="") as handle:
        sample = handle.read(1 << 14)
    first = sample.split("\n", 1)[0]
    if "," in first:
        return None
    try:
        found = csv.Sniffer().sniff(sample, delimiters=";\t|").delimiter
    except csv.Error:  # one column, or nothing it can tell apart
        return None
    return found if found in first else None


def _parses(line: str) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def _first_ragged_row(path: str, strict: bool = True) -> str | None:
    """The first row of another width than the header, or the line a quote that never closes opens
    on (pandas counts its "row" from 0, the header included). Strict reading stops at the end of the
    data inside a quote, and at other quoting pandas takes: those files are read again leniently."""
    with open(path, encoding="utf-8", errors="replace", newline="") as handle:
        reader = csv.reader(handle, strict=strict)
        try:
            width, start = len(next(reader, [])), reader.line_num + 1
            for row in reader:
                if row and len(row) != width:
                    return f"{path} line {start}: {len(row)} cells where the header has {width}"
                start = reader.line_num + 1
        except csv.Error as err:
            if "unexpected end of data" in str(err):
                return f"{path} line {start}: a quote opened on this line is never closed"
            return _first_ragged_row(path, strict=False)
    return None


def merged_csv_rows(path: str, limit: int = 100_000) -> str | None:
    """Where a CSV's quote left open on one line closes on a later one, so that the rows between
    were read as the text of one cell: a quoted cell spanning lines one of whose later lines reads
    as a row of its own, of the header's width with a number wherever every other row has one, and
    in a column of numbers no two rows share (an id), one no other row has: a row would be missing
    (a line of a note that holds a comma, or numbers its points 1, 2, ... as the rows are, has no
    such shape). 'FILE line N: ...' for the first, else None; a file without a column of numbers
    gives no shape to tell them by."""
    if not path.lower().endswith(".csv") or not os.path.isfile(path):
        return None
    spanning = []  # (first line, last line, cells) of the rows over several lines: few, kept
    with open(path, encoding="utf-8", errors="replace", newline="") as handle:
        reader = csv.reader(handle)
        try:
            width, start = len(next(reader, [])), reader.line_num + 1
            numbers, single = None, []  # the columns every one-line row has a number in; those rows' values
            for row in itertools.islice(reader, limit):
                if reader.line_num > start:
                    spanning.append((start, reader.line_num, row))
                elif len(row) == width:
                    numbers = {
                        j for j in (range(width) if numbers is None else numbers) if _number(row[j]) is not None
                    }
                    single.append(row)
                start = reader.line_num + 1
        except csv.Error:  # a file the other checks name
            return None
    if width < 2 or not single or not numbers:
        return None
    taken = {j: [_number(row[j]) for row in single] for j in numbers}
    ids = {j: set(values) for j, values in taken.items() if len(set(values)) == len(values)}
    for first, last, row in spanning:
        for line in (line for cell in row for line in cell.splitlines()[1:]):
            cells = next(csv.reader([line]), [])
            if (
                len(cells) == width
                and all(_number(cells[j]) is not None for j in numbers)
                and not any(_number(cells[j]) in values for j, values in ids.items())
            ):
                return (
                    f"{path} line {first}: a quote opened on this line closes on line {last}, so the lines between, "
                    "some of which read as rows of their own, are text of this row's cell; if they are rows, close "
                    'the quote on its line (a quote inside a cell is written "")'
                )
    return None


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _record_lines(path: str, header: bool) -> Iterator[int] | None:
    """The line each record of a line-based data file starts on (JSON Lines: blank lines
    skipped; CSV: the header skipped, a quoted line break counted), or None for a file whose
    records are not lines (Parquet, a JSON document) or that cannot be read."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in (".jsonl", ".json", ".csv") or not os.path.isfile(path):
        return None
    if suffix == ".json":
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                json.load(handle)
            return None  # one JSON document: its records are not lines
        except ValueError:
            pass  # JSON Lines under a .json name
    return _csv_record_lines(path, header) if suffix == ".csv" else _json_record_lines(path)


def _json_record_lines(path: str) -> Iterator[int]:
    with open(path, encoding="utf-8", errors="replace") as handle:
        yield from (number for number, line in enumerate(handle, 1) if line.strip())


def _csv_record_lines(path: str, header: bool) -> Iterator[int]:
    with open(path, encoding="utf-8", errors="replace", newline="") as handle:
        reader = csv.reader(handle)
        start = 1
        for index, _ in enumerate(reader):
            if index or not header:
                yield start
            start = reader.line_num + 1


def row_in_files(files: Sequence[str], index: int, header: bool = True, name: str | None = None) -> str:
    """How a message points at a record of a source: `index` counts records from 0 across
    `files` in order (as `datasets` reads them); the answer is the file and its line number for
    JSON Lines and CSV (the number an editor shows), else `name` (by default the one file) and
    the record number from 1."""
    seen = 0
    for path in files:
        lines = _record_lines(path, header)
        if lines is None:
            break
        for line in lines:
            if seen == index:
                return f"{path} line {line}"
            seen += 1
    return f"{name or (files[0] if len(files) == 1 else 'the source')} row {index + 1}"


# What the line at Ctrl-C says was kept; a training run sets its own (run_folder).
_interrupt_note: list[Callable[[], str]] = [
    lambda: "nothing half-written was kept (results are written whole or not at all); run the command again"
]


_refusal_cleanups: list[Callable[[], None]] = []


def on_refusal(cleanup: Callable[[], None]) -> None:
    """Run `cleanup` before a refusal's exit: it removes what the refused start made and nothing
    of the user's (a new run folder holding only its record)."""
    _refusal_cleanups.append(cleanup)


def on_interrupt(note: Callable[[], str]) -> None:
    """Say, at Ctrl-C, what was saved and how to go on (`note()` is asked then, not now)."""
    _interrupt_note.append(note)


def _say(line: str) -> None:
    """`line` and its newline in one write: unbuffered (PYTHONUNBUFFERED, as launchers set it), print's
    two writes let another process's output land between them, mid-line."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


class _LevelFirst(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"{record.levelname.lower()}: {super().format(record)}"


def mark_unconfigured_warnings() -> None:
    """A warning logged before logging is set up (a recipe's parse) or where none is (a command
    such as generate) is marked `warning:` beside the `error:` lines: Python's handler of last
    resort prints the bare message."""
    logging.lastResort = logging.StreamHandler(sys.stderr)
    logging.lastResort.setFormatter(_LevelFirst())
    logging.lastResort.setLevel(logging.WARNING)


def exit_on_user_error(main: Callable) -> Callable:
    """Run `main`; turn a UserError into its one line on stderr (once per launch, see
    first_to_report) and exit code 2, and Ctrl-C into one line that says what was kept and how to
    resume, and exit code 130 (the shell's for an interrupt); output's reader gone (`| head`) ends it
    quietly."""

    @wraps(main)
    def wrapper(*args, **kwargs):
        mark_unconfigured_warnings()
        for stream in (sys.stdout, sys.stderr):  # a name or an answer its encoding lacks, escaped, not a traceback
            if callable(getattr(stream, "reconfigure", None)):
                stream.reconfigure(errors="backslashreplace")
        try:
            if sys.stdout is None:  # started with its standard output closed (>&-): print writes nowhere
                raise UserError(
                    "standard output is closed, so what this command prints would be lost without a word; "
                    "redirect it to a file (> out.txt) or to /dev/null instead"
                )
            return main(*args, **kwargs)
        except UserError as err:
            _report(err)
        except BrokenPipeError:  # the reader of our output went away (`| head`): it has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush writes nowhere
            sys.exit(141)  # as a shell reports a process a closed pipe ended (128 + SIGPIPE)
        except (KeyboardInterrupt, Exception) as err:
            if (line := environment_error(err)) is not None:
                _report(line)
            if not _interrupted(err):
                raise
            if first_to_report():  # on a line of its own: a progress bar may have been cut mid-line
                _say(f"\ninterrupted: {_interrupt_note[-1]()}")
            _exit_within(EXIT_GRACE_SECONDS, 130)
            sys.exit(130)

    return wrapper


def _report(err: UserError) -> None:
    """The one line on stderr (once per launch, see first_to_report) and exit code 2."""
    if first_to_report():  # on a line of its own where a progress bar left its line open
        one = str(err).replace("\r", "\\r").replace("\n", "\\n")  # a name's line break, as \n
        _say(f"{chr(10) if _bar_open() else ''}error: {one}")
    for cleanup in _refusal_cleanups:
        with contextlib.suppress(OSError):
            cleanup()
    sys.exit(2)


# The environment's folders for the libraries' caches and temporary files, by the names' own
# convention (HF_HOME, XDG_CACHE_HOME, HF_DATASETS_CACHE, TRITON_CACHE_DIR, TMPDIR): a library
# makes them, or a folder in them, when it first needs one, deep in its own code.
ENVIRONMENT_FOLDER = re.compile(r"CACHE|.+_HOME$|^(TMPDIR|TEMP|TMP)$")


def environment_folder(err: BaseException) -> UserError | None:
    """The one line for an OSError on a path inside a folder the environment names for a library
    (HF_HOME=/etc/passwd, a file: datasets cannot make its cache in it), naming the variable; None
    for any other error."""
    path = getattr(err, "filename", None)
    if not isinstance(err, OSError) or not isinstance(path, str) or not os.path.isabs(path):
        return None
    named = [
        (name, value)
        for name, value in os.environ.items()
        if ENVIRONMENT_FOLDER.search(name) and os.path.isabs(value) and os.path.commonpath([value, path]) == value
    ]
    if not named:
        return None
    name, value = max(named, key=lambda item: len(item[1]))  # the innermost: HF_DATASETS_CACHE within HF_HOME
    why = err.strerror or type(err).__name__
    return UserError(
        f"{name}={value} in the environment: a library cannot use {path} ({why}); point {name} at a folder "
        "you can write, or unset it"
    )


# The libraries' own settings in the environment, by their prefixes.
LIBRARY_SETTING = re.compile(
    r"^(ACCELERATE|HF|HUGGINGFACE|TRANSFORMERS|DATASETS|TOKENIZERS|TORCH|PYTORCH|TRL|PEFT|DEEPSPEED|NCCL|OMP|MKL)_"
)


def environment_value(err: BaseException) -> UserError | None:
    """The one line for a library's refusal of a setting in the environment (accelerate's
    ACCELERATE_USE_CPU=banana, huggingface_hub's HF_HUB_ETAG_TIMEOUT=abc, read where the library
    first needs them): a ValueError that quotes the value of a library's variable, raised in code
    that reads the environment. None for any other error."""
    if not isinstance(err, ValueError) or err.__traceback__ is None:
        return None
    message = str(err)
    named = [
        (name, value)
        for name, value in os.environ.items()
        if LIBRARY_SETTING.match(name)
        and value.strip()
        and re.search(rf"(?<![\w.-]){re.escape(value.strip())}(?![\w.-])", message, re.IGNORECASE)
    ]
    if not named or not _reads_environment(err.__traceback__):
        return None
    name, value = max(named, key=lambda item: len(item[1]))
    return UserError(
        f"{name}={value!r} in the environment is refused by a library ({' '.join(message.split())}); set it as "
        "that library's documentation says, or unset it"
    )


def environment_error(err: BaseException) -> UserError | None:
    """The one line for an error the environment caused (`environment_folder`, `environment_value`,
    `out_of_memory`), or a model's chat template (`template_refusal`)."""
    return environment_folder(err) or environment_value(err) or out_of_memory(err) or template_refusal(err)


def template_refusal(err: BaseException) -> UserError | None:
    """A model's chat template refusing the turns it is given, with its own `raise_exception`
    (Gemma 2's takes no system turn; some take no two user turns in a row): jinja2's TemplateError,
    raised wherever a prompt is rendered (a run's data, an evaluation, generate, pairs, preview)."""
    refused = next((e for e in causes(err) if type(e).__name__ == "TemplateError"
                    and type(e).__module__.startswith("jinja2")), None)  # fmt: skip
    if refused is None:
        return None
    why = str(refused).splitlines()[0] if str(refused) else "no reason given"
    fix = (
        "leave the system prompt out (system_prompt in a recipe or eval, --system for generate, --system-prompt "
        "for pairs), or use a template that takes one (an SFT recipe's chat_template_path: chatml)"
        if "system" in why.lower()
        else "give the turns as that template takes them (a system prompt, from system_prompt, --system or "
        "--system-prompt, is a turn of its own that some templates refuse), or use another template"
    )
    return UserError(f"the model's chat template refuses the turns it was given ({why}); {fix}")


def out_of_memory(err: BaseException) -> UserError | None:
    """The machine's memory (or a GPU's) running out: Python's MemoryError, torch's allocator
    refusal (a RuntimeError on CPU, OutOfMemoryError on a GPU). The line says what ran out; the
    traceback says nothing more a user can act on."""
    refused = next((e for e in causes(err) if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError"
                    or "can't allocate memory" in str(e) or "CUDA out of memory" in str(e)), None)  # fmt: skip
    if refused is None:
        return None
    what = "a GPU's memory" if "CUDA" in str(refused) or type(refused).__name__ == "OutOfMemoryError" else "memory"
    found = re.search(r"(?:tried to allocate|Tried to allocate) ([\d.]+ ?[KMGT]?i?B|\d+ bytes)", str(refused))
    asked = f" (asking for {found.group(1)} more)" if found else ""
    return UserError(
        f"this machine ran out of {what}{asked}: the model, batch or sequence asked for is larger than it holds; "
        "ask for a smaller one (a model of fewer or narrower layers; to train, a smaller batch with more "
        "gradient_accumulation_steps, a shorter max_length, or LoRA), or use a machine with more"
    )


def _reads_environment(trace, depth: int = 3) -> bool:
    """Whether one of the `depth` innermost functions the error went through reads the environment
    (os.environ, getenv, a library's *_from_env): the refusal is of a variable's value, not of an
    argument's (accelerate's str_to_bool refuses in the function its parse_flag_from_env calls)."""
    import inspect

    frames = []
    while trace is not None:
        frames.append(trace.tb_frame)
        trace = trace.tb_next
    for frame in frames[-depth:]:
        try:
            source = inspect.getsource(frame.f_code)
        except (OSError, TypeError):
            continue
        if re.search(r"environ|getenv|_from_env", source):
            return True
    return False


def report_environment_on_import() -> None:
    """Report a library's refusal of the environment (above) in its one line and exit code 2 where
    it comes while a library is imported, before any command's own handling (huggingface_hub reads
    HF_HUB_ETAG_TIMEOUT as its constants load); any other uncaught error keeps its traceback."""
    default = sys.excepthook

    def hook(kind, err, trace):
        line = environment_error(err)
        if line is None:
            return default(kind, err, trace)
        _say(f"error: {line}")
        sys.stdout.flush()
        os._exit(2)  # an excepthook's own exit code is 1 whatever it does; nothing is written yet

    sys.excepthook = hook


def _bar_open() -> bool:
    """Whether a tqdm progress bar is open in this process: its line on stderr, redrawn with a
    carriage return, has no newline until the bar closes (a training run stopped mid-epoch)."""
    bars = getattr(sys.modules.get("tqdm"), "tqdm", None)
    return bool(getattr(bars, "_instances", None))


EXIT_GRACE_SECONDS = 30


def _exit_within(seconds: float, code: int) -> None:
    """Make sure the process ends `seconds` from now with `code`: a Ctrl-C can land while a library
    thread holds a lock that the interpreter's shutdown then waits on for ever (a logger's or a
    writer's). What the run keeps is already whole on disk (checkpoints are published by rename)."""
    timer = threading.Timer(seconds, lambda: (sys.stderr.flush(), os._exit(code)))
    timer.daemon = True
    timer.start()


def causes(err: BaseException | None) -> Iterator[BaseException]:
    """`err` and the errors it was raised from or while handling, innermost last, each once."""
    seen = set()
    while err is not None and id(err) not in seen:
        yield err
        seen.add(id(err))
        err = err.__cause__ or err.__context__


def _interrupted(err: BaseException | None) -> bool:
    """A Ctrl-C, or an error raised while one was being handled (tqdm's lock, cut mid-write,
    raises its own RuntimeError over the KeyboardInterrupt)."""
    return any(isinstance(e, KeyboardInterrupt) for e in causes(err))


def given_twice(paths: Sequence[str]) -> str | None:
    """ "P is given twice" (or "P is Q again", the same file by another path) for the first path of
    `paths` that names a file or folder named before it; None when each is named once."""
    seen: dict[str, str] = {}
    for path in paths:
        first = seen.get(os.path.realpath(path))
        if first is not None:
            return f"{path} is given twice" if first == path else f"{path} is {first} again"
        seen[os.path.realpath(path)] = path
    return None
