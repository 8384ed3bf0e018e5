"""The manifest of a folder `medrecipes build-data` wrote, and training from that folder.

    manifest.json     sources, weights, tokens per source, tokenizer name and hash, block length,
                      seed, decontamination result, and the two keys below
    train/            packed training blocks (`datasets` save_to_disk: Arrow shards)
    eval/<name>/      packed blocks of each eval set

`recipe_key` covers what the recipe says about its data (the data keys, the tokenizer, the
block length) and is checked every time a run trains from the folder. `key` adds what the
sources hold (sha256 of local files, ETag or md5 for object storage, the resolved revision of
Hub datasets) and the number of blocks; build-data builds again exactly when it changes.
Neither contains a time, so a rebuild of unchanged data is skipped whenever it is asked for.
"""

import glob
import hashlib
import json
import logging
import os
import posixpath

import datasets
import fsspec

from medrecipes.data.sources import url_files
from medrecipes.data.stream import TokenStream
from medrecipes.data_config import SourceConfig
from medrecipes.errors import UserError
from medrecipes.locations import BUILDERS, is_url, looks_local

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT_VERSION = 2  # 2: blocks start with BOS where the tokenizer adds one
KEY_PARTS = {  # each as "built for ..." says it
    "data": "other data keys (dataset_mixture, eval_sets, decontaminate_against, dataset_num_proc)",
    "tokenizer": "another tokenizer",
    "max_length": "another max_length",
}


def digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def join(folder: str, *parts: str) -> str:
    return posixpath.join(folder, *parts) if is_url(folder) else os.path.join(folder, *parts)


def tokenizer_fingerprint(tokenizer) -> dict:
    """The tokenizer's name and a hash of everything that decides its ids (and the EOS between documents)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    spec = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    return {"name": tokenizer.name_or_path, "hash": digest([type(tokenizer).__name__, spec, tokenizer.eos_token_id])}


def recipe_key(recipe, tokenizer, max_length: int, num_proc: int | None) -> dict:
    return {**data_key(recipe, max_length, num_proc), "tokenizer": tokenizer_fingerprint(tokenizer)["hash"]}


def data_key(recipe, max_length: int, num_proc: int | None) -> dict:
    """The parts of `recipe_key` a recipe alone decides, without its tokenizer."""
    data = {
        "dataset_mixture": recipe.dataset_mixture,
        "eval_sets": recipe.eval_sets,
        "decontaminate_against": recipe.decontaminate_against,
        # Packing cuts a short block at every map batch, and num_proc moves those cuts.
        "dataset_num_proc": num_proc,
    }
    return {"data": digest(data), "max_length": max_length}


def file_fingerprint(path: str, storage_options: dict | None = None) -> str:
    """sha256 of a file's content; for object storage the ETag or md5 it reports, when it does."""
    fs, root = fsspec.core.url_to_fs(path, **(storage_options or {}))
    if is_url(path):
        info = fs.info(root)
        for key in ("ETag", "etag", "md5Hash", "crc32c", "md5"):
            if info.get(key):
                return f"{key}:{info[key]}"
    sha = hashlib.sha256()
    with fs.open(root, "rb") as f:
        while chunk := f.read(1 << 20):
            sha.update(chunk)
    return f"sha256:{sha.hexdigest()}"


def file_stamps(fingerprints: dict[str, str]) -> dict[str, dict]:
    """Each local file of `fingerprints` (path: content fingerprint) with its size and modification
    time: what a build read, checked cheaply when a run starts from it (`changed_since_built`)."""
    stamps = {}
    for path, fingerprint in fingerprints.items():
        if not is_url(path):
            stat = os.stat(path)
            stamps[path] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "fingerprint": fingerprint}
    return stamps


def changed_since_built(stamps: dict[str, dict]) -> str | None:
    """The first file a build read that is gone or holds other bytes now, with what changed; a file
    only touched (same bytes, by its fingerprint) has not changed. None where all are as built."""
    for path, then in stamps.items():
        try:
            stat = os.stat(path)
        except OSError:
            return f"{path} is gone"
        if (stat.st_size, stat.st_mtime_ns) == (then["size"], then["mtime_ns"]):
            continue
        if stat.st_size != then["size"] or file_fingerprint(path) != then["fingerprint"]:
            return f"{path} changed ({then['size']:,} bytes then, {stat.st_size:,} now)"
    return None


def source_files(source: SourceConfig) -> list[str] | None:
    """The local or object-storage files a source reads, or None for a Hub dataset."""
    path = source.path.removeprefix("file://")
    if path in BUILDERS.values():
        named = source.data_files or []
    elif is_url(path) or looks_local(path) or os.path.exists(path):
        named = path
    else:
        return None  # a Hub dataset, whatever data_files pick inside it
    files = []
    for entry in [named] if isinstance(named, str) else named:
        entry = entry.removeprefix("file://")
        if is_url(entry):
            files += url_files(entry, source.storage_options)
        elif os.path.isdir(entry):
            files += sorted(
                os.path.join(d, n)
                for d, _, names in os.walk(entry)
                for n in names
                if os.path.splitext(n)[1] in BUILDERS
            )
        else:
            files += sorted(glob.glob(entry))
    return files


def source_fingerprint(source: SourceConfig) -> dict:
    files = source_files(source)
    if files is not None:
        return {"files": {f: file_fingerprint(f, source.storage_options) for f in files}}
    try:
        from huggingface_hub import HfApi

        sha = HfApi().dataset_info(source.path, revision=source.revision).sha
    except Exception:  # offline, or a private dataset: the revision named is all there is
        sha = None
    return {"hub": source.path, "revision": source.revision, "sha": sha}


def read_manifest(folder: str) -> dict | None:
    path = join(folder, MANIFEST)
    fs, root = fsspec.core.url_to_fs(path)
    if not fs.exists(root):
        return None
    with fs.open(root) as f:
        return json.load(f)


def write_manifest(folder: str, manifest: dict) -> None:
    """Written last, so that a folder with a manifest is a complete build."""
    fs, root = fsspec.core.url_to_fs(join(folder, MANIFEST))
    with fs.open(root + ".tmp", "w") as f:
        json.dump(manifest, f, indent=2)
    fs.mv(root + ".tmp", root)


def load_built_data(recipe, tokenizer, max_length: int, num_proc: int | None = None):
    """(train blocks, {eval set: blocks}) from `recipe.built_data`, after checking it was built for this recipe."""
    folder = recipe.built_data
    manifest = read_manifest(folder)
    if manifest is None:
        raise UserError(f"built_data '{folder}': no {MANIFEST} there; build it with: medrecipes build-data RECIPE")
    check_built_data(folder, manifest, recipe_key(recipe, tokenizer, max_length, num_proc))
    logger.info(
        "training data from %s (%d blocks, built from %s)", folder, manifest["train"]["blocks"], manifest["recipe"]
    )
    train = datasets.load_from_disk(join(folder, "train"))
    if manifest["streaming"]:
        # The blocks were saved in the order the stream handed them out: read them in that order.
        train = TokenStream(train.to_iterable_dataset(), [s["name"] for s in manifest["sources"]], 0, manifest["seed"])
    evals = {name: datasets.load_from_disk(join(folder, "eval", name)) for name in manifest["eval_sets"]}
    return train, evals


def key_difference(built: dict, expected: dict) -> str | None:
    """What the recipe key a folder was built with says otherwise than `expected` (its parts that
    `expected` names), as words after "built for"; None where they agree."""
    for part, value in expected.items():
        if (then := built.get(part)) != value:
            if part == "max_length":
                return f"max_length {then}, and this recipe has {value}"
            return f"{KEY_PARTS[part]} than this recipe has"
    return None


def check_built_data(folder: str, manifest: dict, expected: dict) -> None:
    """Refuse a built folder whose manifest has other values for the parts of `expected`, or whose
    source files changed since the build."""
    if what := key_difference(manifest["recipe_key"], expected):
        raise UserError(
            f"built_data '{folder}' was built for {what}; build it again with: medrecipes build-data RECIPE"
        )
    if changed := changed_since_built(manifest.get("files") or {}):  # a build older than the stamps has none
        raise UserError(
            f"built_data '{folder}' was built from the sources as they were, and {changed} since; build it again "
            f"with: medrecipes build-data {manifest['recipe']}"
        )


def decontamination_summary(folder: str) -> str | None:
    """What a built folder's training data was checked against and what was found, as Markdown
    for a model card; None when the folder has no manifest or no check was recorded."""
    manifest = read_manifest(folder)
    report = (manifest or {}).get("decontamination")
    if not report:
        return None
    lines = [
        f"Training data checked for {report['n']}-word overlap ({report['normalisation']}) against "
        f"{len(report['benchmarks'])} evaluation set(s):",
        "",
    ]
    for name, bench in report["benchmarks"].items():
        lines.append(
            f"- {name}: {bench['contaminated_rows']} of {bench['rows']} items found in the training data"
            + (f" ({bench['too_short']} too short to check)" if bench["too_short"] else "")
        )
    for name, source in report["sources"].items():
        if source["contaminated"]:
            hits = ", ".join(f"{b} {c}" for b, c in source["by_benchmark"].items() if c)
            lines.append(
                f"- source {name}: {source['contaminated']} of {source['documents']} documents overlap ({hits})"
            )
    return "\n".join(lines)
