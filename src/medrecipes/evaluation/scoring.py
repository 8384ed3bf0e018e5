"""One benchmark task scored in one mode (`evaluate_task`): the prompts, the scores, and what the
report says of the questions themselves (cut to fit the model, asked twice)."""

import logging

from medrecipes.errors import UserError
from medrecipes.evaluation.generate import (
    LETTER_TOKENS,
    REASONING_TOKENS,
    chat_prompt,
    generate_answers,
    sample_answers,
    score,
    score_votes,
)
from medrecipes.evaluation.loglik import continuation_logliks, max_context_length, score_loglik
from medrecipes.usmle import question_key

logger = logging.getLogger(__name__)


def evaluate_task(
    model,
    tokenizer,
    data,
    mode: str = "loglik",
    num_fewshot: int = 0,
    batch_size: int = 8,
    max_length: int | None = None,
    generation: dict | None = None,
    progress: bool = False,
    temperature: float | None = None,
) -> dict:
    """Score one `evaluation.tasks.TaskData`; the report also records the source, mode and one full
    prompt. Loglik: `temperature`, one fitted by `medrecipes calibrate`, adds temperature-scaled
    calibration. Generate: `generation["samples"]` above 1 answers by majority of that many
    sampled answers (`score_votes`)."""
    task, rows = data.task, data.rows
    shots = [data.shots(row, num_fewshot) for row in rows]
    positions = max_length or max_context_length(model, tokenizer)
    if mode == "loglik":
        contexts = [task.context(row, row_shots) for row, row_shots in zip(rows, shots, strict=True)]
        choices = [task.choices(row) for row in rows]
        requests = [(context, f" {choice}") for context, cs in zip(contexts, choices, strict=True) for choice in cs]
        flat = continuation_logliks(model, tokenizer, requests, batch_size, max_length, progress)
        grouped, start = [], 0
        for cs in choices:
            grouped.append(flat[start : start + len(cs)])
            start += len(cs)
        report = {
            **score_loglik(rows, choices, grouped, temperature),
            "example_continuations": [f" {c}" for c in choices[0]],
            **_too_long(tokenizer, contexts, positions - 1, "their first tokens dropped, as lm-eval does"),
        }
        example = contexts[0]
    elif mode == "generate":
        settings = {"batch_size": batch_size, **(generation or {})}
        samples = settings.pop("samples", 1)
        if samples > 1:
            report = score_votes(
                rows, *sample_answers(model, tokenizer, rows, samples, shots, progress=progress, **settings)
            )
        else:
            report = score(rows, *generate_answers(model, tokenizer, rows, shots=shots, progress=progress, **settings))
        prompts = [
            chat_prompt(
                tokenizer, row, row_shots, settings.get("system_prompt"), settings.get("chain_of_thought", False)
            )
            for row, row_shots in zip(rows, shots, strict=True)
        ]
        reply = settings.get("max_new_tokens") or (
            REASONING_TOKENS if settings.get("chain_of_thought") else LETTER_TOKENS
        )
        report.update(
            _too_long(tokenizer, prompts, positions - reply, "their first tokens dropped to leave room for the reply")
        )
        example = prompts[0]
    else:
        raise UserError(f"mode '{mode}' is unknown; use loglik or generate")
    setting = {"pubmedqa_setting": data.pubmedqa_setting} if data.pubmedqa_setting else {}
    report.update(_duplicates(rows))
    return {
        **report,
        "mode": mode,
        "reference": task.reference,
        "source": data.source,
        **setting,
        "example_prompt": example,
    }


def _duplicates(rows) -> dict:
    """Questions asked more than once (`question_key`): each copy is scored and counted, so a
    figure that holds them weighs those questions more; {} when none (loading said which rows)."""
    first: dict[tuple, str] = {}
    copies = []
    for row in rows:
        key = question_key(row.get("context"), row["question"], row["options"])
        if key in first:
            copies.append([first[key], row["id"]])
        else:
            first[key] = row["id"]
    return {"duplicates": {"copies": len(copies), "pairs": copies[:20]}} if copies else {}


def _too_long(tokenizer, prompts: list[str], room: int, how: str) -> dict:
    """How many prompts do not fit the `room` the model's positions leave them, and what was done:
    {} when all fit; logged as well, since a figure on cut questions is not the same figure."""
    # verbose=False: the tokenizer's own line ("will result in indexing errors") is not true of a cut prompt.
    over = sum(len(tokenizer(p, add_special_tokens=False, verbose=False)["input_ids"]) > room for p in prompts)
    if not over:
        return {}
    logger.warning(
        "%d of %d prompts are longer than the %d tokens the model has room for: %s", over, len(prompts), room, how
    )
    return {"truncated": {"prompts": over, "room_tokens": room, "how": how}}
