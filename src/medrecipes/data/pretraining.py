"""Training and named evaluation sets for causal-LM pretraining, as packed token blocks."""

from medrecipes.data.mixture import build_mixture
from medrecipes.data.packing import pack_documents
from medrecipes.data.sources import load_source
from medrecipes.errors import UserError


def pretraining_data(recipe, tokenizer, max_length: int, num_proc: int | None = None):
    """(train blocks, {eval set name: blocks}) for a recipe's mixture and eval sets."""
    if recipe.mixture is None:
        raise UserError("recipe: no 'dataset_mixture'; add one with at least one source")
    train = pack_documents(build_mixture(recipe.mixture), tokenizer, max_length, num_proc)
    evals = {
        name: pack_documents(load_source(source), tokenizer, max_length, num_proc)
        for name, source in recipe.eval_sources.items()
    }
    return train, evals
