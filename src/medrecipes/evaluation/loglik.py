"""Loglik mode, lm-evaluation-harness 0.4's multiple-choice scoring: the log-likelihood of each
answer string (" A", " B", ...) after the task's prompt; the prediction is the first option with
the highest sum (acc), or with the highest sum per character of the answer string (acc_norm).
And how a report agrees with lm-eval's own logged samples."""

import inspect
from collections import defaultdict

import torch
from tqdm.auto import tqdm

from medrecipes.errors import UserError
from medrecipes.evaluation import calibration as cal
from medrecipes.evaluation.statistics import by_subject, first_argmax, macro_f1
from medrecipes.usmle import (
    LETTERS,
)

# lm-eval's length when neither the model config nor the tokenizer gives one.
DEFAULT_MAX_LENGTH = 2048


def max_context_length(model, tokenizer) -> int:
    """The model's context length as lm-eval resolves it: the (text) config, then the tokenizer."""
    config = getattr(model.config, "text_config", None) or model.config
    for attribute in ("n_positions", "max_position_embeddings", "n_ctx"):
        if getattr(config, attribute, None) is not None:
            return int(getattr(config, attribute))
    # Tokenizers without a limit report a huge sentinel (int(1e30)).
    limit = getattr(tokenizer, "model_max_length", None)
    return int(limit) if limit is not None and limit < 1e29 else DEFAULT_MAX_LENGTH


def encode_text(tokenizer, text: str) -> list[int]:
    # The tokenizer's own special tokens (its BOS, if it adds one), unless the text starts with it already.
    prefix_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    starts_with_prefix = prefix_id is not None and text.startswith(tokenizer.decode([prefix_id]))
    # verbose=False: not the tokenizer's warning about a text longer than the model's positions
    # ("will result in indexing errors"); each caller fits what it scores to the model.
    return tokenizer.encode(text, add_special_tokens=not starts_with_prefix, verbose=False)


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """Context and continuation tokens as lm-eval makes them: the context's trailing spaces move
    to the continuation, and the continuation is what the joint encoding adds after the context's
    own tokens, so that " A" is tokenized as it would be in running text."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = encode_text(tokenizer, context + continuation)
    context_ids = encode_text(tokenizer, context)
    return context_ids, whole[len(context_ids) :]


@torch.no_grad()
def continuation_logliks(
    model, tokenizer, requests: list[tuple[str, str]], batch_size: int = 8, max_length=None, progress=False
) -> list[tuple[float, bool]]:
    """(sum of log-probabilities, is greedy) of each continuation after its context, as lm-eval's
    HF model computes it: input truncated from the left to `max_length`, one forward pass per
    distinct input (all one-token answers to a question share one), right padding, first argmax."""
    max_length = max_length or max_context_length(model, tokenizer)
    wanted = defaultdict(list)  # model input -> [(request index, continuation tokens)]
    for index, (context, continuation) in enumerate(requests):
        context_ids, continuation_ids = encode_pair(tokenizer, context, continuation)
        tokens = (context_ids + continuation_ids)[-(max_length + 1) :][:-1]
        wanted[tuple(tokens)].append((index, continuation_ids))
    inputs = sorted(wanted, key=len, reverse=True)  # longest first, as lm-eval orders them
    results: list[tuple[float, bool]] = [(0.0, False)] * len(requests)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    keeps_positions = _accepts_logits_to_keep(model)
    for start in tqdm(range(0, len(inputs), batch_size), desc="scoring answers", disable=not progress):
        batch = inputs[start : start + batch_size]
        ids = torch.zeros(len(batch), len(batch[0]), dtype=torch.long)
        for row, tokens in enumerate(batch):
            ids[row, : len(tokens)] = torch.tensor(tokens)
        # The positions whose next-token logits score a continuation: a few per row, where the full
        # logits are (rows x length x vocabulary), a fifth of a small model's forward pass in the LM
        # head alone. The model projects only these positions (the same for every row of the batch).
        positions = sorted(
            {p for tokens in batch for _, cont in wanted[tokens] for p in range(len(tokens) - len(cont), len(tokens))}
        )
        column = {p: i for i, p in enumerate(positions)} if keeps_positions else {p: p for p in positions}
        kept = {"logits_to_keep": torch.tensor(positions, device=device)} if keeps_positions else {}
        # No attention mask, as lm-eval: right padding never reaches the real tokens of a causal model.
        logits = model(input_ids=ids.to(device), use_cache=False, **kept).logits
        for row, tokens in enumerate(batch):
            for index, continuation_ids in wanted[tokens]:
                first = len(tokens) - len(continuation_ids)
                span = logits[row, [column[p] for p in range(first, len(tokens))]]
                # lm-eval takes log-softmax in the logits' own dtype; so do we, to match it.
                logprobs = torch.log_softmax(span, dim=-1)
                target = torch.tensor(continuation_ids, device=device)
                greedy = bool((logprobs.argmax(dim=-1) == target).all())
                results[index] = (float(logprobs.gather(1, target[:, None]).sum()), greedy)
    model.train(was_training)
    return results


def _accepts_logits_to_keep(model) -> bool:
    """Whether the model's forward projects only chosen positions (transformers' causal LMs do;
    a PEFT model passes it on to its base)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "logits_to_keep" in inspect.signature(base.forward).parameters


def score_loglik(
    rows, choices: list[list[str]], results: list[list[tuple[float, bool]]], temperature: float | None = None
) -> dict:
    """acc (highest log-likelihood) and acc_norm (highest per character of the answer string, as
    lm-eval's acc_norm) overall and by subject, with each question's log-likelihoods, and the
    calibration of both (`loglik_calibration`; `temperature`, one fitted by `medrecipes calibrate`)."""
    predictions = []
    for row, row_choices, row_results in zip(rows, choices, results, strict=True):
        logliks = [loglik for loglik, _ in row_results]
        normalised = [loglik / len(choice) for loglik, choice in zip(logliks, row_choices, strict=True)]
        predictions.append(
            {
                "id": row["id"],
                "subject": row["subject"],
                "answer": row["answer"],
                "predicted": LETTERS[first_argmax(logliks)],
                "predicted_norm": LETTERS[first_argmax(normalised)],
                "logliks": logliks,
                "is_greedy": [greedy for _, greedy in row_results],
            }
        )
    report = by_subject(rows, [p["predicted"] == p["answer"] for p in predictions])
    norm = by_subject(rows, [p["predicted_norm"] == p["answer"] for p in predictions])
    for subject, result in report["subjects"].items():
        result["acc_norm"] = norm["subjects"][subject]["accuracy"]
    f1 = macro_f1([p["answer"] for p in predictions], [p["predicted"] for p in predictions])
    calibration = loglik_calibration(predictions, choices, temperature)
    return {
        **report,
        **f1,
        "acc_norm": norm["accuracy"],
        "acc_norm_ci95": norm["ci95"],
        "calibration": calibration,
        "predictions": predictions,
    }


def loglik_calibration(predictions: list[dict], choices: list[list[str]], temperature: float | None = None) -> dict:
    """Calibration of the answers' probabilities over the options (`evaluation.calibration`): for
    the acc ranking (softmax of the log-likelihoods), the acc_norm ranking (per character) and,
    given a fitted temperature, the acc ranking scaled by it."""
    gold = [LETTERS.index(p["answer"]) for p in predictions]
    variants = {"acc": (False, 1.0), "acc_norm": (True, 1.0)}
    if temperature is not None:
        variants["acc_temperature_scaled"] = (False, temperature)
    found = {}
    for name, (per_character, t) in variants.items():
        probabilities = [
            cal.loglik_probabilities(p, c if per_character else None, t)
            for p, c in zip(predictions, choices, strict=True)
        ]
        found[name] = cal.calibration_report(*cal.question_arrays(probabilities, gold))
    if temperature is not None:
        found["acc_temperature_scaled"]["temperature"] = temperature
    return found


def lm_eval_agreement(report: dict, samples: list[dict]) -> dict:
    """How a loglik report agrees with lm-eval's logged samples (`--log_samples`) of the same
    questions in the same order: identical predictions and the largest loglik difference."""
    if len(samples) != len(report["predictions"]):
        raise UserError(f"lm-eval logged {len(samples)} samples but the report has {len(report['predictions'])}")
    identical, largest = 0, 0.0
    for prediction, sample in zip(report["predictions"], sorted(samples, key=lambda s: s["doc_id"]), strict=True):
        theirs = [float(response[0]) for response in sample["filtered_resps"]]
        identical += LETTERS[first_argmax(theirs)] == prediction["predicted"]
        largest = max(largest, *(abs(a - b) for a, b in zip(theirs, prediction["logliks"], strict=True)))
    n = len(samples)
    theirs_acc = sum(float(s["acc"]) for s in samples) / n
    return {"n": n, "identical_predictions": identical, "max_loglik_difference": largest, "lm_eval_acc": theirs_acc}
