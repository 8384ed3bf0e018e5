"""A weighted mixture of sources, built on `datasets.interleave_datasets`.

TRL's DatasetMixtureConfig concatenates datasets: it cannot upsample a small source or
stream, so the project interleaves by probability instead. With the default
`all_exhausted` stopping strategy a small source is repeated until every source has been
seen once, which is what a weight larger than a source's natural share asks for;
`first_exhausted` stops at the end of the first source to run out and repeats nothing.
"""

import logging
import math
import os
from itertools import islice

import datasets

from medrecipes.data.packing import token_ids
from medrecipes.data.rows import files_of
from medrecipes.data.sources import load_source
from medrecipes.data_config import MixtureConfig
from medrecipes.errors import UserError, bad_lines_named

logger = logging.getLogger(__name__)

# Documents per source whose token length is measured to turn token weights into document ones.
LENGTH_SAMPLE_DOCUMENTS = 1000


def source_names(mixture: MixtureConfig) -> list[str]:
    """A short unique name per source for logs and manifests: the Hub id or the file's folder/stem."""
    names = []
    for source in mixture.sources:
        files = source.data_files if isinstance(source.data_files, list) else [source.data_files]
        where = files[0] if source.data_files else source.path
        stem = os.path.splitext(where.rstrip("/").split("://")[-1])[0]
        name = "/".join(stem.split("/")[-2:])
        names.append(name if name not in names else f"{name}#{len(names)}")
    return names


def mean_document_tokens(documents, tokenizer) -> float:
    """Mean tokens per document (EOS included) over the first LENGTH_SAMPLE_DOCUMENTS documents."""
    texts = [row["text"] for row in islice(iter(documents), LENGTH_SAMPLE_DOCUMENTS)]
    if not texts:
        return 1.0
    return sum(len(ids) + 1 for ids in token_ids(tokenizer, texts)) / len(texts)


def training_mixture(recipe, sources: str = "source") -> MixtureConfig:
    """The recipe's dataset_mixture, which every training run needs; one line naming the recipe
    file where it has none (null, or left out)."""
    if recipe.mixture is None:
        raise UserError(
            f"{recipe.recipe_file or 'command line'}: no 'dataset_mixture'; add one with at least one {sources}"
        )
    return recipe.mixture


def document_probabilities(mixture: MixtureConfig, sets: list, tokenizer=None) -> tuple[list[float], list[float]]:
    """(probability of drawing each source's next document, measured mean tokens per document).

    Interleaving draws documents. For `weight_unit: tokens`, source i must supply a share w_i
    of tokens; a draw from it yields L_i tokens on average, so drawing it with probability
    proportional to w_i / L_i makes its expected token share w_i. L_i is measured on the first
    documents of each source: a sample, so the shares hold to within its error, and the
    per-source token counts logged during training show what was actually reached.
    """
    weights = [source.weight for source in mixture.sources]
    lengths = []
    if mixture.weight_unit == "tokens":
        if tokenizer is None:
            raise UserError("dataset_mixture: weight_unit tokens needs a tokenizer; it is for pretraining recipes")
        lengths = [mean_document_tokens(documents, tokenizer) for documents in sets]
        weights = [w / length for w, length in zip(weights, lengths, strict=True)]
    total = sum(weights)
    return [w / total for w in weights], lengths


def build_mixture(
    mixture: MixtureConfig,
    render=None,
    subjects: list[str] | None = None,
    tokenizer=None,
    tag_sources: bool = False,
):
    """The mixture's rows, reproducible for a given seed; `render` and `subjects` as in load_source.

    `tokenizer` measures document lengths for `weight_unit: tokens`; `tag_sources` adds a
    `source` column with each row's source index. A streaming pretraining mixture is left in
    source order here: `medrecipes.data.stream.TokenStream` shuffles its packed blocks.
    """
    with bad_lines_named(files_of(mixture.sources)):  # a stream is read here to find its columns
        return _mixed(mixture, render, subjects, tokenizer, tag_sources)


# How many times its sources' rows a mixture may draw before it is refused as a weight slip.
MOST_DRAWS = 100


def _check_mixture_length(mixture: MixtureConfig, sizes: list[int], probabilities: list[float]) -> None:
    """`datasets.interleave_datasets` draws until every source is used whole (all_exhausted) or
    one is (first_exhausted): about size / probability rows for the source that ends it. A
    weight so small (or so large) that this is more than MOST_DRAWS times all the rows builds for
    hours, or never ends: one line naming the source instead."""
    draws = [size / p if p > 0 else math.inf for size, p in zip(sizes, probabilities, strict=True)]
    ending = max if mixture.stopping_strategy == "all_exhausted" else min
    rows = ending(draws)
    if len(sizes) > 1 and rows > MOST_DRAWS * sum(sizes):
        at = draws.index(rows)
        raise UserError(
            f"dataset_mixture: source {source_names(mixture)[at]} ({sizes[at]:,} rows) is drawn with probability "
            f"{probabilities[at]:.3g}, so the mixture would draw about {rows:,.0f} rows before "
            f"{'every source is used whole' if ending is max else 'it is used whole'} ({mixture.stopping_strategy}), "
            f"over {MOST_DRAWS} times its {sum(sizes):,} rows; give the sources weights nearer their sizes"
        )


def _mixed(mixture: MixtureConfig, render, subjects, tokenizer, tag_sources: bool):
    sets = [
        load_source(source, mixture.streaming, render, subjects, tag=i if tag_sources else None, seed=mixture.seed)
        for i, source in enumerate(mixture.sources)
    ]
    probabilities, lengths = document_probabilities(mixture, sets, tokenizer)
    if lengths:
        for name, length, p in zip(source_names(mixture), lengths, probabilities, strict=True):
            logger.info("source %s: %.1f tokens per document; drawn with probability %.4f", name, length, p)
    if not mixture.streaming:
        _check_mixture_length(mixture, [len(rows) for rows in sets], probabilities)
    if len(sets) == 1:
        # A tagged stream is a pretraining stream, whose blocks TokenStream shuffles with a
        # position it can restore; datasets' own shuffle buffer is lost on resume.
        return sets[0] if mixture.streaming and tag_sources else sets[0].shuffle(seed=mixture.seed)
    return datasets.interleave_datasets(
        [_plain_strings(rows) for rows in sets],
        probabilities=probabilities,
        seed=mixture.seed,
        stopping_strategy=mixture.stopping_strategy,
    )


def _plain_strings(rows):
    """`rows` with its text columns as Arrow's plain strings: JSON's arrive as large strings and
    CSV's and Parquet's as plain ones, which `interleave_datasets` refuses to align (its features
    must match). A stream whose columns are not known yet is left as it is."""
    features = rows.features or {}
    for name, feature in features.items():
        if isinstance(feature, datasets.Value) and feature.dtype == "large_string":
            rows = rows.cast_column(name, datasets.Value("string"))
    return rows
