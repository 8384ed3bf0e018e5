"""Conversations for supervised fine-tuning, and the multiple-choice rows to score accuracy on."""

import logging

from datasets import Dataset

from medrecipes.data.mixture import build_mixture, training_mixture
from medrecipes.data.rows import say_unrendered_keys
from medrecipes.data.sources import load_mcq_source, load_source
from medrecipes.errors import UserError
from medrecipes.usmle import chat_messages, sft_target

logger = logging.getLogger(__name__)


def mcq_conversation(recipe):
    """A function from an MCQ row to {"messages": [system?, user question, assistant answer]}."""

    def render(row: dict) -> dict:
        messages = chat_messages(row, system_prompt=recipe.system_prompt, chain_of_thought=recipe.chain_of_thought)
        answer = sft_target(row, with_explanation=recipe.with_explanation, chain_of_thought=recipe.chain_of_thought)
        return {"messages": [*messages, {"role": "assistant", "content": answer}]}

    return render


def sft_data(recipe, completion_only_loss: bool | None = None, tokenizer=None):
    """(train conversations, {eval set: conversations}, {eval set: MCQ rows for accuracy}).
    `completion_only_loss` true: the rows must be prompt/completion ones (a chat source's layout is
    known once it is read; TRL masks nothing of a conversation by it, without a word). `tokenizer`:
    the one whose chat template renders the turns, where given (`say_unrendered_keys`)."""
    training_mixture(recipe)
    render = mcq_conversation(recipe)
    # Only training is restricted to `subjects`: evaluation reports every subject, so a
    # per-subject run shows what it gains and what it loses elsewhere.
    train = build_mixture(recipe.mixture, render, recipe.subjects)
    if recipe.with_explanation:
        _check_explained(train, recipe)
    if tokenizer is not None and "messages" in (train.column_names or []) and isinstance(train, Dataset):
        say_unrendered_keys(train.select(range(min(len(train), 1000)))["messages"], tokenizer, "dataset_mixture")
    evals = {name: load_source(source, render=render) for name, source in recipe.eval_sources.items()}
    mcq = {name: load_mcq_source(source) for name, source in recipe.eval_sources.items() if source.format == "usmle"}
    if completion_only_loss:
        for where, rows in {"dataset_mixture": train, **{f"eval_sets.{n}": d for n, d in evals.items()}}.items():
            if "messages" in (rows.column_names or []):
                raise UserError(
                    f"{recipe.recipe_file or 'recipe'}: {where}: completion_only_loss trains the completions of "
                    "prompt/completion rows, and these rows are conversations (messages); leave it out "
                    "(assistant_only_loss trains their answers), or give rows with prompt and completion"
                )
    return train, evals, mcq


def _check_explained(train, recipe) -> None:
    """with_explanation trains the rows' explanations before their 'Final Answer: X': rows that
    hold none are trained on that line alone, after a prompt that asks for reasoning. None of them
    explained is one line; some, a warning with their count."""
    if "messages" not in (train.column_names or []) or not hasattr(train, "__len__"):
        return  # a stream: read as it trains
    answers = [messages[-1]["content"] for messages in train["messages"] if messages[-1]["role"] == "assistant"]
    bare = sum(answer.startswith("Final Answer:") for answer in answers)
    where = recipe.recipe_file or "recipe"
    if answers and bare == len(answers):
        raise UserError(
            f"{where}: with_explanation trains each question's explanation, and none of the training rows holds "
            "one (an 'explanation' field); give rows that do, or set with_explanation: false"
        )
    if bare:
        logger.warning(
            "%s: with_explanation: %d of %d training answers have no explanation in their rows and are trained as "
            "'Final Answer: X' alone", where, bare, len(answers),
        )  # fmt: skip
