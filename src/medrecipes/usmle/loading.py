"""Reading MedQA, MedMCQA, MMLU, PubMedQA and seed files (local files, folders, Hub ids) into
the normalised rows: `load_mcq`."""

import csv
import functools
import json
import logging
import os
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from datasets import Dataset, Features, ReadInstruction, Value, concatenate_datasets, load_dataset
from datasets.exceptions import DatasetGenerationError

from medrecipes.errors import (
    UserError,
    bad_lines_named,
    check_choice,
    check_csv_header,
    check_text_file,
    did_you_mean,
    unreadable,
)
from medrecipes.locations import absent, data_file, looks_local, saved_dataset
from medrecipes.names import PUBMEDQA_SETTINGS
from medrecipes.usmle.formats import CONVERTERS, FORMATS, detect_format, medmcqa_one_based
from medrecipes.usmle.schema import (
    COLUMNS,
    FEATURES,
    FILE_SUFFIXES,
    LETTERS,
    MMLU_COLUMNS,
    MMLU_SPLITS,
    NotText,
    Row,
    Where,
    question_key,
)

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------
# Reading files


def keyed_rows(path: Path) -> Dataset | None:
    """The rows of a .json file that is one object of objects keyed by id (PubMedQA's PQA-L, keyed
    by PubMed id), each with its key as `id`; None for any other file. The json builder has no
    mode for that layout and calls its first line not JSON."""
    if path.suffix != ".json":
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, OSError):
        return None  # JSON Lines under a .json name, or what the json builder reports itself
    if isinstance(data, dict) and data and all(isinstance(v, dict) for v in data.values()):
        return Dataset.from_list([{**value, "id": key} for key, value in data.items()])
    return None


def _read_json(path: Path) -> Dataset:
    if (rows := keyed_rows(path)) is not None:
        return rows
    return document_rows(load_dataset("json", data_files=data_file(str(path)), split="train"), str(path))


def document_rows(rows: Dataset, where: str = "a JSON document") -> Dataset:
    """The rows of one JSON document that holds them in another shape than a list, which the json
    builder reads as one row: columns ({"question": [...], "answer": [...]}, as `Dataset.to_dict`
    and pandas' `to_dict("list")` write them), or the rows under one key beside fields of the
    file's own ({"version": 2, "data": [{...}, ...]}, as many exports do). Any other dataset as it
    is; a caller whose rows may hold a list of mappings themselves (chat turns) does not ask."""
    if len(rows) != 1:
        return rows
    row = rows[0]
    held = [v for v in row.values() if isinstance(v, list) and v and all(isinstance(r, dict) for r in v)]
    if len(held) == 1 and not any(isinstance(v, list) for v in row.values() if v is not held[0]):
        return Dataset.from_list(held[0])
    lengths = {len(value) if isinstance(value, list) else -1 for value in row.values()}
    if len(lengths) != 1 or lengths.pop() < 1:
        return rows
    try:
        return Dataset.from_dict(row)
    except (TypeError, ValueError):  # pyarrow's ArrowTypeError and ArrowInvalid: a column of mixed values
        kinds = {name: sorted({type(v).__name__ for v in values if v is not None}) for name, values in row.items()}
        mixed = next((name for name, found in kinds.items() if len(found) > 1), None)
        if mixed is None:
            raise
        raise UserError(
            f"{where}: its column '{mixed}' holds values of several kinds ({', '.join(kinds[mixed])}), which one "
            "column of a dataset cannot; give each column values of one kind"
        ) from None


def _csv_has_header(path: Path) -> bool:
    with path.open(encoding="utf-8", newline="") as handle:
        first = next(csv.reader(handle), [])
    known = {k for fmt in CONVERTERS.values() for k in fmt.keys} - set("ABCD")
    return bool(known & {cell.strip() for cell in first})


def _csv_header(path: Path, fmt: str) -> bool:
    """Whether a CSV file's first line names its columns (MMLU's files have no header)."""
    return path.suffix == ".csv" and fmt != "mmlu" and _csv_has_header(path)


def _check_mmlu_shape(path: Path) -> None:
    """A CSV whose first line names none of the multiple-choice columns is read as MMLU's (six
    unnamed columns: question, four options, answer); one of another width is neither."""
    with path.open(encoding="utf-8", newline="") as handle:
        first = next(csv.reader(handle), [])
    if len(first) == len(MMLU_COLUMNS) and first[-1].strip().upper() not in set(LETTERS):  # a header of other names
        raise UserError(
            f"{path} line 1: {', '.join(first[:3])}, ... reads as a header ({first[-1]!r} is no answer letter), and "
            "names no multiple-choice column; name them question, A, B, C, D, answer, or give MMLU's six unnamed "
            "columns with no header"
        )
    if len(first) != len(MMLU_COLUMNS):
        raise UserError(
            f"{path} line 1: {', '.join(first[:4])}{', ...' if len(first) > 4 else ''} names no multiple-choice "
            f"column (question, the options, answer), and the file is not MMLU's {len(MMLU_COLUMNS)} unnamed "
            "columns; give a header that names them"
        )


def _read_file(path: Path, header: bool) -> Dataset:
    if path.suffix == ".parquet":
        rows = load_dataset("parquet", data_files=data_file(str(path)), split="train")
        for name, feature in rows.features.items():  # text written as bytes: read as the UTF-8 it holds
            if isinstance(feature, Value) and feature.dtype in ("binary", "large_binary"):
                try:
                    rows = rows.cast_column(name, Value("string"))
                except (ValueError, TypeError) as err:  # pyarrow's refusal of bytes that are no UTF-8
                    raise UserError(
                        f"{path}: column '{name}' holds bytes that are not UTF-8 text ({err}); write it as text"
                    ) from None
        return rows
    if path.suffix == ".csv":
        if header:
            return load_dataset("csv", data_files=data_file(str(path)), split="train")
        # MMLU CSVs have no header; read every cell as text so "0.50" or "None" survive.
        return load_dataset(
            "csv",
            data_files=data_file(str(path)),
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
    misfit: Callable[[str], str | None] | None = None  # why rows of a detected layout are not what is asked


def _normalise(
    raw: Dataset, reading: _Reading, source: str, id_prefix: str, subject: str = "", header: bool = True
) -> Dataset:
    if len(raw) == 0:
        return Dataset.from_dict({c: [] for c in COLUMNS}, features=FEATURES)
    fmt, answered = reading.fmt, reading.answered
    if fmt == "auto":
        fmt = detect_format(raw[0], Where(source, 1, header))
        # MMLU's own files are its CSV with no header; a CSV that names question, A, ..., answer is anyone's
        if reading.misfit and not (fmt == "mmlu" and header) and (why := reading.misfit(fmt)):
            raise UserError(f"{source}: {why}")
    extra: dict[str, Any] = {"subject": subject}
    if reading.pubmedqa_setting is not None:
        if fmt != "pubmedqa":
            raise UserError(
                f"{source}: pubmedqa_setting {reading.pubmedqa_setting} chooses what PubMedQA's questions are "
                f"asked about, and these are {fmt} rows; leave pubmedqa_setting out for them"
            )
        extra["pubmedqa_setting"] = reading.pubmedqa_setting
    if fmt == "medmcqa" and "cop" in raw.column_names:
        extra["one_based"] = medmcqa_one_based(raw, source)
    convert = CONVERTERS[fmt].convert

    def normalise_row(row: Row, index: int) -> Row:
        where = Where(source, index + 1, header)
        try:
            out = convert(row, where, **extra)
        except NotText as err:
            raise UserError(f"{where}: {err}, where text belongs; write it as text, or drop the row") from None
        if not str(out["question"] or "").strip():
            raise UserError(f"{where}: the question is empty; write the question, or drop the row")
        if answered and out["answer"] is None:
            layout = CONVERTERS[fmt]
            read_as = (
                f", the layout of the file's first row ({', '.join(layout.keys)})" if reading.fmt == "auto" else ""
            )
            raise UserError(
                f"{where}: has no gold answer in '{layout.gold}'{read_as}, which training and scoring need on every "
                f"row; fill in '{layout.gold}' or drop the row (the MedMCQA test split has none)"
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
        if (source, line) not in _SAID:  # a file read as training data, eval set and scored set: said once
            _SAID.add((source, line))
            logger.warning("%s: %s", source, line)
    return rows


_SAID: set[tuple[str, str]] = set()  # (file, what doubtful_rows found) said in this process


def doubtful_rows(rows: Dataset, where: Callable[[int], str], named: int = 3) -> list[str]:
    """What a set of questions holds that it cannot mean, each kind counted and its first rows
    named (`where(index)`): a question with an empty option (no model can choose it), and a
    question that repeats an earlier one (`question_key`: it counts twice in training and in a
    score), or repeats it with another gold answer (one of them is wrong), a question two of whose
    options read the same (whichever the model picks, one of them is marked wrong), and an id
    that names two different questions (`shared_ids`), and options that each begin with their own
    letter ('A. ...': a prompt letters them again). Said, not refused: a large set may hold a
    few, and the user decides."""
    empty, twins, repeats, conflicts, lettered, seen = [], [], [], [], [], {}
    answers = rows["answer"] if "answer" in rows.column_names else [None] * len(rows)
    keys = [question_key(*row) for row in zip(rows["context"], rows["question"], rows["options"], strict=True)]
    shared = shared_ids(rows["id"], keys)
    for index, key in enumerate(keys):
        options = key[2]
        if any(not option for option in options):
            empty.append(index)
        written = [" ".join(option.split()).lower() for option in options if option]
        if len(set(written)) < len(written):
            twins.append(index)
        if 1 < len(options) <= len(LETTERS) and all(
            re.match(rf"\(?{LETTERS[i]}[.):]\s", o) for i, o in enumerate(options)
        ):
            lettered.append(index)
        first = seen.setdefault(key, index)
        if first != index:
            differs = answers[index] != answers[first] and None not in (answers[index], answers[first])
            (conflicts if differs else repeats).append((index, first))
    more = ", ..."
    found = []
    sizes = Counter(len(key[2]) for key in keys)
    usual = sizes.most_common(1)[0][0] if sizes else 0
    if fewer := [i for i, key in enumerate(keys) if len(key[2]) < usual]:  # an option null, or left out
        lines = ", ".join(f"{where(i)} has {len(keys[i][2])}" for i in fewer[:named]) + (
            more if len(fewer) > named else ""
        )
        found.append(
            f"{len(fewer)} question(s) with fewer options than the {usual} most of its questions have ({lines}): "
            "an option left out or null? give it its text, or drop the row"
        )
    if empty:
        lines = ", ".join(where(i) for i in empty[:named]) + (more if len(empty) > named else "")
        found.append(
            f"{len(empty)} question(s) with an empty option ({lines}): no model can choose an empty answer; "
            "write the option or drop the row"
        )
    if twins:
        lines = ", ".join(where(i) for i in twins[:named]) + (more if len(twins) > named else "")
        found.append(
            f"{len(twins)} question(s) with two options that read the same ({lines}): no model can tell them apart "
            "(where one is the answer, the other is scored wrong); reword or drop the row"
        )
    if lettered:
        lines = ", ".join(where(i) for i in lettered[:named]) + (more if len(lettered) > named else "")
        found.append(
            f"{len(lettered)} question(s) whose options begin with their own letters ({lines}): prompts letter each "
            "option, so they read 'A. A. ...'; write the options without their letters"
        )
    if conflicts:
        pairs = ", ".join(
            f"{where(i)} answers {answers[i]} where {where(first)} answers {answers[first]}"
            for i, first in conflicts[:named]
        )
        found.append(
            f"{len(conflicts)} question(s) repeat an earlier one with another gold answer ({pairs}"
            f"{more if len(conflicts) > named else ''}): one of each is wrong; fix it or drop the row"
        )
    if repeats:
        pairs = ", ".join(f"{where(i)} repeats {where(first)}" for i, first in repeats[:named])
        found.append(
            f"{len(repeats)} question(s) repeat an earlier one ({pairs}{more if len(repeats) > named else ''}): "
            "each counts twice in training and in a score; drop the repeats"
        )
    if shared:
        pairs = ", ".join(f"{where(i)} has {where(first)}'s id {rows[i]['id']!r}" for i, first in shared[:named])
        found.append(
            f"{len(shared)} question(s) have the id of another question ({pairs}{more if len(shared) > named else ''}): "
            "pass rates and preference pairs are kept by id, so the two are mixed; give each question its own id"
        )
    return found


def shared_ids(ids: list, keys: list) -> list[tuple[int, int]]:
    """(index, first index) of each row whose id an earlier row with another question (`keys`,
    `question_key`) has: whatever is kept by id (a pass rate, a pair's gold answer) would mix them.
    The same question asked again under its id is a repeat, not this."""
    first: dict = {}
    shared = []
    for index, (name, key) in enumerate(zip(ids, keys, strict=True)):
        earlier = first.setdefault(name, index)
        if earlier != index and keys[earlier] != key:
            shared.append((index, earlier))
    return shared


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
    elif split:
        return _split_files(directory, split)
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.suffix in FILE_SUFFIXES)
    if not files:
        raise UserError(f"{directory}: holds no {', '.join(FILE_SUFFIXES)} files; point source= at MCQ data")
    return files


def folder_splits(directory: Path, split: str) -> dict[str, list[Path]]:
    """{split: files} of a folder, named as `datasets` names them (train.jsonl, dev-00.csv,
    anatomy_val.csv, ...: its own patterns). Where no file is named so (anatomy.csv,
    cardiology.jsonl), every file is the one split `split`, whatever it is called, as a single
    file is."""
    from datasets.data_files import DEFAULT_PATTERNS_ALL, DataFilesDict, get_data_patterns

    try:
        patterns = get_data_patterns(str(directory))
        found = DataFilesDict.from_patterns(patterns, base_path=str(directory))
    except FileNotFoundError:
        patterns, found = None, {}
    if patterns == DEFAULT_PATTERNS_ALL:  # no file names a split
        found = {split: [f for names in found.values() for f in names]}
    files = {
        str(name): sorted(Path(f) for f in names if Path(f).suffix in FILE_SUFFIXES) for name, names in found.items()
    }
    return {name: chosen for name, chosen in files.items() if chosen}


def scored_split(source: str, split: str | None) -> str | None:
    """The split a benchmark task reads from a folder the user gave: its own (`split`) where the
    folder has it; a folder whose files all make one other split (MMLU's val/: anatomy_val.csv,
    ...) is scored whole, as a single file is, since it is what the user pointed at. A training
    source keeps its split (a folder of test files is never trained on as train)."""
    directory = Path(source)
    if split and directory.is_dir() and not any((directory / s).is_dir() for s in MMLU_SPLITS):
        named = folder_splits(directory, split)
        if split not in named and len(named) == 1:
            return next(iter(named))
    return split


def check_folder_split(directory: Path, split: str, files: dict[str, list[Path]] | None = None) -> None:
    """One line where a folder's files (`folder_splits`, as `datasets` maps them) make no `split`."""
    files = folder_splits(directory, split) if files is None else files
    if files and split not in files:
        first = next(iter(files.values()))[0]
        raise UserError(
            f"{directory}: no '{split}' split{did_you_mean(split, list(files))}: its files make "
            f"{', '.join(files) or 'none'} (named as datasets names splits: train.jsonl, test.jsonl, ...); "
            f"name one of its files in place of the folder ({first}), or give a recipe source's split: one of them"
        )


def _split_files(directory: Path, split: str) -> list[Path]:
    """The files of one split of a folder (`folder_splits`)."""
    files = folder_splits(directory, split)
    if not files:  # datasets' patterns skip hidden files (.train.jsonl) as well
        raise UserError(
            f"{directory}: holds no {', '.join(FILE_SUFFIXES)} files that are not hidden; point the source at "
            "multiple-choice data"
        )
    check_folder_split(directory, split, files)
    read = set(files[split])
    every = (
        p for p in directory.rglob("*") if p.is_file() and p.suffix in FILE_SUFFIXES and not p.name.startswith(".")
    )
    if others := sorted(str(p.relative_to(directory)) for p in every if p not in read):  # other splits, other names
        _say_left_out(str(directory), split, ", ".join(f.name for f in files[split]), ", ".join(others))
    return files[split]


@functools.cache  # said once, however often a run reads the folder (its data, then its evaluation)
def _say_left_out(directory: str, split: str, read: str, others: str) -> None:
    logger.info("%s: its %s split is read (%s); %s left out", directory, split, read, others)


def load_saved(path: str, split: str | None) -> Dataset:
    """The rows of a folder `datasets`' save_to_disk wrote: the one dataset in it whatever `split`
    names (as a file is one split), or of a dict of splits the one `split` names (its only one
    where none is named); a slice in `split` ("train[:32]") takes those rows."""
    from datasets import DatasetDict, load_from_disk

    try:
        saved = load_from_disk(path)
    except (OSError, ValueError, KeyError, TypeError) as err:  # a file of it cut, edited or gone
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(
            f"{path}: a folder save_to_disk wrote, which cannot be read ({reason}); write it again"
        ) from None
    name = split.partition("[")[0] if split else None
    if isinstance(saved, DatasetDict):
        splits = list(saved)
        name = name or (splits[0] if len(splits) == 1 else None)
        if name not in saved:
            asked = f"no '{name}' split{did_you_mean(name, splits)}" if name else "several splits"
            raise UserError(f"{path}: {asked}: it holds {', '.join(splits)}; pass split= one of them")
        saved = saved[name]
    return _slice(saved, split, path) if split and "[" in split else saved


def _load_path(path: Path, reading: _Reading, split: str | None) -> Dataset:
    if saved_dataset(str(path)):
        return _normalise(load_saved(str(path), split), reading, str(path), path.name)
    folder = split.partition("[")[0] if split else None  # "test[:50]": the test folder, first 50 rows
    files = _files_in(path, folder) if path.is_dir() else [path]
    parts = []
    for file in files:
        check_text_file(str(file), header=False)
        header = _csv_header(file, reading.fmt)
        if header:
            check_csv_header(str(file))
        elif file.suffix == ".csv" and reading.fmt != "mmlu":
            _check_mmlu_shape(file)
        try:
            with bad_lines_named([str(file)]):  # a Parquet file cut short, or other data under its suffix
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
    chosen = [i for span in spans for i in range(span.from_, span.to)]
    if not chosen and len(ds):
        raise UserError(f"{source}: split '{split}' selects none of its {len(ds)} rows; widen the slice")
    return ds.select(chosen)


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
                f"subjects present: {', '.join(present) or '(none)'}; add its questions, or choose only subjects "
                "it has"
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
    misfit: Callable[[str], str | None] | None = None,
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
    PubMedQA's, it is refused. `misfit(layout)`, where given, says why rows detected as that
    layout (a `FORMATS` name) are not what the caller reads (another benchmark's), or None.
    """
    check_choice(format, ["auto", *FORMATS], "format")
    if pubmedqa_setting is not None:
        check_choice(pubmedqa_setting, list(PUBMEDQA_SETTINGS), "pubmedqa_setting")
    reading = _Reading(format, answered, pubmedqa_setting, misfit)
    name = os.fspath(source)
    path = Path(name).expanduser()
    if path.exists() and not path.is_file() and not path.is_dir():  # a pipe or a device: no rows to read twice
        raise UserError(f"{name}: {absent(name)}; give a file or a folder of files")
    if path.exists():
        if path.is_file() and path.suffix not in FILE_SUFFIXES:
            raise UserError(f"{name}: unsupported file type '{path.suffix}'; use one of {', '.join(FILE_SUFFIXES)}")
        ds = _load_path(path, reading, split)
    elif looks_local(name):
        raise UserError(f"{name}: {absent(name)}; check the path")
    else:
        ds = _load_hub(name, reading, split, config)
    return _filter_subjects(ds, subjects, name) if subjects else ds
