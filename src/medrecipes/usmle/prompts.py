"""Prompts and targets from a row: lm-eval's completion prompt, chat turns, SFT targets and
pretraining text."""

from medrecipes.errors import UserError
from medrecipes.usmle.schema import Row, letters_for, option_map


def options_block(row: Row) -> str:
    """The options as lines "A. text", in letter order."""
    return "\n".join(f"{letter}. {text}" for letter, text in option_map(row).items())


def completion_prompt(row: Row) -> str:
    """The lm-evaluation-harness medqa_4options prompt, scored on " A", " B", ... after it."""
    context = f"Context: {row['context']}\n" if row.get("context") else ""
    return f"{context}Question: {row['question']}\n{options_block(row)}\nAnswer:"


def _instruction(row: Row, chain_of_thought: bool) -> str:
    letters = ", ".join(letters_for(row))
    if chain_of_thought:
        return (
            "Think through the question step by step, then give your answer on a last line "
            f"of the form 'Final Answer: X', where X is one of {letters}."
        )
    return f"Answer with the letter of the correct option ({letters}) only."


def chat_messages(row: Row, system_prompt: str | None = None, chain_of_thought: bool = False) -> list[dict[str, str]]:
    """Chat messages asking the question: an optional system turn and one user turn."""
    context = f"Context: {row['context']}\n\n" if row.get("context") else ""
    instruction = _instruction(row, chain_of_thought)
    user = f"{context}{row['question']}\n\n{options_block(row)}\n\n{instruction}"
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return messages + [{"role": "user", "content": user}]


def _require_gold(row: Row) -> str:
    if not row.get("answer"):
        raise UserError(
            f"row '{row.get('id', '')}': has no gold answer, so it cannot be a training target; "
            "drop unanswered rows (e.g. the MedMCQA test split) before building targets"
        )
    return row["answer"]


def sft_target(row: Row, with_explanation: bool = False, chain_of_thought: bool = False) -> str:
    """The assistant turn: "C. <option text>", or the explanation then "Final Answer: C"."""
    letter = _require_gold(row)
    if not (with_explanation or chain_of_thought):
        return f"{letter}. {option_map(row)[letter]}"
    explanation = row.get("explanation") or ""
    return f"{explanation}\n\nFinal Answer: {letter}".strip()


def preference_pair(row: Row, rejected_letter: str, system_prompt: str | None = None) -> dict:
    """TRL's conversational preference row for a question: the question as the SFT recipes ask
    it, the gold answer chosen and the option `rejected_letter` rejected, both in the answer
    style the SFT recipes train ("C. <option text>")."""
    gold = _require_gold(row)
    if rejected_letter == gold or rejected_letter not in option_map(row):
        raise ValueError(f"row '{row.get('id', '')}': {rejected_letter} is not a wrong option of the question")
    wrong = {**row, "answer": rejected_letter}
    return {
        "prompt": chat_messages(row, system_prompt=system_prompt),
        "chosen": [{"role": "assistant", "content": sft_target(row)}],
        "rejected": [{"role": "assistant", "content": sft_target(wrong)}],
    }


def pretraining_text(row: Row) -> str:
    """The row as one plain-text document; a row without gold ends at "Answer:"."""
    if not row.get("answer"):
        return completion_prompt(row)
    text = f"{completion_prompt(row)} {row['answer']}"
    return f"{text}\n{row['explanation']}" if row.get("explanation") else text
