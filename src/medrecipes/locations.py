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


# Chat templates shipped with the package (medrecipes/templates/<name>.jinja), package data so that
# they are there pip-installed; a recipe names one by name (chat_template_path: gemma) or by path.
SHIPPED_TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")


def shipped_templates() -> list[str]:
    return sorted(name.removesuffix(".jinja") for name in os.listdir(SHIPPED_TEMPLATES) if name.endswith(".jinja"))


def shipped_template(name: str) -> str | None:
    """The file of the chat template shipped as `name`, else None."""
    path = os.path.join(SHIPPED_TEMPLATES, f"{name}.jinja")
    return path if os.sep not in name and os.path.isfile(path) else None
