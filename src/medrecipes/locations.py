"""Where a name points: a local file or folder, an fsspec URL, or a Hub id.

A leaf: the MCQ loader, the data pipeline, model loading and the Hub card all ask the same
question of a path, and none of them should import another to ask it.
"""

import os

# File suffixes the data loaders read, and the `datasets` builder that reads each.
BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".txt": "text", ".csv": "csv"}


def is_url(path: str) -> bool:
    """An fsspec URL such as s3://bucket/corpus/*.jsonl (object storage, memory://, file://)."""
    return "://" in path


def looks_local(path: str) -> bool:
    """A Hub id is "name" or "org/name"; anything else path-like is meant as a local path."""
    if os.path.splitext(path)[1] in BUILDERS or path.startswith((os.sep, ".", "~")):
        return True
    parts = path.split(os.sep)
    return len(parts) > 2 or (len(parts) == 2 and os.path.isdir(parts[0]))
