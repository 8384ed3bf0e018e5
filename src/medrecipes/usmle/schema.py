"""The normalised multiple-choice row: its columns, letters and the helpers that build one."""

from typing import Any, NamedTuple

from datasets import Features, List, Value

from medrecipes.errors import UserError, quoted, row_in_files

LETTERS = "ABCDEFGHIJ"
COLUMNS = ["id", "question", "options", "answer", "subject", "explanation", "context"]
FEATURES = Features(
    {
        "id": Value("string"),
        "question": Value("string"),
        "options": List(Value("string")),
        "answer": Value("string"),
        "subject": Value("string"),
        "explanation": Value("string"),
        "context": Value("string"),
    }
)
FILE_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")
MMLU_COLUMNS = ["question", "A", "B", "C", "D", "answer"]
MMLU_SPLITS = ("dev", "val", "test")
PUBMEDQA_OPTIONS = ["yes", "no", "maybe"]

Row = dict[str, Any]


class Where(NamedTuple):
    """The file (or Hub id) and 1-based record number that error messages point at; they show
    the file's line number where its records are lines (`errors.row_in_files`)."""

    source: str
    row: int
    header: bool = True  # whether a CSV file's first line names its columns

    def __str__(self) -> str:
        return row_in_files([self.source], self.row - 1, self.header)


def question_key(context: str | None, question: str, options) -> tuple:
    """What makes two rows the same question: its context (PubMedQA's abstract), its text and its
    options, in order."""
    return (context or "", question, tuple(options))


def letters_of(options) -> str:
    """The letters of a question's options: "ABCD" for 4, and A-D where they are not known (a
    GRPO row without its options)."""
    return LETTERS[: len(options)] if options else "ABCD"


def letters_for(row: Row) -> str:
    """The option letters of a normalised row: "ABCD" for 4 options."""
    return letters_of(row["options"])


def option_map(row: Row) -> dict[str, str]:
    """Ordered letter -> option text of a normalised row."""
    return dict(zip(letters_for(row), row["options"], strict=True))


class NotText(ValueError):
    """A list or mapping where a row's text belongs (its question, an explanation): `str` would
    make it its Python text, which would be trained and scored. The loader names the row."""

    def __init__(self, value: Any):
        super().__init__(f"{quoted(value, 60)} is a {'list' if isinstance(value, list) else 'mapping'}")


def _text(value: Any) -> str:
    if isinstance(value, dict | list):
        raise NotText(value)
    return "" if value is None else str(value).strip()


# How many options a question may have: a choice needs two, and answers are read as the letters A-J.
FEWEST_OPTIONS, MOST_OPTIONS = 2, len(LETTERS)


def _check_option_count(count: int, where: Where) -> None:
    if not FEWEST_OPTIONS <= count <= MOST_OPTIONS:
        raise UserError(
            f"{where}: {count} option(s); a question has {FEWEST_OPTIONS} to {MOST_OPTIONS} options "
            f"(letters A-{LETTERS[-1]}); split or fix the row, or drop it"
        )


def _options_from_dict(options: dict, where: Where) -> list[str]:
    # Arrow merges the keys of all rows, so a 4-option row in a mixed file has E=None.
    present = sorted(k for k, v in options.items() if v is not None)
    _check_option_count(len(present), where)
    if "".join(present) != LETTERS[: len(present)]:
        if all(letter in LETTERS for letter in present):  # a letter with no text (null, or no such key) before others
            gaps = [letter for letter in LETTERS[: LETTERS.index(present[-1])] if letter not in present]
            raise UserError(
                f"{where}: option {', '.join(gaps)} has no text (null, or no such key) while {present[-1]} follows; "
                f"give {gaps[0]} its text, or label the options A, B, C, ... without gaps"
            )
        raise UserError(
            f"{where}: option keys {present} are not consecutive letters from A; "
            "label the options A, B, C, ... without gaps"
        )
    return [_text(options[k]) for k in present]


def _options(options: Any, where: Where) -> list[str]:
    if isinstance(options, dict):
        found = _options_from_dict(options, where)
        values = [options[k] for k in sorted(options) if options[k] is not None]
    elif isinstance(options, (list, tuple)):
        _check_option_count(len(options), where)
        found, values = [_text(o) for o in options], list(options)
    else:
        raise UserError(
            f"{where}: 'options' must be a dict {{'A': ..., 'B': ...}} or a list of {FEWEST_OPTIONS} to "
            f"{MOST_OPTIONS} texts, got {type(options).__name__}; fix the row"
        )
    for letter, value in zip(LETTERS, values, strict=False):
        if isinstance(value, dict | list):  # it would be trained and scored as its Python text
            raise UserError(
                f"{where}: option {letter} is {quoted(value, 60)}, not text; write each option as its text"
            )
    return found


def _gold(letter: Any, options: list[str], where: Where) -> str | None:
    if letter is None or _text(letter) == "":
        return None
    gold = _text(letter).upper()
    allowed = LETTERS[: len(options)]
    if len(gold) != 1 or gold not in allowed:
        raise UserError(
            f"{where}: answer {letter!r} is not one of the option letters {allowed}; fix the answer or the options"
        )
    return gold


def _index_gold(index: Any, options: list[str], where: Where, base: int = 0) -> str | None:
    if index is None or str(index).strip() in ("", "-1"):
        return None
    position = int(index) - base if str(index).strip().isdigit() else -1
    if not 0 <= position < len(options):
        raise UserError(
            f"{where}: answer index {index!r} does not name one of the {len(options)} options; fix the answer index"
        )
    return LETTERS[position]


def _row(question: Any, options: list[str], answer: str | None, **fields: Any) -> Row:
    return {
        "id": _text(fields.get("id")),
        "question": _text(question),
        "options": options,
        "answer": answer,
        "subject": _text(fields.get("subject")),
        "explanation": _text(fields.get("explanation")),
        "context": _text(fields.get("context")),
    }
