"""Multiple-choice accuracy of a chat model: generate an answer, extract its letter, score it.

Questions are asked with the project's chat prompt (`usmle.chat_messages`), answered greedily,
and read with the shared extractor; an answer the extractor cannot read counts as wrong and
is reported as unparseable. Accuracy comes with a Wilson 95% interval, overall and by subject.
"""

import math
from collections import defaultdict

import torch

from medrecipes.usmle import chat_messages, extract_answer, letters_for, option_map

# Enough for "C. <option text>"; chain-of-thought answers need room to reason first.
LETTER_TOKENS = 16
REASONING_TOKENS = 512


def wilson_interval(correct: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (0.0, 0.0)
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


@torch.no_grad()
def generate_answers(
    model, tokenizer, rows, system_prompt=None, chain_of_thought=False, max_new_tokens=None, batch_size=16
) -> list[str]:
    """Greedy completions of each row's chat prompt, in row order."""
    max_new_tokens = max_new_tokens or (REASONING_TOKENS if chain_of_thought else LETTER_TOKENS)
    prompts = [
        tokenizer.apply_chat_template(
            chat_messages(row, system_prompt=system_prompt, chain_of_thought=chain_of_thought),
            add_generation_prompt=True,
            tokenize=False,
        )
        for row in rows
    ]
    was_training = model.training
    model.eval()
    completions = []
    for start in range(0, len(prompts), batch_size):
        # The template already holds BOS; left padding keeps every prompt's end at the same place.
        batch = tokenizer(
            prompts[start : start + batch_size],
            add_special_tokens=False,
            padding=True,
            padding_side="left",
            return_tensors="pt",
        ).to(model.device)
        output = model.generate(
            **batch, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )
        completions += tokenizer.batch_decode(output[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    model.train(was_training)
    return completions


def score(rows, completions: list[str]) -> dict:
    """Accuracy, its 95% interval, the unparseable rate and the same by subject, with each prediction."""
    by_subject = defaultdict(lambda: [0, 0])
    predictions = []
    correct = unparseable = 0
    for row, completion in zip(rows, completions, strict=True):
        predicted = extract_answer(completion, letters_for(row), options=list(option_map(row).values()))
        hit = predicted is not None and predicted == row["answer"]
        correct += hit
        unparseable += predicted is None
        by_subject[row["subject"] or "all"][0] += hit
        by_subject[row["subject"] or "all"][1] += 1
        predictions.append(
            {"id": row["id"], "answer": row["answer"], "predicted": predicted, "completion": completion}
        )
    n = len(predictions)
    return {
        "accuracy": correct / n if n else 0.0,
        "n": n,
        "ci95": list(wilson_interval(correct, n)),
        "unparseable": unparseable / n if n else 0.0,
        "subjects": {s: {"accuracy": c / t, "n": t} for s, (c, t) in sorted(by_subject.items())},
        "predictions": predictions,
    }


def evaluate_mcq(model, tokenizer, rows, **generation) -> dict:
    """Generate answers for `rows` (normalised MCQ rows) and score them."""
    return score(rows, generate_answers(model, tokenizer, rows, **generation))


def format_report(name: str, report: dict) -> str:
    lo, hi = report["ci95"]
    lines = [
        f"{name}: accuracy {report['accuracy']:.1%} (95% CI {lo:.1%}-{hi:.1%}) on {report['n']} questions, "
        f"{report['unparseable']:.1%} unparseable"
    ]
    for subject, result in report["subjects"].items():
        lines.append(f"  {subject:<24} {result['accuracy']:6.1%}  n={result['n']}")
    return "\n".join(lines)
