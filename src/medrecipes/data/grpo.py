"""Prompts for GRPO: multiple-choice rows as chat or plain prompts, with the columns the rewards read."""

import logging

from medrecipes.data.mixture import build_mixture, training_mixture
from medrecipes.data.sources import load_mcq_source, load_source
from medrecipes.errors import UserError
from medrecipes.usmle import chat_messages, completion_prompt

logger = logging.getLogger(__name__)


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
    """(train prompts, {eval set: prompts}, {eval set: MCQ rows for accuracy}); every source is a
    multiple-choice one (`format: usmle`, checked when the recipe was parsed: config.methods)."""
    training_mixture(recipe)
    render = mcq_prompt(recipe, prompt_format)
    # As for SFT, only training is restricted to `subjects`; evaluation covers every subject.
    train = build_mixture(recipe.mixture, render, recipe.subjects)
    evals = {name: load_source(source, render=render) for name, source in recipe.eval_sources.items()}
    mcq = {name: load_mcq_source(source) for name, source in recipe.eval_sources.items()}
    return train, evals, mcq


def prompt_tokens(tokenizer, prompt) -> int:
    """The tokens of a prompt as TRL gives it to the model: a chat's messages through the template
    with the turn that opens the answer, a plain prompt as text."""
    if isinstance(prompt, list):  # the template writes the special tokens itself
        text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])
    return len(tokenizer(prompt)["input_ids"])


def fit_prompts(dataset, tokenizer, room: int | None, where: str):
    """The prompts of `dataset` that leave the completion its room: `room` is the model's positions
    less max_completion_length (TRL 1.16 has no max_prompt_length; a longer prompt would make the
    model generate past its positions, or a prompt of 30,000 tokens grow generation's memory without
    bound). Those that do not fit are left out and counted in a warning; all of them is one line."""
    if room is None or room <= 0:  # no limit; or a completion as long as the model, which check_positions refuses
        return dataset
    fits = [prompt_tokens(tokenizer, prompt) <= room for prompt in dataset["prompt"]]
    left_out = len(fits) - sum(fits)
    if left_out == len(fits):
        raise UserError(
            f"{where}: every one of its {len(fits)} prompts is longer than the {room} tokens the model's positions "
            "leave it beside max_completion_length; lower max_completion_length or use shorter questions"
        )
    if left_out:
        logger.warning(
            "%s: %d of %d prompts are longer than the %d tokens the model's positions leave beside "
            "max_completion_length; they are left out",
            where,
            left_out,
            len(fits),
            room,
        )
        dataset = dataset.select([i for i, fit in enumerate(fits) if fit])
    return dataset
