"""A weighted mixture of sources, built on `datasets.interleave_datasets`.

TRL's DatasetMixtureConfig concatenates datasets: it cannot upsample a small source or
stream, so the project interleaves by probability instead. With the default
`all_exhausted` stopping strategy a small source is repeated until every source has been
seen once, which is what a weight larger than a source's natural share asks for.
"""

import datasets

from medrecipes.config import MixtureConfig
from medrecipes.data.sources import load_source


def build_mixture(mixture: MixtureConfig, render=None, subjects: list[str] | None = None):
    """The mixture's rows, reproducible for a given seed; `render` and `subjects` as in load_source."""
    sets = [load_source(source, mixture.streaming, render, subjects) for source in mixture.sources]
    if len(sets) == 1:
        return sets[0].shuffle(seed=mixture.seed)
    total = sum(source.weight for source in mixture.sources)
    return datasets.interleave_datasets(
        sets,
        probabilities=[source.weight / total for source in mixture.sources],
        seed=mixture.seed,
        stopping_strategy=mixture.stopping_strategy,
    )
