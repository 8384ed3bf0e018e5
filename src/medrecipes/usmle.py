"""One multiple-choice-question (MCQ) schema for SFT, GRPO, evaluation and pretraining data.

`load_mcq` reads MedQA, MedMCQA, MMLU, PubMedQA and the project's own seed files (local files,
directories or Hub ids) into a `datasets.Dataset` whose columns are exactly `COLUMNS`:

    id: str, question: str, options: list[str], answer: str | None (gold letter),
    subject: str, explanation: str, context: str

Option i carries the letter ``LETTERS[i]``. Options stay a list because Arrow cannot store dicts
whose keys vary from row to row (4- and 5-option MedQA). The prompt builders and
`extract_answer` below are written together: every target `sft_target` produces is read back
by `extract_answer`, and `completion_prompt` matches lm-evaluation-harness `medqa_4options`.
"""

import csv
import json
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

from datasets import Dataset, Features, List, ReadInstruction, Value, concatenate_datasets, load_dataset
from datasets.exceptions import DatasetGenerationError

from medrecipes.errors import UserError, check_choice, check_text_file, did_you_mean, row_in_files, unreadable
from medrecipes.locations import looks_local

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


# ---------------------------------------------------------------------------
# Row helpers


def letters_for(row: Row) -> str:
    """The option letters of a normalised row: "ABCD" for 4 options."""
    return LETTERS[: len(row["options"])]


def option_map(row: Row) -> dict[str, str]:
    """Ordered letter -> option text of a normalised row."""
    return dict(zip(letters_for(row), row["options"], strict=True))


def _text(value: Any) -> str:
    return "" if value is None else str(value).strip()


def _require(row: Row, keys: Iterable[str], fmt: str, where: Where) -> None:
    missing = [k for k in keys if row.get(k) is None]
    if missing:
        raise UserError(
            f"{where}: missing {', '.join(repr(k) for k in missing)} for format '{fmt}'; "
            f"fix the row or pass the right format= (one of {', '.join(FORMATS)})"
        )


def _options_from_dict(options: dict, where: Where) -> list[str]:
    # Arrow merges the keys of all rows, so a 4-option row in a mixed file has E=None.
    present = sorted(k for k, v in options.items() if v is not None)
    if "".join(present) != LETTERS[: len(present)] or len(present) < 2:
        raise UserError(
            f"{where}: option keys {present} are not consecutive letters from A; "
            "label the options A, B, C, ... without gaps"
        )
    return [_text(options[k]) for k in present]


def _options(options: Any, where: Where) -> list[str]:
    if isinstance(options, dict):
        return _options_from_dict(options, where)
    if isinstance(options, (list, tuple)) and 2 <= len(options) <= len(LETTERS):
        return [_text(o) for o in options]
    raise UserError(
        f"{where}: 'options' must be a dict {{'A': ..., 'B': ...}} or a list of 2 to "
        f"{len(LETTERS)} texts, got {type(options).__name__}; fix the row"
    )


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


# ---------------------------------------------------------------------------
# Formats: each converter turns one raw row into a normalised row.


def _from_medqa(row: Row, where: Where, **_: Any) -> Row:
    _require(row, ["question", "options", "answer_idx"], "medqa", where)
    options = _options(row["options"], where)
    subject = row.get("meta_info") or row.get("subject")
    return _row(
        row["question"],
        options,
        _gold(row["answer_idx"], options, where),
        id=row.get("realidx", row.get("id")),
        subject=subject,
    )


def _from_medqa_hf(row: Row, where: Where, **_: Any) -> Row:
    endings = sorted(k for k in row if re.fullmatch(r"ending\d", k) and row[k] is not None)
    _require(row, ["sent1", "ending0", "ending1", "label"], "medqa_hf", where)
    options = [_text(row[k]) for k in endings]
    return _row(row["sent1"], options, _index_gold(row["label"], options, where), id=row.get("id"))


def _from_medmcqa(row: Row, where: Where, one_based: bool = False, **_: Any) -> Row:
    _require(row, ["question", "opa", "opb", "opc", "opd", "cop"], "medmcqa", where)
    options = [_text(row[k]) for k in ("opa", "opb", "opc", "opd")]
    answer = _index_gold(row["cop"], options, where, base=1 if one_based else 0)
    return _row(
        row["question"],
        options,
        answer,
        id=row.get("id"),
        subject=row.get("subject_name"),
        explanation=row.get("exp"),
    )


def _from_mmlu(row: Row, where: Where, subject: str = "", **_: Any) -> Row:
    if row.get("choices") is not None:  # the Hub's cais/mmlu layout
        _require(row, ["question", "answer"], "mmlu", where)
        options = _options(row["choices"], where)
        return _row(
            row["question"],
            options,
            _index_gold(row["answer"], options, where),
            subject=row.get("subject") or subject,
        )
    _require(row, MMLU_COLUMNS, "mmlu", where)
    options = [_text(row[k]) for k in "ABCD"]
    return _row(row["question"], options, _gold(row["answer"], options, where), subject=subject)


def _from_pubmedqa(row: Row, where: Where, **_: Any) -> Row:
    # PQA-L files use upper-case keys; the Hub's pqa_labeled uses lower case and nests contexts.
    question = row.get("QUESTION", row.get("question"))
    _require({"QUESTION": question, **row}, ["QUESTION", "final_decision"], "pubmedqa", where)
    decision = _text(row["final_decision"]).lower()
    if decision not in PUBMEDQA_OPTIONS:
        raise UserError(f"{where}: final_decision {row['final_decision']!r} is not yes, no or maybe; fix the row")
    contexts = row.get("CONTEXTS") or (row.get("context") or {}).get("contexts") or []
    # One newline between the abstract's sections, as lm-evaluation-harness's pubmedqa prompt has it.
    context = "\n".join(contexts) if isinstance(contexts, list) else _text(contexts)
    answer = LETTERS[PUBMEDQA_OPTIONS.index(decision)]
    return _row(
        question,
        list(PUBMEDQA_OPTIONS),
        answer,
        id=row.get("id", row.get("pubid")),
        explanation=row.get("LONG_ANSWER", row.get("long_answer")),
        context=context,
    )


def _from_seed(row: Row, where: Where, **_: Any) -> Row:
    _require(row, ["question", "options"], "seed", where)
    options = _options(row["options"], where)
    return _row(
        row["question"],
        options,
        _gold(row.get("answer"), options, where),
        id=row.get("id"),
        subject=row.get("subject"),
        explanation=row.get("explanation"),
        context=row.get("context"),
    )


class _Format(NamedTuple):
    keys: tuple[str, ...]  # the keys that identify the format in "auto" mode
    convert: Callable[..., Row]


# Order matters in "auto": medqa rows also carry seed's keys (question, options, answer).
_FORMATS: dict[str, _Format] = {
    "medqa": _Format(("question", "options", "answer_idx"), _from_medqa),
    "medqa_hf": _Format(("sent1", "ending0", "label"), _from_medqa_hf),
    "medmcqa": _Format(("question", "opa", "cop"), _from_medmcqa),
    "mmlu": _Format(("question", "A", "B", "answer"), _from_mmlu),
    "pubmedqa": _Format(("QUESTION", "final_decision"), _from_pubmedqa),
    "seed": _Format(("question", "options", "answer"), _from_seed),
}
FORMATS = tuple(_FORMATS)
# Hub layouts that share a format's converter but not its identifying keys.
_ALIASES = [
    (("question", "choices", "answer"), "mmlu"),
    (("question", "final_decision"), "pubmedqa"),
]


def _detect_format(row: Row, where: Where) -> str:
    present = {k for k, v in row.items() if v is not None}
    for name, fmt in _FORMATS.items():
        if present.issuperset(fmt.keys):
            return name
    for keys, name in _ALIASES:
        if present.issuperset(keys):
            return name
    accepted = "; ".join(f"{name} ({', '.join(f.keys)})" for name, f in _FORMATS.items())
    raise UserError(
        f"{where}: keys {sorted(present)} fit no MCQ format; accepted formats: {accepted}; "
        "convert the file or pass format="
    )


def _medmcqa_one_based(raw: Dataset) -> bool:
    """MedMCQA's Hub release numbers `cop` 0-3, the original JSON 1-4, per whole dataset.

    The dataset is 1-based when any row has cop 4 or no row has cop 0; -1 and missing
    values (unanswered test rows) take no part in the decision.
    """
    cops = {int(c) for c in list(raw["cop"]) if c is not None and int(c) >= 0}
    return 4 in cops or 0 not in cops


# ---------------------------------------------------------------------------
# Reading files


def _read_json(path: Path) -> Dataset:
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            data = None  # JSON Lines under a .json name: the json builder reads those
        # PubMedQA's PQA-L is one object keyed by PubMed id; the json builder has no mode for that.
        if isinstance(data, dict) and data and all(isinstance(v, dict) for v in data.values()):
            return Dataset.from_list([{**value, "id": key} for key, value in data.items()])
    return load_dataset("json", data_files=str(path), split="train")


def _csv_has_header(path: Path) -> bool:
    with path.open(encoding="utf-8", newline="") as handle:
        first = next(csv.reader(handle), [])
    known = {k for fmt in _FORMATS.values() for k in fmt.keys} - set("ABCD")
    return bool(known & {cell.strip() for cell in first})


def _csv_header(path: Path, fmt: str) -> bool:
    """Whether a CSV file's first line names its columns (MMLU's files have no header)."""
    return path.suffix == ".csv" and fmt != "mmlu" and _csv_has_header(path)


def _read_file(path: Path, header: bool) -> Dataset:
    if path.suffix == ".parquet":
        return load_dataset("parquet", data_files=str(path), split="train")
    if path.suffix == ".csv":
        if header:
            return load_dataset("csv", data_files=str(path), split="train")
        # MMLU CSVs have no header; read every cell as text so "0.50" or "None" survive.
        return load_dataset(
            "csv",
            data_files=str(path),
            split="train",
            column_names=MMLU_COLUMNS,
            header=None,
            features=Features({c: Value("string") for c in MMLU_COLUMNS}),
            keep_default_na=False,
        )
    return _read_json(path)


def _mmlu_subject(path: Path) -> str:
    return re.sub(r"_(dev|val|test)$", "", path.stem)


def _normalise(
    raw: Dataset, fmt: str, source: str, id_prefix: str, subject: str = "", header: bool = True, answered: bool = False
) -> Dataset:
    if len(raw) == 0:
        return Dataset.from_dict({c: [] for c in COLUMNS}, features=FEATURES)
    if fmt == "auto":
        fmt = _detect_format(raw[0], Where(source, 1, header))
    extra: dict[str, Any] = {"subject": subject}
    if fmt == "medmcqa" and "cop" in raw.column_names:
        extra["one_based"] = _medmcqa_one_based(raw)
    convert = _FORMATS[fmt].convert

    def normalise_row(row: Row, index: int) -> Row:
        where = Where(source, index + 1, header)
        out = convert(row, where, **extra)
        if answered and out["answer"] is None:
            raise UserError(
                f"{where}: has no gold answer, which training and scoring need on every row; "
                "fill it in or drop the row (the MedMCQA test split has none)"
            )
        out["id"] = out["id"] or f"{id_prefix}-{index}"
        return out

    return raw.map(
        normalise_row,
        with_indices=True,
        remove_columns=raw.column_names,
        features=FEATURES,
        desc=f"normalising {id_prefix}",
    )


def _files_in(directory: Path, split: str | None) -> list[Path]:
    splits = [s for s in MMLU_SPLITS if (directory / s).is_dir()]
    if splits:
        chosen = split or "test"
        if chosen not in splits:
            raise UserError(
                f"{directory}: no '{chosen}' split folder{did_you_mean(chosen, splits)}; "
                f"pass split= one of {', '.join(splits)}"
            )
        directory = directory / chosen
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.suffix in FILE_SUFFIXES)
    if not files:
        raise UserError(f"{directory}: holds no {', '.join(FILE_SUFFIXES)} files; point source= at MCQ data")
    return files


def _load_path(path: Path, fmt: str, split: str | None, answered: bool) -> Dataset:
    folder = split.partition("[")[0] if split else None  # "test[:50]": the test folder, first 50 rows
    files = _files_in(path, folder) if path.is_dir() else [path]
    parts = []
    for file in files:
        check_text_file(str(file))
        header = _csv_header(file, fmt)
        try:
            raw = _read_file(file, header)
        except (DatasetGenerationError, UnicodeDecodeError) as err:
            raise unreadable(str(file), err, [str(file)]) from None
        subject = _mmlu_subject(file) if file.suffix == ".csv" else ""
        parts.append(_normalise(raw, fmt, str(file), file.stem, subject, header, answered))
    ds = concatenate_datasets(parts) if len(parts) > 1 else parts[0]
    return _slice(ds, split, str(path)) if split and "[" in split else ds


def _slice(ds: Dataset, split: str, source: str) -> Dataset:
    """The rows of a local source that the slice in `split` names ("train[:32]", "test[10%:]"),
    counted as `datasets` counts them in a Hub split; the name before it is not checked, a
    file being one split whatever it is called."""
    name = split.partition("[")[0]
    try:
        spans = ReadInstruction.from_spec(split).to_absolute({name: len(ds)})
    except (AssertionError, KeyError, ValueError) as err:
        raise UserError(
            f"{source}: split '{split}' is not a slice of one split ({str(err).splitlines()[0] if str(err) else err!r}); "
            "write e.g. train[:100] or train[10%:20%]"
        ) from None
    return ds.select([i for span in spans for i in range(span.from_, span.to)])


def _load_hub(source: str, fmt: str, split: str | None, name: str | None, answered: bool) -> Dataset:
    try:
        raw = load_dataset(source, name, split=split or "train")
    except Exception as err:  # the Hub client raises many types for "cannot get this"
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(
            f"{source}: not a local path and not a loadable Hub dataset ({reason}); check the path or the dataset id"
        ) from err
    return _normalise(raw, fmt, source, source.replace("/", "_"), answered=answered)


def _filter_subjects(ds: Dataset, subjects: list[str], source: str) -> Dataset:
    present = sorted(set(list(ds["subject"])))
    for subject in subjects:
        if subject not in present:
            raise UserError(
                f"{source}: no rows with subject '{subject}'{did_you_mean(subject, present)}; "
                f"subjects present: {', '.join(present) or '(none)'}"
            )
    wanted = set(subjects)
    return ds.filter(lambda row: row["subject"] in wanted, desc="selecting subjects")


def load_mcq(
    source: str | os.PathLike,
    format: str = "auto",
    split: str | None = None,
    subjects: list[str] | None = None,
    config: str | None = None,
    answered: bool = False,
) -> Dataset:
    """Load MCQ data from a file, a directory or a Hub id into the normalised schema.

    `format` is "auto" (detected per file from its first row) or one of `FORMATS`; every
    row is validated against it. For a directory with dev/ val/ test/ folders (MMLU style)
    `split` picks the folder, default "test"; for a Hub id it picks the split, default
    "train", and `config` picks the Hub configuration (e.g. an MMLU subject). A slice in
    `split` ("train[:32]", "test[10%:]") takes those rows of a file or folder as of a Hub
    split; a single file ignores the split's name and `config`. `subjects` keeps only rows of
    those subjects. `answered` refuses a row without a gold answer (data to train or score on).
    """
    check_choice(format, ["auto", *FORMATS], "format")
    name = os.fspath(source)
    path = Path(name).expanduser()
    if path.exists():
        if path.is_file() and path.suffix not in FILE_SUFFIXES:
            raise UserError(f"{name}: unsupported file type '{path.suffix}'; use one of {', '.join(FILE_SUFFIXES)}")
        ds = _load_path(path, format, split, answered)
    elif looks_local(name):
        raise UserError(f"{name}: no such file or directory; check the path")
    else:
        ds = _load_hub(name, format, split, config, answered)
    return _filter_subjects(ds, subjects, name) if subjects else ds


# ---------------------------------------------------------------------------
# Prompts and targets


def options_block(row: Row) -> str:
    """The options as lines "A. text", in letter order."""
    return "\n".join(f"{letter}. {text}" for letter, text in option_map(row).items())


def completion_prompt(row: Row) -> str:
    """The lm-evaluation-harness medqa_4options prompt, scored on " A", " B", ... after it."""
    context = f"Context: {row['context']}\n" if row.get("context") else ""
    return f"{context}Question: {row['question']}\n{options_block(row)}\nAnswer:"


def _instruction(row: Row, chain_of_thought: bool) -> str:
    letters = ", ".join(letters_for(row))
    if chain_of_thought:
        return (
            "Think through the question step by step, then give your answer on a last line "
            f"of the form 'Final Answer: X', where X is one of {letters}."
        )
    return f"Answer with the letter of the correct option ({letters}) only."


def chat_messages(row: Row, system_prompt: str | None = None, chain_of_thought: bool = False) -> list[dict[str, str]]:
    """Chat messages asking the question: an optional system turn and one user turn."""
    context = f"Context: {row['context']}\n\n" if row.get("context") else ""
    instruction = _instruction(row, chain_of_thought)
    user = f"{context}{row['question']}\n\n{options_block(row)}\n\n{instruction}"
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return messages + [{"role": "user", "content": user}]


def _require_gold(row: Row) -> str:
    if not row.get("answer"):
        raise UserError(
            f"row '{row.get('id', '')}': has no gold answer, so it cannot be a training target; "
            "drop unanswered rows (e.g. the MedMCQA test split) before building targets"
        )
    return row["answer"]


def sft_target(row: Row, with_explanation: bool = False, chain_of_thought: bool = False) -> str:
    """The assistant turn: "C. <option text>", or the explanation then "Final Answer: C"."""
    letter = _require_gold(row)
    if not (with_explanation or chain_of_thought):
        return f"{letter}. {option_map(row)[letter]}"
    explanation = row.get("explanation") or ""
    return f"{explanation}\n\nFinal Answer: {letter}".strip()


def pretraining_text(row: Row) -> str:
    """The row as one plain-text document; a row without gold ends at "Answer:"."""
    if not row.get("answer"):
        return completion_prompt(row)
    text = f"{completion_prompt(row)} {row['answer']}"
    return f"{text}\n{row['explanation']}" if row.get("explanation") else text


# ---------------------------------------------------------------------------
# Answer extraction

# A candidate letter: upper case standing alone, or either case when wrapped in (), [] or
# markdown, or lower case followed by punctuation/end ("is (c)", "is c."). "A or B" is a hedge,
# not an answer, so a letter followed by "or X" / "/X" is not a candidate.
_HEDGE = r"(?![)\]*_]*\s*(?:or|/)\s*[(\[]?[A-Ja-j]\b)"
_LETTER = r"[*_]*\s*(?:[(\[]([A-Ja-j])[)\]]|\b([A-J])(?![\w'-])|\b([a-j])(?=[*_]*\s*(?:[.):,;!]|$)))" + _HEDGE
# "option C", "choice (b)": the word may stand before the letter wherever a letter is read
_PICK = r"(?:(?i:option|choice)\s*)?" + _LETTER
_SEP = r"[\s*_]*(?:[:=\-\u2013\u2014]|\bis\b|\bwould be\b|\bshould be\b|\bwill be\b)[\s*_:]*"

_FINAL_PATTERNS = [
    re.compile(r"(?i:final\s+answer)[\s*_]*(?:[:=\-\u2013\u2014]|(?i:\bis\b))?[\s*_:]*" + _PICK, re.M),
    re.compile(r"\\boxed\{\s*(?:\\text\{)?\s*([A-J])\b"),
]
_EXPLICIT_PATTERNS = [
    re.compile(r"(?i:\banswer)" + _SEP + _PICK, re.M),
    re.compile(r"(?i:\b(?:correct|right|best)\s+(?:option|choice|response))" + _SEP + _PICK, re.M),
    re.compile(
        r"(?i:\b(?:it'?s|it\s+is|i\s+(?:would\s+|'d\s+)?(?:choose|pick|select|go\s+with)))\s+" + _PICK,
        re.M,
    ),
    # "B is correct", "Option (c) is the right answer"; "B is incorrect" is not one
    re.compile(_PICK + r"[\s*_]+(?i:is\s+(?:the\s+)?(?:correct|right|best)\b)", re.M),
]
_STANDALONE_PATTERNS = [
    # a line that is only the letter: "C", "c", "**C**", "(C)", "C.", "Option C"
    re.compile(r"^[\s*_]*(?:(?i:option|choice)\s*)?[(\[]?([A-Ja-j])[)\]]?[\s*_]*[.:]?[\s*_]*$", re.M),
]
# a line opening with the letter of an option: "C. Start ...", "C) Start ...", "(c) Start ...";
# a reply that lists the options this way ("A. ...\nB. ...") names every one of them
_LIST_ITEM = re.compile(r"^[ \t]*[*_]*(?:[(\[]([A-Ja-j])[)\]]|([A-Ja-j])\)|([A-J])[.:])(?=[\s*_]|$)", re.M)


def _letters_found(patterns: list[re.Pattern], text: str, options: dict[str, str] | None) -> set[str]:
    """The letters the patterns find, and with `options` also the option that the words after
    a letter spell out: "C. Goblet cells" where goblet cells are option A names two options."""
    found = set()
    for pattern in patterns:
        for match in pattern.finditer(text):
            found.add(next(g for g in match.groups() if g).upper())
            after = text[match.end() :]
            if options:
                found |= _options_spelled(after.split("\n")[0], options)
            if "\n" in match.group(0):
                # "The answer is:" and the letter on a line below: the list there is the answer,
                # and a list of several options ("A. ...\nB. ...") names no single one
                found |= _letters_found([_LIST_ITEM], after.split("\n\n")[0], None)
    return found


def _normalise_text(text: str) -> str:
    return " ".join(re.sub(r"[^\w]+", " ", text.lower()).split())


def _option_form(option: str) -> Callable[[str], str]:
    """How an option's text is compared: punctuation-blind, except for an option made only of
    symbols ("↓ ↑"), which that would leave empty and is compared as written."""
    return _normalise_text if _normalise_text(option) else lambda t: " ".join(t.casefold().split())


def _by_letter(options: list[str] | dict) -> dict[str, str]:
    pairs = options.items() if isinstance(options, dict) else zip(LETTERS, options, strict=False)
    return {str(k).upper(): str(v) for k, v in pairs if v}


def _letter_from_option_text(text: str, by_letter: dict[str, str]) -> str | None:
    forms = {k: _option_form(v) for k, v in by_letter.items()}
    said = {k: form(text) for k, form in forms.items()}
    option = {k: forms[k](v) for k, v in by_letter.items()}
    exact = [k for k in by_letter if option[k] == said[k]]
    if len(exact) == 1:
        return exact[0]
    if _ANY_LETTER.search(text):
        return None
    inside = [k for k in by_letter if f" {option[k]} " in f" {said[k]} "]
    return inside[0] if len(inside) == 1 else None


# A reply that names an option by its letter anywhere ("Option A: ...", "(B)", "C. ...") is
# not read by an option's text found inside it: its letters say what it discusses, and they
# named no answer. A reply that is an option's whole text still names it.
_ANY_LETTER = re.compile(
    r"\b(?i:option|choice)\s*[(\[]?[A-Ja-j]\b|[(\[][A-Ja-j][)\]]|(?:^|\s)[A-J][.):](?=\s|$)", re.M
)


# A reply cut off by max_new_tokens spells an option's start; this many characters of it
# (normalised) are enough to tell which option, and too few to be a word two options share.
_SPELLED_PREFIX = 20


def _options_spelled(words: str, by_letter: dict[str, str]) -> set[str]:
    """The one option whose whole text `words` is, or whose start it is when cut short."""
    said = _normalise_text(words)
    if not said:
        return set()
    texts = {k: _normalise_text(v) for k, v in by_letter.items()}
    same = {k for k, v in texts.items() if v == said}
    if not same and len(said) >= _SPELLED_PREFIX:
        same = {k for k, v in texts.items() if v.startswith(said)}
    return same if len(same) == 1 else set()


def extract_answer(text: str | None, letters: str = "ABCD", options: list[str] | dict | None = None) -> str | None:
    """The answer letter a model gave in `text`, or None when there is none or it is ambiguous.

    Tiers, most explicit first; the first tier that finds any letter decides, and it gives
    an answer only when it found exactly one distinct letter and that letter is in `letters`:
      1. "Final Answer: X" (also bold or in parentheses) and LaTeX "\\boxed{X}";
      2. explicit phrases: "answer is X", "Answer: X", "Answer - option X", "**Answer:** X",
         "correct option is (X)", "it's X", "I choose X", "X is correct";
      3. a line that is only the letter ("C", "**C**", "(C)", "Option C"), or lines opening
         with "C. text", "C) text" or "(C) text" (a reply listing the options names none);
      4. with `options`: the whole text of one option, or the text of exactly one option
         inside a reply that names no letter.
    The word "option" or "choice" may stand before the letter. With `options`, a letter
    followed by the text of another option ("C. <option A's text>") names two options: no
    answer. "A or B" is never an answer, and a sentence opening with the article "A" is not
    one either.
    """
    if not text or not text.strip():
        return None
    letters = letters.upper()
    by_letter = _by_letter(options) if options else None
    tiers = [
        _letters_found(_FINAL_PATTERNS, text, by_letter),
        _letters_found(_EXPLICIT_PATTERNS, text, by_letter),
        _letters_found(_STANDALONE_PATTERNS + [_LIST_ITEM], text, by_letter),
    ]
    for found in tiers:
        if found:
            return found.pop() if len(found) == 1 and found <= set(letters) else None
    said = _letter_from_option_text(text, by_letter) if by_letter else None
    return said if said and said in letters else None
