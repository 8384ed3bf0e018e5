"""Reading MedQA, MedMCQA, MMLU, PubMedQA and seed files (local files, folders, Hub ids) into
the normalised rows: `load_mcq`."""

import csv
import json
import logging
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

from datasets import Dataset, Features, ReadInstruction, Value, concatenate_datasets, load_dataset
from datasets.exceptions import DatasetGenerationError

from medrecipes.errors import UserError, check_choice, check_text_file, did_you_mean, unreadable
from medrecipes.locations import absent, looks_local
from medrecipes.names import PUBMEDQA_SETTINGS
from medrecipes.usmle.schema import (
    COLUMNS,
    FEATURES,
    FILE_SUFFIXES,
    LETTERS,
    MMLU_COLUMNS,
    MMLU_SPLITS,
    PUBMEDQA_OPTIONS,
    Row,
    Where,
    _gold,
    _index_gold,
    _options,
    _row,
    _text,
    question_key,
)

logger = logging.getLogger(__name__)


def _require(row: Row, keys: Iterable[str], fmt: str, where: Where) -> None:
    missing = [k for k in keys if row.get(k) is None]
    if missing:
        raise UserError(
            f"{where}: missing {', '.join(repr(k) for k in missing)} for format '{fmt}'; "
            f"fix the row or pass the right format= (one of {', '.join(FORMATS)})"
        )


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


def _pubmedqa_context(row: Row, setting: str, where: Where) -> str:
    """The text the question is asked about in `setting`: the abstract's sections, one a line (as
    lm-evaluation-harness's pubmedqa prompt joins them), its conclusion, or both, each named."""
    contexts = row.get("CONTEXTS") or (row.get("context") or {}).get("contexts") or []
    abstract = "\n".join(contexts) if isinstance(contexts, list) else _text(contexts)
    if setting == "reasoning_required":
        return abstract
    conclusion = _text(row.get("LONG_ANSWER", row.get("long_answer")))
    if not conclusion:
        raise UserError(
            f"{where}: has no LONG_ANSWER (the abstract's conclusion), which pubmedqa_setting {setting} "
            "gives the model; fill it in, or use pubmedqa_setting reasoning_required"
        )
    if setting == "reasoning_free":
        return f"Conclusion: {conclusion}"
    return f"Abstract: {abstract}\nConclusion: {conclusion}"


def _from_pubmedqa(row: Row, where: Where, pubmedqa_setting: str = "reasoning_required", **_: Any) -> Row:
    # PQA-L files use upper-case keys; the Hub's pqa_labeled uses lower case and nests contexts.
    question = row.get("QUESTION", row.get("question"))
    _require({"QUESTION": question, **row}, ["QUESTION", "final_decision"], "pubmedqa", where)
    decision = _text(row["final_decision"]).lower()
    if decision not in PUBMEDQA_OPTIONS:
        raise UserError(f"{where}: final_decision {row['final_decision']!r} is not yes, no or maybe; fix the row")
    answer = LETTERS[PUBMEDQA_OPTIONS.index(decision)]
    return _row(
        question,
        list(PUBMEDQA_OPTIONS),
        answer,
        id=row.get("id", row.get("pubid")),
        explanation=row.get("LONG_ANSWER", row.get("long_answer")),
        context=_pubmedqa_context(row, pubmedqa_setting, where),
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


class _Reading(NamedTuple):
    """How rows are read, the same for every file of a source."""

    fmt: str = "auto"
    answered: bool = False  # refuse a row without a gold answer
    pubmedqa_setting: str | None = None  # None: PubMedQA's default; a setting: the rows must be PubMedQA's


def _normalise(
    raw: Dataset, reading: _Reading, source: str, id_prefix: str, subject: str = "", header: bool = True
) -> Dataset:
    if len(raw) == 0:
        return Dataset.from_dict({c: [] for c in COLUMNS}, features=FEATURES)
    fmt, answered = reading.fmt, reading.answered
    if fmt == "auto":
        fmt = _detect_format(raw[0], Where(source, 1, header))
    extra: dict[str, Any] = {"subject": subject}
    if reading.pubmedqa_setting is not None:
        if fmt != "pubmedqa":
            raise UserError(
                f"{source}: pubmedqa_setting {reading.pubmedqa_setting} chooses what PubMedQA's questions are "
                f"asked about, and these are {fmt} rows; leave pubmedqa_setting out for them"
            )
        extra["pubmedqa_setting"] = reading.pubmedqa_setting
    if fmt == "medmcqa" and "cop" in raw.column_names:
        extra["one_based"] = _medmcqa_one_based(raw)
    convert = _FORMATS[fmt].convert

    def normalise_row(row: Row, index: int) -> Row:
        where = Where(source, index + 1, header)
        out = convert(row, where, **extra)
        if not str(out["question"] or "").strip():
            raise UserError(f"{where}: the question is empty; write the question, or drop the row")
        if answered and out["answer"] is None:
            raise UserError(
                f"{where}: has no gold answer, which training and scoring need on every row; "
                "fill it in or drop the row (the MedMCQA test split has none)"
            )
        out["id"] = out["id"] or f"{id_prefix}-{index}"
        return out

    rows = raw.map(
        normalise_row,
        with_indices=True,
        remove_columns=raw.column_names,
        features=FEATURES,
        desc=f"normalising {id_prefix}",
    )
    for line in doubtful_rows(rows, lambda index: str(Where(source, index + 1, header)).removeprefix(f"{source} ")):
        logger.warning("%s: %s", source, line)
    return rows


def doubtful_rows(rows: Dataset, where: Callable[[int], str], named: int = 3) -> list[str]:
    """What a set of questions holds that it cannot mean, each kind counted and its first rows
    named (`where(index)`): a question with an empty option (no model can choose it), and a
    question that repeats an earlier one (`question_key`: it counts twice in training and in a
    score). Said, not refused: a large set may hold a few, and the user decides."""
    empty, repeats, seen = [], [], {}
    columns = zip(rows["context"], rows["question"], rows["options"], strict=True)
    for index, (context, question, options) in enumerate(columns):
        if any(not option for option in options):
            empty.append(index)
        first = seen.setdefault(question_key(context, question, options), index)
        if first != index:
            repeats.append((index, first))
    more = ", ..."
    found = []
    if empty:
        lines = ", ".join(where(i) for i in empty[:named]) + (more if len(empty) > named else "")
        found.append(
            f"{len(empty)} question(s) with an empty option ({lines}): no model can choose an empty answer; "
            "write the option or drop the row"
        )
    if repeats:
        pairs = ", ".join(f"{where(i)} repeats {where(first)}" for i, first in repeats[:named])
        found.append(
            f"{len(repeats)} question(s) repeat an earlier one ({pairs}{more if len(repeats) > named else ''}): "
            "each counts twice in training and in a score; drop the repeats"
        )
    return found


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


def _load_path(path: Path, reading: _Reading, split: str | None) -> Dataset:
    folder = split.partition("[")[0] if split else None  # "test[:50]": the test folder, first 50 rows
    files = _files_in(path, folder) if path.is_dir() else [path]
    parts = []
    for file in files:
        check_text_file(str(file))
        header = _csv_header(file, reading.fmt)
        try:
            raw = _read_file(file, header)
        except (DatasetGenerationError, UnicodeDecodeError) as err:
            raise unreadable(str(file), err, [str(file)]) from None
        subject = _mmlu_subject(file) if file.suffix == ".csv" else ""
        parts.append(_normalise(raw, reading, str(file), file.stem, subject, header))
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


def _load_hub(source: str, reading: _Reading, split: str | None, name: str | None) -> Dataset:
    try:
        raw = load_dataset(source, name, split=split or "train")
    except Exception as err:  # the Hub client raises many types for "cannot get this"
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(
            f"{source}: not a local path and not a loadable Hub dataset ({reason}); check the path or the dataset id"
        ) from err
    return _normalise(raw, reading, source, source.replace("/", "_"))


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
    pubmedqa_setting: str | None = None,
) -> Dataset:
    """Load MCQ data from a file, a directory or a Hub id into the normalised schema.

    `format` is "auto" (detected per file from its first row) or one of `FORMATS`; every
    row is validated against it. For a directory with dev/ val/ test/ folders (MMLU style)
    `split` picks the folder, default "test"; for a Hub id it picks the split, default
    "train", and `config` picks the Hub configuration (e.g. an MMLU subject). A slice in
    `split` ("train[:32]", "test[10%:]") takes those rows of a file or folder as of a Hub
    split; a single file ignores the split's name and `config`. `subjects` keeps only rows of
    those subjects. `answered` refuses a row without a gold answer (data to train or score on).
    `pubmedqa_setting` (one of `PUBMEDQA_SETTINGS`) picks what PubMedQA's questions are asked
    about: the abstract (reasoning_required, also the default when it is None), the conclusion
    (reasoning_free) or both (reasoning_free_with_abstract); given for rows that are not
    PubMedQA's, it is refused.
    """
    check_choice(format, ["auto", *FORMATS], "format")
    if pubmedqa_setting is not None:
        check_choice(pubmedqa_setting, list(PUBMEDQA_SETTINGS), "pubmedqa_setting")
    reading = _Reading(format, answered, pubmedqa_setting)
    name = os.fspath(source)
    path = Path(name).expanduser()
    if path.exists():
        if path.is_file() and path.suffix not in FILE_SUFFIXES:
            raise UserError(f"{name}: unsupported file type '{path.suffix}'; use one of {', '.join(FILE_SUFFIXES)}")
        ds = _load_path(path, reading, split)
    elif looks_local(name):
        raise UserError(f"{name}: {absent(name)}; check the path")
    else:
        ds = _load_hub(name, reading, split, config)
    return _filter_subjects(ds, subjects, name) if subjects else ds
