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


def unreachable(url: str) -> str | None:
    """Why fsspec cannot open a URL from this machine, in words for a message that starts with the
    key and its value: an address that cannot be read, a protocol it does not know, or one whose
    package is not installed; None for a local path or a URL it can open (whether the place exists
    is for the one who reads it)."""
    if not is_url(url):
        return None
    chain, _, rest = url.partition("://")  # chained: simplecache::s3://...; the last one's address
    if problem := _unreadable_address(f"{chain.rpartition('::')[2]}://{rest}"):
        return problem
    import fsspec

    for protocol in chain.split("::"):
        try:
            fsspec.get_filesystem_class(protocol)
        except ValueError:
            return f"{protocol}:// is no filesystem fsspec knows (s3://, gs://, hf://, file://, memory://, ...); fix the URL"
        except ImportError as err:  # fsspec's own words name the package: "Install s3fs to access S3"
            how = (  # the extra brings the object stores' packages; another protocol's is the user's to add
                "pip install -e '.[cloud]' brings s3fs and gcsfs"
                if protocol in ("s3", "s3a", "gs", "gcs")
                else "pip install the package it names"
            )
            return f"{protocol}:// needs a package not installed here ({err}); {how}"
    return None


# Protocols whose URL names a bucket (s3://BUCKET/...) or a server (ftp://HOST/...) before its path.
BUCKETS = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "oci"}
SERVERS = {"ftp", "sftp", "ssh", "smb", "http", "https", "webdav"}


def _unreadable_address(url: str) -> str | None:
    """What keeps a URL's address from being read, before anything connects to it: a port that is
    not a number from 0 to 65535, a bracket left open, no host or bucket where its protocol needs one
    (fsspec's own parse fails on these with a traceback, or reads ftp:///x as no host at all)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (read for its check: urllib raises on a port it cannot read)
    except ValueError as err:
        return f"its address cannot be read ({err}); fix the URL"
    if parts.scheme in BUCKETS | SERVERS and not parts.hostname:
        place = "BUCKET" if parts.scheme in BUCKETS else "HOST"
        return f"{parts.scheme}:// names no {place.lower()}; write {parts.scheme}://{place}/PATH"
    return None


def looks_local(path: str) -> bool:
    """A Hub id is "name" or "org/name"; anything else path-like is meant as a local path."""
    if os.path.splitext(path)[1] in BUILDERS or path.startswith((os.sep, ".", "~")):
        return True
    parts = path.split(os.sep)
    return len(parts) > 2 or (len(parts) == 2 and os.path.isdir(parts[0]))


def missing_local_model(path: str) -> bool:
    """A model path that cannot be a Hub id (org/name) and does not exist here."""
    return looks_local(path) and not os.path.exists(os.path.expanduser(path))


def local_path(path: str) -> bool:
    """A path meant on this machine: not a URL, and path-like or there (else a Hub id)."""
    return not is_url(path) and (looks_local(path) or os.path.exists(path))


def data_file(path: str) -> str:
    """A local file as `datasets` takes it in data_files, where *, ? and [ make a pattern: escaped,
    so that a file whose own name holds them (train[v2].jsonl) is read, not the files it would match."""
    import glob

    return glob.escape(path)


def saved_dataset(path: str) -> bool:
    """A folder `datasets`' save_to_disk wrote (one dataset, or a dict of splits): it is read whole with
    load_from_disk, not as data files (its state.json is no data)."""
    # The names datasets.config gives them, spelled here so that a leaf imports no library.
    return os.path.isdir(path) and any(
        os.path.isfile(os.path.join(path, name)) for name in ("state.json", "dataset_dict.json")
    )


def absent(path: str) -> str:
    """Why a path that is no file or folder is not one, in words for a message that then says what
    to do: a device, pipe or socket (/dev/null), a symbolic link whose chain loops, a symbolic link
    to a path that is gone, or no such file or folder (os.path.exists answers False for the last
    three), under the working folder where the path is relative."""
    import errno

    try:
        os.stat(path)
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "a symbolic link that leads back to itself"
    else:
        if not os.path.isfile(path) and not os.path.isdir(path):
            return "not a file or folder but a device, pipe or socket"
    if os.path.islink(path):
        return f"a symbolic link to {os.readlink(path)}, which does not exist"
    if not os.path.isabs(os.path.expanduser(path)):  # a recipe's relative paths read from another folder
        return f"no such file or folder under {os.getcwd()}, where relative paths start"
    return "no such file or folder"


def file_as_model(path: str) -> str | None:
    """What is wrong with a local model path that names a file (a .gguf model aside), in words for a
    message that starts with the key: the folder to pass where the file is one of a model's, else
    what a model is; None for anything else."""
    if not local_path(path) or path.endswith(".gguf") or not os.path.isfile(os.path.expanduser(path)):
        return None
    folder = os.path.dirname(path) or "."
    if any(os.path.isfile(os.path.join(folder, name)) for name in ("config.json", "adapter_config.json")):
        return f"{path} is one file of the model in {folder}; pass that folder"
    return (
        f"{path} is a file, not a model; pass a model's folder (a run's output_dir/final), a .gguf file or a Hub id "
        "(org/name)"
    )


# Chat templates shipped with the package (medrecipes/templates/<name>.jinja), package data so that
# they are there pip-installed; a recipe names one by name (chat_template_path: gemma) or by path.
SHIPPED_TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")


def shipped_templates() -> list[str]:
    return sorted(name.removesuffix(".jinja") for name in os.listdir(SHIPPED_TEMPLATES) if name.endswith(".jinja"))


def shipped_template(name: str) -> str | None:
    """The file of the chat template shipped as `name`, else None."""
    path = os.path.join(SHIPPED_TEMPLATES, f"{name}.jinja")
    return path if os.sep not in name and os.path.isfile(path) else None


def template_error(text: str) -> str | None:
    """Why a chat template does not compile as transformers compiles it (its sandbox and tags, the
    `generation` block among them), "line N: message"; None where it does."""
    from jinja2 import TemplateSyntaxError
    from transformers.utils.chat_template_utils import _compile_jinja_template

    try:
        _compile_jinja_template(text)
    except TemplateSyntaxError as err:
        return f"line {err.lineno}: {err.message}"
    return None


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf")
SAMPLED = 1 << 20  # bytes of each end of a weight file that a quick fingerprint reads
# A run's record of itself in its output_dir (`runs.record`), and its field holding the quick
# fingerprint of the local model the run started from.
RUN_RECORD = "run.json"
# Written by `medrecipes merge-lora` into the merged folder: the adapter it folded in, so that an
# evaluation of the merge can be told to be of that adapter's run (`medrecipes card`), and the
# merge asked as that run trained (`trained_system_prompt`).
MERGE_RECORD = "merged_from.json"
START_WEIGHTS = "weights"


def run_record(folder: str) -> dict | str | None:
    """The run record in `folder` as written; what is wrong with it where it is not a JSON mapping
    (the error's first line, or 'no mapping'); None where there is none. Its one reader: the runs
    layer refuses a damaged one, a model's loader passes it by."""
    import json

    path = os.path.join(folder, RUN_RECORD)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except (ValueError, UnicodeDecodeError) as err:
        return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    return record if isinstance(record, dict) else "no mapping"


def model_run_record(model_path: str) -> dict | str | None:
    """`run_record` of the run a saved model belongs to: its output_dir, the folder above final/
    or checkpoint-N."""
    return run_record(os.path.dirname(os.path.abspath(os.path.expanduser(model_path))))


def trained_system_prompt(model_path: str) -> tuple[bool, str | None]:
    """(whether the run that made a model is known, the system prompt it trained with or None): read
    from its run.json beside final/, or for a merge-lora folder, from its merged_from.json (which
    keeps it once the adapter is gone) or the run of the adapter it names."""
    recipe = _run_recipe(model_path)
    if recipe is None:  # a merge: as merge-lora recorded it, else as the adapter's run did
        merged = merge_record(model_path)
        adapter = merged.get("adapter")
        recipe = merged if "system_prompt" in merged else _run_recipe(adapter) if isinstance(adapter, str) else None
    return (False, None) if recipe is None else (True, recipe["system_prompt"] or None)


def merge_record(path: str) -> dict:
    """The merged_from.json that `medrecipes merge-lora` wrote into the model folder `path`; {} for a
    model that is not a merge, or whose record is unreadable (it is then only the weights it has)."""
    import json

    try:
        with open(os.path.join(os.path.expanduser(path), MERGE_RECORD), encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _run_recipe(model_path: str) -> dict | None:
    """The recipe in the run.json of the run that saved a local model, where it names a system prompt."""
    record = model_run_record(model_path) if local_path(model_path) else None
    recipe = record.get("recipe") if isinstance(record, dict) else None
    return recipe if isinstance(recipe, dict) and "system_prompt" in recipe else None


def system_prompt_note(model_path: str, asked: str | None, flag: str) -> str | None:
    """One line where a model is asked with another system turn (or none) than the run that made it
    (its run.json beside final/) trained with: its answers are then to prompts it was not trained
    on. `flag` is the command's option that gives one."""
    known, trained = trained_system_prompt(model_path)
    if not known or trained == asked:
        return None
    return (
        f"{model_path} was trained with {f'the system prompt {trained!r}' if trained else 'no system prompt'} (its "
        f"run's run.json), and is asked with {f'{asked!r}' if asked else 'none'}: its answers are to prompts it was "
        f"not trained on; {f'pass {flag} {trained!r}' if trained else f'leave {flag} out'} to ask as it was trained"
    )


def weights_fingerprint(path: str, ends: int | None = None) -> str | None:
    """ "sha256:" and 16 hex digits of a local model's (or adapter's) weight files, names and
    contents, in the folder itself: what tells one model from another whatever its path (a copy
    has the same); None for a Hub id or a folder without weights. Reads every weight once, or with
    `ends`, only each file's size and its first and last `ends` bytes: a fingerprint a run can take
    at every start of a sharded 27B model, where a model trained again differs in every tensor, so
    at the ends of every file."""
    folder = os.path.expanduser(path)
    if os.path.isfile(folder) and folder.endswith(WEIGHT_SUFFIXES):  # a .gguf file
        folder, names = os.path.dirname(folder), [os.path.basename(folder)]
    elif os.path.isdir(folder):
        names = sorted(n for n in os.listdir(folder) if n.endswith(WEIGHT_SUFFIXES) and not n.startswith("."))
    else:
        return None
    if not names:
        return None
    return files_fingerprint([os.path.join(folder, name) for name in names], ends)


def files_fingerprint(paths: list[str], ends: int | None = None) -> str:
    """ "sha256:" and 16 hex digits of the files at `paths`, in order: each one's name and contents,
    or with `ends` its size and its first and last `ends` bytes (see `weights_fingerprint`)."""
    import hashlib

    digest = hashlib.sha256()
    for path in paths:
        digest.update(os.path.basename(path).encode() + b"\0")
        with open(path, "rb") as f:
            if ends is not None:
                size = os.fstat(f.fileno()).st_size
                digest.update(f"{size}\0".encode() + f.read(ends))
                f.seek(max(size - ends, 0))
                digest.update(f.read(ends))
                continue
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
    return f"sha256:{digest.hexdigest()[:16]}"
