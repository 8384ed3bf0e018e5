"""Load one data source as a dataset with a single `text` column.

A source's `path` is a `datasets` builder name (json, parquet, text, csv) used with
`data_files`, a local file or directory, an fsspec URL (s3://, gs://, memory://, file://) of a
file, folder or glob, or a Hub dataset id. `format: usmle` reads multiple-choice rows through
`medrecipes.usmle` and renders each as a document.
"""

import functools
import glob
import json
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path

import datasets

from medrecipes import usmle
from medrecipes.data.parts import PART_LABELS, chosen_rows
from medrecipes.data.rows import (
    ANSWER_COLUMNS,
    check_answers,
    check_turns,
    files_of,
    line_of,
    local_files,
    named,
    row_of,
    say_contradictions,
    say_repeats,
    say_turn_markers,
    say_turn_oddities,
)
from medrecipes.data_config import SourceConfig
from medrecipes.errors import UserError, bad_line, check_text_file, merged_csv_rows, quoted, unreadable
from medrecipes.locations import BUILDERS, absent, data_file, is_url, local_path, saved_dataset

logger = logging.getLogger(__name__)


def url_files(url: str, storage_options: dict | None) -> list[str]:
    """The data files a URL names: itself, the files a glob matches, or the data files under a folder."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    try:
        if any(c in root for c in "*?["):
            found = fs.glob(root)
        elif fs.isfile(root):
            found = [root]
        else:
            found = [f for f in fs.find(root) if os.path.splitext(f)[1] in BUILDERS] if fs.isdir(root) else []
    except OSError as err:  # no network, a host that is not there, a refusal (aiohttp's and s3fs' are OSErrors)
        why = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UserError(
            f"source '{url}': cannot reach it ({why}); check the address and the network, or copy the data here and "
            "give its path"
        ) from None
    # url_to_fs drops the protocol; datasets needs it back to pick the filesystem.
    return sorted(fs.unstrip_protocol(f) for f in found)


def _resolve_url(source: SourceConfig) -> tuple[str, list[str]]:
    files = url_files(source.path, source.storage_options)
    if not files:
        raise UserError(f"source '{source.path}': no such file, or no {', '.join(BUILDERS)} files there")
    extensions = {os.path.splitext(f)[1] for f in files}
    if len(extensions) > 1 or not extensions <= set(BUILDERS):
        raise UserError(
            f"source '{source.path}': files of one type ({', '.join(BUILDERS)}) expected, found {extensions}"
        )
    return BUILDERS[extensions.pop()], files


@functools.cache  # said once, however often a command checks its sources
def _say_json_as_text(file: str) -> None:
    """A .txt file whose lines are JSON objects (JSON Lines under another name): read as text, one
    document a line, its braces, keys and quotes would be trained on. Said, not refused."""
    if BUILDERS.get(os.path.splitext(file)[1]) != "text":
        return
    with open(file, encoding="utf-8", errors="replace") as handle:
        lines = [line for line in (handle.readline() for _ in range(5)) if line.strip()]
    try:
        objects = lines and all(isinstance(json.loads(line), dict) for line in lines)
    except ValueError:
        objects = False
    if objects:
        logger.warning(
            "source '%s': its lines are JSON objects, and a .txt file is read as plain text, one document a line: "
            "training would read their keys and quotes; name it .jsonl to read their fields",
            file,
        )


@functools.cache  # said once, however often a command checks its sources
def _say_wrapped_paragraphs(file: str) -> None:
    """A .txt file of paragraphs wrapped over several lines, a blank line between them (a book's or
    an article's text), read as datasets' text builder does by default, one document a line: each
    paragraph becomes several documents, cut where its lines are (perplexity scores each from the
    start; CPT puts an end-of-text token between them). Said with the key that reads a paragraph
    a document, not refused: a file of one-line documents with blank lines between is fine."""
    if BUILDERS.get(os.path.splitext(file)[1]) != "text":
        return
    with open(file, encoding="utf-8", errors="replace") as handle:
        lines = [handle.readline() for _ in range(2000)]
    runs, run = [], 0
    for line in (*lines, "\n"):  # a blank line ends a run of text lines
        if line.strip():
            run += 1
        elif run:
            runs, run = [*runs, run], 0
    if len(runs) >= 2 and sum(runs) >= 2 * len(runs):
        logger.warning(
            "source '%s': its paragraphs run over several lines (%.1f lines a paragraph, blank lines between), and a "
            ".txt file is read one document a line; set sample_by: paragraph to read a paragraph a document "
            "(perplexity: --sample-by paragraph), or sample_by: line to keep lines",
            file,
            sum(runs) / len(runs),
        )


def _say_text_shape(file: str, source: SourceConfig) -> None:
    """What a .txt file's text says about how it is read: JSON lines, or paragraphs when the source
    does not choose (sample_by); and a CSV's rows joined into a cell by a quote left open."""
    _say_json_as_text(file)
    if source.sample_by is None:
        _say_wrapped_paragraphs(file)
    _say_merged_csv_rows(file)


_SAID_MERGED: set[str] = set()  # the files said, by their real path: once however a command names them


def _say_merged_csv_rows(file: str) -> None:
    if os.path.realpath(file) not in _SAID_MERGED and (found := merged_csv_rows(file)):
        _SAID_MERGED.add(os.path.realpath(file))
        logger.warning("source %s", found)


def check_local_source(source: SourceConfig, decode: bool = False) -> tuple[str, list[str] | None]:
    """The builder (or folder, or Hub id) and data files `datasets` reads a source with, once the
    files on this machine are checked: its path, and each data file that is not a URL or a
    pattern, exist and are non-empty (UTF-8 too, with `decode`). Nothing remote is looked at."""
    # file:// is a local path; datasets would treat it as a remote URL (and refuse it offline).
    path = source.path.removeprefix("file://")
    data_files = source.data_files
    if data_files is not None:
        data_files = [f.removeprefix("file://") for f in ([data_files] if isinstance(data_files, str) else data_files)]
    if local_path(path):
        if not os.path.isfile(path) and not os.path.isdir(path):  # gone, a device, a link that loops
            if glob.has_magic(path) and (matched := glob.glob(path)):  # a pattern: path names one file or folder
                suffix = os.path.splitext(path)[1]
                builder = suffix.lstrip(".").replace("jsonl", "json") if suffix in BUILDERS else "json"
                raise UserError(
                    f"source '{path}': a pattern ({len(matched)} file{'s' if len(matched) > 1 else ''} match{'' if len(matched) > 1 else 'es'} it), where path "
                    "names one file or folder; "
                    f"write path: {builder} and data_files: {path}, or path: {os.path.dirname(path) or '.'} for its "
                    "whole folder"
                )
            raise UserError(f"source '{path}': {absent(path)}; check the path")
        if os.path.isfile(path):
            ext = os.path.splitext(path)[1]
            if ext not in BUILDERS:
                raise UserError(f"source '{path}': unsupported file type; use {', '.join(BUILDERS)}")
            _say_text_shape(path, source)
            path, data_files = BUILDERS[ext], [path]
        # A directory goes to `datasets` as is: it maps train/test/validation files to splits.
        elif not saved_dataset(path):
            kinds = {  # by builder, as datasets picks one for a folder's files and leaves the others unread
                os.path.splitext(n)[1]
                for folder, _, names in os.walk(path)
                if not any(part.startswith(".") for part in os.path.relpath(folder, path).split(os.sep) if part != ".")
                for n in names
                if os.path.splitext(n)[1] in BUILDERS and not n.startswith(".")
            }
            if not kinds:
                raise UserError(f"source '{path}': no {', '.join(BUILDERS)} files in it")
            if len({BUILDERS[kind] for kind in kinds}) > 1 and data_files is None:  # data_files choose the files
                raise UserError(
                    f"source '{path}': holds files of more than one kind ({', '.join(sorted(kinds))}), and datasets "
                    "reads one kind of a folder and leaves the others out; give each file, or each kind's data_files "
                    "pattern, a source of its own"
                )
    for file in data_files or []:
        if is_url(file):
            continue
        if os.path.isfile(file):  # a file whose name holds *, ? or [ too
            check_text_file(file, f"source '{source.path}'", decode=decode)
            _say_text_shape(file, source)
            continue
        if any(
            c in file for c in "*?["
        ):  # a pattern: `datasets` fails with no line of its own when it matches nothing
            if not glob.glob(os.path.expanduser(file), recursive=True):
                raise UserError(
                    f"source '{source.path}': data_files pattern {file} matches no file; check the pattern "
                    "(relative paths start where the command runs)"
                )
            continue
        if not os.path.exists(file):
            raise UserError(
                f"source '{source.path}': data file {file} does not exist; check the path (relative paths start where the command runs)"
            )
        check_text_file(file, f"source '{source.path}'", decode=decode)
    if data_files is not None:
        data_files = [data_file(f) if not is_url(f) and os.path.isfile(f) else f for f in data_files]
    return path, data_files


def load_documents(source: SourceConfig, streaming: bool):
    """The source's rows as `datasets` reads them, every column kept."""
    if is_url(source.path):
        path, data_files = _resolve_url(source)
    else:  # a stream is read as it goes: its files are decoded then
        path, data_files = check_local_source(source, decode=not streaming)
        if saved_dataset(path):
            rows = usmle.load_saved(path, source.split)
            return rows.to_iterable_dataset() if streaming else rows
        if len(data_files or []) == 1 and (rows := usmle.keyed_rows(Path(data_files[0]))) is not None:
            return rows.to_iterable_dataset() if streaming else rows  # PubMedQA's PQA-L file
    for file in data_files or []:
        if is_url(file) and "*" not in file and not url_files(file, source.storage_options):
            raise UserError(f"source '{source.path}': data file {file} does not exist; check the URL")
    try:
        documents = datasets.load_dataset(
            path,
            name=source.name,
            split=source.split,
            data_files=data_files,
            data_dir=source.data_dir,
            revision=source.revision,
            streaming=streaming,
            storage_options=source.storage_options,
            **({"sample_by": source.sample_by} if source.sample_by else {}),  # the text builder's option
            # A text file saved with a byte-order mark (Windows' Notepad): the mark is no text of its first line.
            **({"encoding": "utf-8-sig"} if path == "text" else {}),
        )
        if source.sample_by == "paragraph":  # its paragraphs keep the last line break of a file and of 3 in a row
            documents = documents.map(lambda row: {"text": row["text"].strip("\n")})
        return documents
    except (datasets.exceptions.DatasetGenerationError, UnicodeDecodeError) as err:  # a file it cannot parse
        raise unreadable(named(source), err, files_of([source])) from None
    except (FileNotFoundError, ValueError, ConnectionError, TypeError) as err:
        if source.sample_by and "sample_by" in str(err):  # a folder or Hub dataset another builder reads
            raise UserError(
                f"source '{source.path}': sample_by chooses what one document of a .txt file is, and its files are "
                "read by another builder; leave sample_by out"
            ) from None
        if isinstance(err, TypeError):
            raise
        if "corresponds to no data" in str(err):  # datasets' words for a split with no rows
            sliced = source.split and "[" in source.split
            what = f"split '{source.split}' selects no rows; widen the slice" if sliced else "holds no rows; add some"
            raise UserError(f"source '{source.path}': {what}") from None
        if isinstance(err, ValueError) and (bad := bad_line(files_of([source]))):  # pyarrow's: a Parquet file cut
            raise bad from None
        hint = ""
        if datasets.config.HF_HUB_OFFLINE and not streaming and "Offline mode" in str(err):
            # datasets copies a URL's files into its cache first and counts any URL as the Hub.
            hint = "; to read object storage unset HF_HUB_OFFLINE or set streaming: true"
        raise UserError(f"source '{source.path}': cannot load it ({str(err).splitlines()[0]}){hint}") from None


def load_mcq_source(source: SourceConfig, subjects: list[str] | None = None, pass_rates: bool = True):
    """A `format: usmle` source as normalised multiple-choice rows (see medrecipes.usmle), every
    one with its gold answer: recipes train and score on them. Its part only, and of those the
    rows its pass_rate keeps unless `pass_rates` is false (the rows `medrecipes pass-rate` measures)."""
    files = source.data_files or source.path
    files = [f.removeprefix("file://") for f in ([files] if isinstance(files, str) else files)]  # local paths
    # A local pattern in data_files, as datasets reads one for the other formats: its files, in order.
    files = [m for f in files for m in ((sorted(glob.glob(f)) or [f]) if glob.has_magic(f) and local_path(f) else [f])]
    if source.split != "train" and "[" not in source.split and all(os.path.isfile(f) for f in files):
        logger.warning(
            "source '%s': split '%s' chooses nothing in a file, which is one split: all its rows are read; write a "
            "slice (train[:80%%]) to take part of it, or give a folder of split files",
            source.path,
            source.split,
        )
    rows = datasets.concatenate_datasets(
        [
            usmle.load_mcq(
                f, split=source.split, subjects=subjects, answered=True, pubmedqa_setting=source.pubmedqa_setting
            )
            for f in files
        ]
    )
    say_turn_markers(([row["question"], *row["options"]] for row in rows), source, "a question's or option's text")
    return chosen_rows(rows, source, named(source), label="answer", pass_rates=pass_rates)


def balanced_answers(rows, seed: int):
    """`rows` with every gold answer as often as the commonest: each answer's rows once, then
    drawn again in a seeded order (all of them before any a third time) until the answer has the
    commonest one's count. `datasets` has no class-balanced sampler of its own; the rows are
    selected by index, so nothing is copied."""
    import numpy as np

    answers = np.asarray(rows["answer"])
    labels, counts = np.unique(answers, return_counts=True)
    rng = np.random.default_rng(seed)
    chosen = []
    for label, count in zip(labels, counts, strict=True):
        members = np.flatnonzero(answers == label)
        rounds = [rng.permutation(members) for _ in range(-(-counts.max() // count))]
        chosen.append(np.concatenate(rounds)[: counts.max()])
    order = np.concatenate(chosen)
    logger.info(
        "balance_answers: %s",
        ", ".join(f"{label} {count} -> {counts.max()}" for label, count in zip(labels, counts, strict=True)),
    )
    return rows.select(np.sort(order).tolist())


def load_source(
    source: SourceConfig,
    streaming: bool = False,
    render: Callable[[dict], dict] | None = None,
    subjects: list[str] | None = None,
    tag: int | None = None,
    seed: int = 42,
):
    """The source as a Dataset (or IterableDataset when streaming) for a recipe.

    `format: text` gives one `text` column; `format: usmle` gives `render(row)` for each
    multiple-choice row (by default a `text` document for pretraining), optionally only for
    `subjects`; `format: chat` keeps the rows as they are (messages or prompt/completion).
    `tag` (the source's index in a mixture) is added to every row as a `source` column, so that
    packed blocks can count their tokens per source. `seed`: the order of the rows that
    `balance_answers` repeats.
    """
    if source.format == "usmle":
        rows = load_mcq_source(source, subjects)
        if source.balance_answers:
            rows = balanced_answers(rows, seed)
        render = render or (lambda row: {"text": usmle.pretraining_text(row)})
        documents = rows.map(render, remove_columns=rows.column_names)
        return _checked(documents.to_iterable_dataset() if streaming else documents, {}, source, tag)
    documents = load_documents(source, streaming)
    if source.format == "text" and isinstance(documents, datasets.Dataset):
        documents = usmle.document_rows(documents, named(source))
    if source.part is not None or source.pass_rate is not None:  # a map-style dataset (config.checks)
        documents = chosen_rows(documents, source, named(source), PART_LABELS.get(source.format))
    if source.format in PREFERENCE_FIELDS:
        fields = PREFERENCE_FIELDS[source.format]
        _check_columns(documents, fields, source, f"a {source.format} source has {', '.join(fields)}")
        return _checked(documents, {name: name for name in fields}, source, tag)
    if source.format == "chat":
        fields = ["messages"] if "messages" in (documents.column_names or []) else ["prompt", "completion"]
        _check_columns(documents, fields, source, "a chat source has messages, or prompt and completion")
        return _checked(documents, {name: name for name in fields}, source, tag)
    _check_columns(documents, [source.text_field], source, "set text_field")
    _check_text_column(documents, source)
    if documents.column_names is not None:
        documents = documents.select_columns([source.text_field])
    if source.text_field != "text":
        documents = documents.rename_column(source.text_field, "text")
    return _checked(documents, {"text": source.text_field}, source, tag)


# The columns of TRL's two preference layouts: pairs (DPO, KTO) and unpaired answers (KTO).
PREFERENCE_FIELDS = {"preference": ["prompt", "chosen", "rejected"], "unpaired": ["prompt", "completion", "label"]}


class NotTextColumn(UserError):
    """A source's text_field naming a column of no text in any row (lists, numbers): a caller that
    names the setting by its own option catches it (`texts`: the columns of text there)."""

    def __init__(self, message: str, texts: str = ""):
        super().__init__(message)
        self.texts = texts


def _is_text_feature(feature) -> bool:
    return isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")


def _check_text_column(documents, source: SourceConfig) -> None:
    """The text_field's column holds text: one of lists or numbers in every row (PubMedQA's
    CONTEXTS) is the wrong column, named with the columns of text there. A column of mixed values
    is left to the rows' own check, which names the first that is no text."""
    features = getattr(documents, "features", None) or {}
    kind = features.get(source.text_field)
    if kind is None or _is_text_feature(kind) or isinstance(kind, datasets.Json):
        return
    texts = ", ".join(name for name, feature in features.items() if _is_text_feature(feature))
    held = (
        f"{kind.dtype} values"
        if isinstance(kind, datasets.Value)
        else "mappings"
        if isinstance(kind, dict)
        else "lists"
    )
    raise NotTextColumn(
        f"{named(source)}: column '{source.text_field}' holds {held} in every row, not text; set text_field to a "
        f"column of text ({f'here: {texts}' if texts else 'it has none'})",
        texts,
    )


class MissingColumn(UserError):
    """A source without a column its format reads: a caller that can read it another way, or that
    names the setting by its own option, catches it (`shown`: the columns there, as the line gives them)."""

    def __init__(self, message: str, shown: str = ""):
        super().__init__(message)
        self.shown = shown


def _check_columns(documents, fields: list[str], source: SourceConfig, hint: str) -> None:
    """The columns `fields` are there (a stream read without a schema is checked row by row). A
    column's name is cut where long: a CSV with no header row has its first row's texts as names."""
    columns = documents.column_names
    for name in fields:
        if columns is not None and name not in columns:
            shown = ", ".join(c if len(c) <= 40 else quoted(c) for c in columns)
            if any(len(c) > 40 for c in columns) and any(f.endswith(".csv") for f in local_files(source)):
                shown += "; a CSV's first row names its columns, and this one's reads as a row of data"
            raise MissingColumn(f"{named(source)}: no column '{name}' (columns: {shown}); {hint}", shown)


def _checked(documents, fields: dict[str, str], source: SourceConfig, tag: int | None):
    """`documents` with no row lacking one of `fields` (column: the name the recipe gives it),
    a null or a key absent from a JSON line, which would stop the run mid-way with the
    tokenizer's TypeError or TRL's "not conversational"; tagged with `tag` if given.

    Arrow counts a Dataset's nulls without reading its rows. A stream is read once, as it
    trains, so its rows are checked as they are read (the run then stops at the row, named),
    in the same map that tags them: a map over a stream costs ~10% of the packing's CPU time.
    """
    if isinstance(documents, datasets.Dataset):
        for column, name in fields.items():
            values = documents.data.column(column)
            if values.null_count:
                import pyarrow.compute as pc

                first = pc.index(pc.is_null(values), True).as_py()
                raise UserError(
                    f"{row_of(source, first)}: no '{name}' (the first of {values.null_count} row(s) without it); "
                    "fix or drop them"
                )
        other = [c for c in ("prompt", "completion") if "messages" in fields and c in documents.column_names]
        if given := [documents.data.column(c) for c in other if documents.data.column(c).null_count < len(documents)]:
            import pyarrow.compute as pc

            first = min(pc.index(pc.is_valid(values), True).as_py() for values in given)
            raise UserError(
                f"{row_of(source, first)}: it has messages and {' and '.join(other)}, two layouts of a chat row, and "
                "only messages would train; keep one of them"
            )
        if "messages" in fields:
            # decoded, as the template will see them (mixed JSON contents arrive as datasets' Json feature)
            turns = [row["messages"] for row in documents.select_columns(["messages"]).to_list()]
            check_turns(turns, range(len(documents)), source)
            say_turn_oddities(turns, source)
        if "text" in fields and not _is_text(documents.data.column("text").type):
            # mixed JSON values arrive as datasets' Json feature: decoded, the first that is not text is named
            first, value = next((i, v) for i, v in enumerate(documents["text"]) if not isinstance(v, str))
            raise UserError(
                f"{row_of(source, first)}: '{fields['text']}' is {quoted(value)}, not text; fix or drop the row"
            )
        if "messages" in fields:
            say_repeats([{"messages": messages} for messages in turns], source)
        if "text" in fields:  # said, not refused: a corpus may hold a few, and each trains on nothing
            texts = documents.data.column("text").to_pylist()
            say_repeats([{"text": t} if t.strip() else {"blank": i} for i, t in enumerate(texts)], source)
            blank = [i for i, text in enumerate(texts) if not text.strip()]
            if blank:
                lines = ", ".join(line_of(source, i) for i in blank[:3])
                text_files = any(BUILDERS.get(os.path.splitext(f)[1]) == "text" for f in local_files(source))
                fix = ", or set sample_by: paragraph to read what blank lines part as documents" if text_files else ""
                logger.warning(
                    "%s: %d empty document(s) (%s%s): no text (training learns only its BOS and EOS, perplexity leaves "
                    "it out); drop them%s",
                    named(source), len(blank), lines, ", ..." if len(blank) > 3 else "", fix,
                )  # fmt: skip
        if source.format in PREFERENCE_FIELDS or "completion" in fields:  # answers, or chat prompt/completion rows
            answers = [c for c in ANSWER_COLUMNS if c in fields]
            rows = documents.select_columns(answers).to_list()
            check_answers(rows, range(len(documents)), source)
            say_repeats(rows, source)
            say_contradictions(rows, source)
        fields = {}
    if not fields and tag is None:
        return documents
    kwargs = {"fields": fields, "source": source, "tag": tag}
    return documents.map(_check_and_tag, batched=True, with_indices=True, fn_kwargs=kwargs)


def _check_and_tag(batch: dict, indices: list[int], fields: dict[str, str], source: SourceConfig, tag) -> dict:
    for column, name in fields.items():
        values = batch.get(column) or [None] * len(indices)  # a key that no row of the batch has
        if None in values:
            where = row_of(source, indices[values.index(None)])
            raise UserError(f"{where}: no '{name}' (found as it streamed); fix or drop the row")
    if "messages" in fields:
        check_turns(batch["messages"], indices, source)
    if source.format in PREFERENCE_FIELDS or "completion" in fields:
        answers = [c for c in ANSWER_COLUMNS if c in fields]
        rows = [dict(zip(answers, row, strict=True)) for row in zip(*(batch[c] for c in answers), strict=True)]
        check_answers(rows, indices, source)
    return {} if tag is None else {"source": [tag] * len(indices)}


def recipe_inputs(recipe, args, model_args, recipe_path: str | None) -> list[str]:
    """Every path the recipe's data and model come from (for `outputs.claims.claim_output`, which skips
    those not on this machine): the recipe file, the model and tokenizer, the chat template,
    and each source's files with the folders they are found in (a pattern's folder, up to
    its first wildcard, counts whole: files written there would join the source)."""
    paths = [recipe_path, model_args.model_name_or_path, recipe.tokenizer_name_or_path]
    paths.append(getattr(args, "chat_template_path", None))
    for source in [*(recipe.mixture.sources if recipe.mixture else []), *recipe.eval_sources.values()]:
        patterns = source.data_files if source.data_files is not None else [source.path]
        for pattern in [patterns] if isinstance(patterns, str) else patterns:
            fixed = re.split(r"[*?\[]", pattern, maxsplit=1)[0]
            paths.append(pattern if fixed == pattern else os.path.dirname(fixed))
        paths += local_files(source)
    return [path for path in paths if path]


def _is_text(kind) -> bool:
    import pyarrow as pa

    return pa.types.is_string(kind) or pa.types.is_large_string(kind)
