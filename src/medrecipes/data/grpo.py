"""Prompts for GRPO: multiple-choice rows as chat or plain prompts, with the columns the rewards read."""

from medrecipes.data.mixture import build_mixture
from medrecipes.data.sources import load_mcq_source, load_source
from medrecipes.errors import UserError
from medrecipes.usmle import chat_messages, completion_prompt


def mcq_prompt(recipe, prompt_format: str):
    """A function from an MCQ row to {"prompt", "answer", "options"}: the prompt TRL samples
    completions for, and the gold letter and option texts that the rewards score them with."""

    def render(row: dict) -> dict:
        if prompt_format == "chat":
            prompt = chat_messages(row, system_prompt=recipe.system_prompt, chain_of_thought=recipe.chain_of_thought)
        else:
            prompt = completion_prompt(row)
        return {"prompt": prompt, "answer": row["answer"], "options": row["options"]}

    return render


def grpo_data(recipe, prompt_format: str):
    """(train prompts, {eval set: prompts}, {eval set: MCQ rows for accuracy})."""
    if recipe.mixture is None:
        raise UserError("recipe: no 'dataset_mixture'; add one with at least one source")
    sources = {f"dataset_mixture source '{s.path}'": s for s in recipe.mixture.sources}
    sources.update({f"eval_sets.{name}": s for name, s in recipe.eval_sources.items()})
    for where, source in sources.items():
        if source.format != "usmle":
            raise UserError(
                f"recipe: {where} has format '{source.format}'; GRPO scores answers against gold letters, "
                "so every source needs format: usmle"
            )
    render = mcq_prompt(recipe, prompt_format)
    # As for SFT, only training is restricted to `subjects`; evaluation covers every subject.
    train = build_mixture(recipe.mixture, render, recipe.subjects)
    evals = {name: load_source(source, render=render) for name, source in recipe.eval_sources.items()}
    mcq = {name: load_mcq_source(source) for name, source in recipe.eval_sources.items()}
    return train, evals, mcq
