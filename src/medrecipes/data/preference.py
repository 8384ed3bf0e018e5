"""Preference data for DPO: pairs built from multiple-choice questions, and the recipe's mixture
of preference sources (TRL's layout: prompt, chosen, rejected; plain text or conversational)."""

import random

from medrecipes import usmle
from medrecipes.data.mixture import build_mixture
from medrecipes.data.sources import load_source
from medrecipes.errors import UserError


def mcq_pairs(rows, system_prompt: str | None = None, seed: int = 42) -> list[dict]:
    """One conversational pair per answered question: the gold answer chosen against a wrong
    option drawn with `seed`, as the SFT recipes ask and answer (usmle.preference_pair)."""
    rng = random.Random(seed)
    pairs = []
    for row in rows:
        wrong = [letter for letter in usmle.option_map(row) if letter != row["answer"]]
        if wrong:
            pairs.append({"id": row["id"], **usmle.preference_pair(row, rng.choice(wrong), system_prompt)})
    return pairs


def preference_data(recipe):
    """(train pairs, {eval set: pairs}) from the recipe's preference sources."""
    if recipe.mixture is None:
        raise UserError("recipe: no 'dataset_mixture'; add one with at least one preference source")
    train = build_mixture(recipe.mixture)
    evals = {name: load_source(source) for name, source in recipe.eval_sources.items()}
    return train, evals
