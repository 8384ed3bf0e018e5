"""Training and named evaluation sets for causal-LM pretraining, as packed token blocks.

They come from the recipe's sources, or, when the recipe names `built_data`, from the folder
`medrecipes build-data` wrote for it (the same blocks, already tokenised and packed).
A streaming mixture is a `TokenStream`, whose position is saved with each checkpoint.
"""

from medrecipes.data.manifest import load_built_data
from medrecipes.data.mixture import build_mixture, source_names, training_mixture
from medrecipes.data.packing import pack_documents
from medrecipes.data.rows import files_of
from medrecipes.data.sources import load_source
from medrecipes.data.stream import TokenStream


def source_data(recipe, tokenizer, max_length: int, num_proc: int | None = None):
    """(train blocks, {eval set name: blocks}) tokenised and packed from the recipe's sources."""
    training_mixture(recipe)
    mixture, names = recipe.mixture, source_names(recipe.mixture)
    documents = build_mixture(mixture, tokenizer=tokenizer, tag_sources=True)
    train = pack_documents(documents, tokenizer, max_length, num_proc, num_sources=len(names))
    if mixture.streaming:
        train = TokenStream(train, names, mixture.shuffle_buffer, mixture.seed, files_of(mixture.sources))
    evals = {
        name: pack_documents(load_source(source), tokenizer, max_length, num_proc)
        for name, source in recipe.eval_sources.items()
    }
    return train, evals


def pretraining_data(recipe, tokenizer, max_length: int, num_proc: int | None = None):
    """(train blocks, {eval set name: blocks}) for a recipe: from `built_data` when it names a folder."""
    if recipe.built_data:
        return load_built_data(recipe, tokenizer, max_length, num_proc)
    return source_data(recipe, tokenizer, max_length, num_proc)
