"""Load one data source as a dataset with a single `text` column.

A source's `path` is a `datasets` builder name (json, parquet, text, csv) used with
`data_files`, a local file or directory, or a Hub dataset id. `format: usmle` reads
multiple-choice rows through `medrecipes.usmle` and renders each as a document.
"""

import os

import datasets

from medrecipes.config import SourceConfig
from medrecipes.errors import UserError

BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".txt": "text", ".csv": "csv"}


def _looks_local(path: str) -> bool:
    return os.path.exists(path) or path.startswith((".", "/", "~")) or os.path.splitext(path)[1] in BUILDERS


def _load_documents(source: SourceConfig, streaming: bool):
    path, data_files = source.path, source.data_files
    if _looks_local(path):
        if not os.path.exists(path):
            raise UserError(f"source '{path}': no such file or directory")
        files = [path] if os.path.isfile(path) else sorted(
            os.path.join(root, name) for root, _, names in os.walk(path) for name in names
            if os.path.splitext(name)[1] in BUILDERS
        )
        if not files:
            raise UserError(f"source '{path}': no .json, .jsonl, .parquet, .txt or .csv files in it")
        path, data_files = BUILDERS[os.path.splitext(files[0])[1]], files
    if data_files is not None:
        missing = [f for f in ([data_files] if isinstance(data_files, str) else data_files) if "*" not in f and not os.path.exists(f) and "://" not in f]
        if missing:
            raise UserError(f"source '{source.path}': data file {missing[0]} does not exist")
    try:
        return datasets.load_dataset(
            path,
            name=source.name,
            split=source.split,
            data_files=data_files,
            data_dir=source.data_dir,
            revision=source.revision,
            streaming=streaming,
        )
    except (FileNotFoundError, ValueError, ConnectionError) as err:
        raise UserError(f"source '{source.path}': cannot load it ({str(err).splitlines()[0]})") from None


def load_source(source: SourceConfig, streaming: bool = False):
    """The source's documents as a Dataset (or IterableDataset when streaming) with one `text` column."""
    if source.format == "usmle":
        from medrecipes import usmle

        rows = usmle.load_mcq(source.data_files or source.path, split=source.split)
        documents = rows.map(lambda row: {"text": usmle.pretraining_text(row)}, remove_columns=rows.column_names)
        return documents.to_iterable_dataset() if streaming else documents
    documents = _load_documents(source, streaming)
    columns = documents.column_names
    if columns is not None and source.text_field not in columns:
        raise UserError(
            f"source '{source.path}': no column '{source.text_field}' (columns: {', '.join(columns)}); set text_field"
        )
    if columns is not None:
        documents = documents.select_columns([source.text_field])
    if source.text_field != "text":
        documents = documents.rename_column(source.text_field, "text")
    return documents
