"""Copy a checkpoint folder to object storage (s3://, gs://, ...) or any fsspec URL.

For mirroring checkpoints off the training machine. Object stores have no atomic rename of a
folder, so the copy writes every file first and a small index (`COPY_INDEX`: names and sizes)
last: a copy with its index is complete, and `is_complete_copy` checks it. s3:// and gs://
need the `s3fs` / `gcsfs` packages (`pip install medrecipes[cloud]`); memory:// and file://
work out of the box.
"""

import json
import os

import fsspec

from medrecipes.errors import UserError

COPY_INDEX = ".medrecipes-copy.json"


def copy_to_url(folder: str, url: str, storage_options: dict | None = None) -> list[str]:
    """Copy every file under `folder` to `url` (keeping relative paths); returns the paths written."""
    if not os.path.isdir(folder):
        raise UserError(f"copy: {folder} is not a folder")
    try:
        fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    except (ImportError, ValueError) as err:
        raise UserError(f"copy: cannot open {url} ({err}); for s3:// or gs:// install medrecipes[cloud]") from None
    root = root.rstrip("/")
    files = sorted(os.path.relpath(os.path.join(d, n), folder) for d, _, names in os.walk(folder) for n in names)
    if fs.exists(f"{root}/{COPY_INDEX}"):
        fs.rm(f"{root}/{COPY_INDEX}")  # the copy below replaces an older one: not complete until done
    written = []
    for name in files:
        target = f"{root}/{name.replace(os.sep, '/')}"
        fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
        fs.put_file(os.path.join(folder, name), target)
        written.append(target)
    index = {name.replace(os.sep, "/"): os.path.getsize(os.path.join(folder, name)) for name in files}
    with fs.open(f"{root}/{COPY_INDEX}", "w") as f:
        json.dump(index, f)
    return written


def is_complete_copy(url: str, storage_options: dict | None = None) -> bool:
    """Whether `url` holds a finished copy: its index is there and every file has the size listed."""
    fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
    root = root.rstrip("/")
    if not fs.exists(f"{root}/{COPY_INDEX}"):
        return False
    with fs.open(f"{root}/{COPY_INDEX}") as f:
        index = json.load(f)
    return all(fs.exists(f"{root}/{name}") and fs.size(f"{root}/{name}") == size for name, size in index.items())
