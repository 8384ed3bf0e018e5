"""`medrecipes build-data`: tokenise, pack and save a recipe's data once, with a manifest.

The folder holds exactly the blocks a run would make from the sources (for a streaming
mixture, the first blocks of the stream, shuffled and in order, as many as the run consumes),
so a run that names it in `built_data` sees the same batches without tokenising anything.
The manifest (see medrecipes.data.manifest) records what went in and how many tokens of each
source came out, and the result of checking the training data against the evaluation sets.
"""

import logging
import os
import shutil
import tempfile
from itertools import islice

import datasets
import fsspec
import numpy as np
import tokenizers
import transformers
from datasets import Features, List, Value

import medrecipes
from medrecipes.config import SourceConfig, resolve_token_budget
from medrecipes.data import decontamination as dc
from medrecipes.data.manifest import (
    FORMAT_VERSION,
    digest,
    file_stamps,
    join,
    key_difference,
    read_manifest,
    recipe_key,
    source_fingerprint,
    tokenizer_fingerprint,
    write_manifest,
)
from medrecipes.data.mixture import document_probabilities, source_names
from medrecipes.data.pretraining import source_data
from medrecipes.data.sources import load_source, recipe_inputs
from medrecipes.errors import UserError
from medrecipes.outputs.claims import claim_output
from medrecipes.outputs.records import mark

logger = logging.getLogger(__name__)

BLOCK_FEATURES = Features(
    {
        "input_ids": List(Value("int32")),
        "source_tokens": List(Value("int64")),
        "source_documents": List(Value("int64")),
    }
)
MAX_SHARD_SIZE = "500MB"


def blocks_needed(recipe, args, path: str, num_processes: int) -> int | None:
    """Blocks a run on `num_processes` processes consumes from a streaming mixture (None: not streaming).
    The recipe's token budget is worked out for that many processes either way: a count it cannot
    be split over is refused here, as the run would refuse it."""
    resolve_token_budget(recipe, args, path, world_size=num_processes)
    if not recipe.mixture.streaming:
        return None  # a streaming one has max_steps (config.checks.check_stream_length)
    return args.max_steps * args.gradient_accumulation_steps * args.per_device_train_batch_size * num_processes


def content_key(recipe, tokenizer, args, blocks: int | None) -> tuple[dict, str, dict]:
    """(recipe key, full key, the files the sources and eval sets read as they are now: `file_stamps`):
    the second key also covers what the sources hold and the number of blocks."""
    rkey = recipe_key(recipe, tokenizer, args.max_length, args.dataset_num_proc)
    sources = [source_fingerprint(s) for s in recipe.mixture.sources]
    eval_sets = {name: source_fingerprint(s) for name, s in recipe.eval_sources.items()}
    contents = {
        "format": FORMAT_VERSION,
        "recipe_key": rkey,
        "sources": sources,
        "eval_sets": eval_sets,
        "decontaminate_against": [
            source_fingerprint(SourceConfig(path=p)) for p in recipe.decontaminate_against or []
        ],
        "blocks": blocks,
    }
    read = {f: fp for s in [*sources, *eval_sets.values()] for f, fp in s.get("files", {}).items()}
    return rkey, digest(contents), file_stamps(read)


def _per_source(dataset, column: str, width: int) -> np.ndarray:
    total = np.zeros(width, dtype=np.int64)
    for batch in dataset.with_format("arrow").iter(batch_size=10_000):
        total += batch.column(column).combine_chunks().flatten().to_numpy().reshape(-1, width).sum(axis=0)
    return total


def _clear(folder: str) -> None:
    fs, root = fsspec.core.url_to_fs(folder)
    for part in ("manifest.json", "train", "eval"):
        if fs.exists(f"{root}/{part}"):
            fs.rm(f"{root}/{part}", recursive=True)


def _save_stream(stream, blocks: int, folder: str, key: str) -> datasets.Dataset:
    """The first `blocks` blocks of the stream, written through a local Arrow cache to `folder`."""
    cache = tempfile.mkdtemp(prefix="medrecipes-build-")
    try:
        train = datasets.Dataset.from_generator(
            lambda: islice(iter(stream), blocks), features=BLOCK_FEATURES, cache_dir=cache, fingerprint=key
        )
        train.save_to_disk(folder, max_shard_size=MAX_SHARD_SIZE)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return datasets.load_from_disk(folder)


def build_data(
    recipe, args, model_args, recipe_path: str, out: str | None = None, num_processes: int = 1, force: bool = False
) -> tuple[dict, bool]:
    """Build the recipe's data into `out` (default: its `built_data`); returns (manifest, built).

    Nothing is built when the folder's manifest has the same content key, unless `force`.
    """
    from medrecipes.models.loading import recipe_tokenizer

    out = out or recipe.built_data
    if not out:
        raise UserError(f"{recipe_path}: no built_data folder; set built_data in the recipe or pass --out DIR")
    # An earlier build here is ours to replace (it is rebuilt when out of date).
    claim_output(
        out, "built-data", "build-data", recipe_inputs(recipe, args, model_args, recipe_path), True, folder=True
    )
    if recipe.mixture is None:
        raise UserError(f"{recipe_path}: no 'dataset_mixture'; add one with at least one source")
    tokenizer = recipe_tokenizer(recipe, model_args)
    blocks = blocks_needed(recipe, args, recipe_path, num_processes)
    rkey, key, stamps = content_key(recipe, tokenizer, args, blocks)
    old = read_manifest(out)
    if old is not None and old.get("key") == key and not force:
        logger.info("%s is up to date with %s; nothing to build", out, recipe_path)
        if old.get("files") != stamps:  # the same bytes, touched since: a run then need not read them again
            write_manifest(out, old := {**old, "files": stamps})
        return old, False
    if old is not None and (what := key_difference(old.get("recipe_key") or {}, rkey)):
        logger.warning(
            "build-data: %s held a build for %s (built from %s); it is built again in its place, and a run of the "
            "earlier recipe will refuse it: give each recipe its own --out", out, what, old.get("recipe"),
        )  # fmt: skip

    _clear(out)
    if "://" not in out:  # a partial build, killed, is still ours to rebuild
        os.makedirs(out, exist_ok=True)
        mark(out, "built-data")
    mixture, names = recipe.mixture, source_names(recipe.mixture)
    train, evals = source_data(recipe, tokenizer, args.max_length, args.dataset_num_proc)
    if blocks is not None:
        train = _save_stream(train, blocks, join(out, "train"), key)
    else:
        train.save_to_disk(join(out, "train"), max_shard_size=MAX_SHARD_SIZE)
    tokens = _per_source(train, "source_tokens", len(names))
    documents = _per_source(train, "source_documents", len(names))
    eval_record = {}
    for name, blocks_of_set in evals.items():
        blocks_of_set.save_to_disk(join(out, "eval", name))
        eval_record[name] = {"blocks": len(blocks_of_set), "tokens": int(sum(map(len, blocks_of_set["input_ids"])))}

    # A stream used only its first documents of each source (the one cut by the last block too).
    used = {name: int(d) + 1 for name, d in zip(names, documents, strict=True)} if mixture.streaming else None
    benchmarks = dc.recipe_benchmarks(recipe)
    report = None
    if benchmarks:
        sources = dict(zip(names, mixture.sources, strict=True))
        report, _ = dc.check_sources(sources, benchmarks, streaming=mixture.streaming, limits=used)
    if report and report["contaminated_documents"]:
        found = ", ".join(f"{b}: {r['contaminated_rows']} items" for b, r in report["benchmarks"].items())
        logger.warning(
            "training data overlaps evaluation sets (%s); see %s, and drop those documents with "
            "medrecipes decontaminate --train %s --drop DIR",
            found,
            join(out, "manifest.json"),
            recipe_path,
        )
    probabilities, lengths = document_probabilities(
        mixture, [load_source(s, mixture.streaming) for s in mixture.sources], tokenizer
    )
    manifest = {
        "format_version": FORMAT_VERSION,
        "key": key,
        "recipe_key": rkey,
        "recipe": recipe_path,
        "files": stamps,  # what a run from the build checks its sources against (`manifest.changed_since_built`)
        "sources": [
            # storage_options may hold credentials: they stay out of the manifest.
            {
                "name": name,
                **{k: v for k, v in vars(source).items() if v is not None and k != "storage_options"},
                "probability": p,
            }
            for name, source, p in zip(names, mixture.sources, probabilities, strict=True)
        ],
        "weight_unit": mixture.weight_unit,
        "mean_tokens_per_document": dict(zip(names, lengths, strict=False)),
        "seed": mixture.seed,
        "streaming": mixture.streaming,
        "stopping_strategy": mixture.stopping_strategy,
        "shuffle_buffer": mixture.shuffle_buffer if mixture.streaming else None,
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "max_length": args.max_length,
        "num_processes": num_processes if mixture.streaming else None,
        "train": {"blocks": len(train), "tokens": int(tokens.sum())},
        "tokens_per_source": dict(zip(names, tokens.tolist(), strict=True)),
        "documents_per_source": dict(zip(names, documents.tolist(), strict=True)),
        "eval_sets": eval_record,
        "decontamination": report,
        "versions": {
            "medrecipes": medrecipes.__version__,
            "datasets": datasets.__version__,
            "tokenizers": tokenizers.__version__,
            "transformers": transformers.__version__,
        },
    }
    write_manifest(out, manifest)
    logger.info("built %s: %d training blocks, %d tokens", out, len(train), int(tokens.sum()))
    return manifest, True
