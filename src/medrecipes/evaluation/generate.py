"""Generate mode: each question asked through the chat template, the model's reply read for a letter
with the shared extractor (`usmle.extract_answer`); an answer it cannot read counts as wrong and
is reported as unparseable. Sampled answers can vote."""

import torch
from tqdm.auto import tqdm

from medrecipes.errors import UserError
from medrecipes.evaluation import calibration as cal
from medrecipes.evaluation.loglik import max_context_length
from medrecipes.evaluation.statistics import by_subject, first_argmax, macro_f1
from medrecipes.models.templates import say_dropped_system
from medrecipes.usmle import (
    chat_messages,
    extract_answer,
    is_abstention,
    letters_for,
    option_map,
    sft_target,
)

# Enough for "C. <option text>"; chain-of-thought answers need room to reason first.
LETTER_TOKENS = 16


REASONING_TOKENS = 512


def chat_prompt(tokenizer, row, shots=(), system_prompt=None, chain_of_thought=False) -> str:
    """The row asked through the chat template; few-shot examples come first as earlier turns."""
    messages = chat_messages(row, system_prompt=system_prompt, chain_of_thought=chain_of_thought)
    examples = []
    for shot in shots:
        examples.append(chat_messages(shot, chain_of_thought=chain_of_thought)[-1])
        examples.append({"role": "assistant", "content": sft_target(shot, chain_of_thought=chain_of_thought)})
    return tokenizer.apply_chat_template(
        messages[:-1] + examples + messages[-1:], add_generation_prompt=True, tokenize=False
    )


@torch.no_grad()
def generate_answers(
    model,
    tokenizer,
    rows,
    system_prompt=None,
    chain_of_thought=False,
    max_new_tokens=None,
    batch_size=16,
    shots=None,
    temperature=0.0,
    top_p=1.0,
    top_k=None,
    progress=False,
) -> tuple[list[str], list[bool]]:
    """Completions of each row's chat prompt, in row order; greedy unless `temperature` > 0.
    `shots[i]` are the few-shot examples of row i. Also returns, for each row, whether its reply
    ended at a stop token (the generation config's eos_token_id) before `max_new_tokens`. `top_k`
    samples among that many likeliest tokens (0: all, as GRPO's default; None: the model's
    generation config)."""
    if tokenizer.chat_template is None:
        raise UserError("generate mode needs a chat template and the tokenizer has none; use --mode loglik")
    if system_prompt:
        say_dropped_system(tokenizer, "system_prompt")
    max_new_tokens = max_new_tokens or (REASONING_TOKENS if chain_of_thought else LETTER_TOKENS)
    shots = shots or [()] * len(rows)
    prompts = [
        chat_prompt(tokenizer, row, row_shots, system_prompt, chain_of_thought)
        for row, row_shots in zip(rows, shots, strict=True)
    ]
    sampling = {"temperature": temperature, "top_p": top_p} if temperature > 0 else {}
    if sampling and top_k is not None:
        sampling["top_k"] = top_k
    # The template already holds BOS. A prompt longer than the model's positions less the reply's
    # keeps its last tokens, as loglik scoring does (`evaluate_task` counts them in its report):
    # generating past the positions would fail, or grow memory without bound.
    room = max(max_context_length(model, tokenizer) - max_new_tokens, 1)
    ids = [tokens[-room:] for tokens in tokenizer(prompts, add_special_tokens=False, verbose=False)["input_ids"]]
    # Longest first: a batch of similar lengths wastes little on padding.
    order = sorted(range(len(prompts)), key=lambda i: -len(ids[i]))
    completions, stopped = [""] * len(prompts), [False] * len(prompts)
    # A reply that holds one of the generation config's stop tokens ended there, not at max_new_tokens.
    eos = model.generation_config.eos_token_id
    stop_ids = torch.tensor([eos] if isinstance(eos, int) else list(eos or []), device=model.device)
    was_training = model.training
    model.eval()
    for start in tqdm(range(0, len(order), batch_size), desc="generating", disable=not progress):
        indices = order[start : start + batch_size]
        # Left padding keeps every prompt's end at the same place.
        batch = tokenizer.pad(
            {"input_ids": [ids[i] for i in indices]}, padding=True, padding_side="left", return_tensors="pt"
        ).to(model.device)
        output = model.generate(
            **batch,
            max_new_tokens=max_new_tokens,
            do_sample=bool(sampling),
            pad_token_id=tokenizer.pad_token_id,
            **sampling,
        )
        generated = output[:, batch["input_ids"].shape[1] :]
        texts = tokenizer.batch_decode(generated, skip_special_tokens=True)
        ended = torch.isin(generated, stop_ids).any(1).tolist()
        for i, text, stop in zip(indices, texts, ended, strict=True):
            completions[i], stopped[i] = text, stop
    model.train(was_training)
    return completions, stopped


def score(rows, completions: list[str], stopped: list[bool] | None = None) -> dict:
    """Accuracy, its 95% interval, the unparseable rate and the same by subject, with each
    prediction; with `stopped`, the share of replies that ended at a stop token."""
    predictions = []
    for row, completion in zip(rows, completions, strict=True):
        letters, options = letters_for(row), list(option_map(row).values())
        predictions.append(
            {
                "id": row["id"],
                "subject": row["subject"],
                "answer": row["answer"],
                "predicted": extract_answer(completion, letters, options=options),
                "completion": completion,
                "abstained": is_abstention(completion, letters, options),
            }
        )
    n = len(predictions)
    report = by_subject(rows, [p["predicted"] == p["answer"] for p in predictions])
    unparseable = sum(p["predicted"] is None and not p["abstained"] for p in predictions)
    f1 = macro_f1([p["answer"] for p in predictions], [p["predicted"] for p in predictions])
    if stopped is not None:
        for prediction, stop in zip(predictions, stopped, strict=True):
            prediction["stopped"] = stop
        report["stopped"] = sum(stopped) / n if n else 0.0
    abstained = sum(p["abstained"] for p in predictions)
    return {
        **report,
        **f1,
        "unparseable": unparseable / n if n else 0.0,
        "abstained": abstained / n if n else 0.0,
        "predictions": predictions,
    }


def sample_answers(model, tokenizer, rows, samples: int, shots=None, **generation) -> tuple[list, list]:
    """`samples` completions of each row's chat prompt (`generate_answers`, sampling as
    `generation` says), and whether each stopped: two lists with one list per row."""
    shots = shots or [()] * len(rows)
    completions, stopped = generate_answers(
        model,
        tokenizer,
        [row for row in rows for _ in range(samples)],
        shots=[row_shots for row_shots in shots for _ in range(samples)],
        **generation,
    )
    return tuple([flat[i : i + samples] for i in range(0, len(flat), samples)] for flat in (completions, stopped))


def score_votes(rows, completions: list[list[str]], stopped: list[list[bool]]) -> dict:
    """Generate mode with several sampled answers a question (`sample_answers`): the answer is
    the most frequent letter (of equal counts, the first in option order), given as the first
    sample that named it, and scored as `score` scores one answer; its confidence is the share of
    samples that named it, whose calibration is reported (`evaluation.calibration`)."""
    chosen, ends, votes_by_row, probabilities, smoothed, gold = [], [], [], [], [], []
    for row, answers, stops in zip(rows, completions, stopped, strict=True):
        letters = letters_for(row)
        votes = [extract_answer(a, letters, options=list(option_map(row).values())) for a in answers]
        shares = cal.vote_probabilities(votes, letters)
        pick = votes.index(letters[first_argmax(list(shares))]) if shares.max() > 0 else 0
        chosen.append(answers[pick])
        ends.append(stops[pick])
        votes_by_row.append(votes)
        probabilities.append(shares)
        smoothed.append(cal.smoothed_votes(votes, letters))
        gold.append(letters.index(row["answer"]))
    report = score(rows, chosen, ends)
    for prediction, votes in zip(report["predictions"], votes_by_row, strict=True):
        prediction["votes"] = votes
    arrays = cal.question_arrays(probabilities, gold, for_nll=smoothed)
    samples = len(completions[0]) if completions else 0
    return {**report, "samples": samples, "calibration": {"votes": cal.calibration_report(*arrays)}}


def evaluate_mcq(model, tokenizer, rows, **generation) -> dict:
    """Generate answers for `rows` (normalised MCQ rows) and score them."""
    return score(rows, *generate_answers(model, tokenizer, rows, **generation))
