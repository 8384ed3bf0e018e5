"""What a run's model card says of it beyond its resolved recipe, worked out once when the run is
settled and kept in run.json (`card`): the starting model, the adapters, the precision, every
data source with its revision and share of the mixture, and the decontamination result. The push
and `medrecipes card` render the card from run.json alone, wherever they run, without reading the
recipe or its data again."""

import hashlib
import os

from medrecipes.data.manifest import decontamination_summary
from medrecipes.data.rows import local_files
from medrecipes.data.sources import PREFERENCE_FIELDS
from medrecipes.locations import BUILDERS, looks_local
from medrecipes.outputs.records import written_about


def _hash_files(paths: list[str]) -> str:
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(os.path.relpath(path).encode())
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def is_hub_dataset(source) -> bool:
    return source.path not in BUILDERS.values() and not looks_local(source.path) and not os.path.exists(source.path)


def source_rows(sources) -> list[dict]:
    """One row per data source: where it comes from, which revision (a local file's is its content
    hash), its share of the mixture, and how `medrecipes pairs` made a file of preference data."""
    total = sum(s.weight for s in sources)
    rows = []
    for source in sources:
        made = []
        if source.revision:
            revision = source.revision
        elif is_hub_dataset(source):
            revision = "not pinned (the Hub's latest at training time)"
        else:
            files = local_files(source)
            count = f"{len(files)} file{'s' if len(files) > 1 else ''}"
            revision = f"sha256:{_hash_files(files)[:16]} ({count})" if files else "files not found"
            made = [about for about in map(written_about, files) if about]
        data_files = source.data_files if isinstance(source.data_files, list | type(None)) else [source.data_files]
        rows.append(
            {
                "path": source.path,
                "name": source.name or "",
                "split": source.split,
                "files": ", ".join(data_files or []),
                "revision": revision,
                "weight": f"{source.weight / total:.1%}",
                "format": source.format,
                "how": "; ".join(made)
                or ("not recorded (not written by `medrecipes pairs`)" if source.format in PREFERENCE_FIELDS else ""),
            }
        )
    return rows


# Each fact `card_facts` records, with the kinds of value it may hold: what the card reads back.
CARD_FACTS = {
    "base_model": str,
    "hub_base_model": (str, type(None)),
    "hub_datasets": list,
    "adapters": bool,
    "precision": str,
    "sources": list,
    "trained_splits": list,
    "decontamination": (str, type(None)),
}


def facts_problem(facts) -> str | None:
    """What is wrong with recorded card facts (a run.json edited or cut by hand), or None."""
    if not isinstance(facts, dict):
        return "no card facts"
    for key, kinds in CARD_FACTS.items():
        if key not in facts:
            return f"card facts without '{key}'"
        if not isinstance(facts[key], kinds):
            return f"card fact '{key}' is {type(facts[key]).__name__}"
    if not all(isinstance(row, dict) for row in facts["sources"]):
        return "card fact 'sources' holds a row that is not a mapping"
    return None


def card_facts(recipe, model_args, training_args) -> dict:
    """The run as its card describes it (plain JSON data, run.json's `card`)."""
    base = model_args.model_name_or_path
    scratch = recipe.init_from_scratch
    sources = recipe.mixture.sources if recipe.mixture else []
    return {
        "base_model": f"the `{recipe.architecture}` architecture, from scratch" if scratch else f"`{base}`",
        # the Hub's base_model and datasets metadata name Hub ids only
        "hub_base_model": None if scratch or not base or looks_local(base) or os.path.exists(base) else base,
        "hub_datasets": [s.path for s in sources if is_hub_dataset(s)],
        "adapters": bool(model_args.use_peft),
        "precision": "bf16" if training_args.bf16 else "fp16" if training_args.fp16 else "fp32",
        "sources": source_rows(sources),
        "trained_splits": sorted(
            {f"{s.path} {s.split}" + (f" ({s.data_files})" if s.data_files else "") for s in sources}
        ),
        "decontamination": decontamination_summary(recipe.built_data) if recipe.built_data else None,
    }
