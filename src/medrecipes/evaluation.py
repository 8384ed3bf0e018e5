"""Multiple-choice accuracy of a model, scored two ways, overall and by subject.

`loglik` reproduces lm-evaluation-harness 0.4's multiple-choice scoring: the log-likelihood
of each answer string (" A", " B", ...) after the task's prompt (`medrecipes.eval_tasks`);
the prediction is the first option with the highest sum (acc), or with the highest sum per
character of the answer string (acc_norm). `generate` asks the question with the chat
template (`usmle.chat_messages`), lets the model answer (greedy unless a temperature is set)
and reads the letter with the shared extractor; an answer it cannot read counts as wrong and
is reported as unparseable. Accuracies come with a Wilson 95% interval; macro-F1 over the gold
answers' classes (PubMedQA's other standard metric; a baseline that always answers "yes" scores
55% accuracy there and 0.24 macro-F1) with a seeded bootstrap 95% interval over questions.
"""

import inspect
import json
import logging
import math
import os
import platform
import time
from collections import defaultdict

import torch
from tqdm.auto import tqdm

from medrecipes import calibration as cal
from medrecipes.errors import UserError
from medrecipes.outputs import claim_output, staged
from medrecipes.usmle import (
    LETTERS,
    chat_messages,
    extract_answer,
    is_abstention,
    letters_for,
    option_map,
    sft_target,
)

logger = logging.getLogger(__name__)

# Enough for "C. <option text>"; chain-of-thought answers need room to reason first.
LETTER_TOKENS = 16
REASONING_TOKENS = 512
# lm-eval's length when neither the model config nor the tokenizer gives one.
DEFAULT_MAX_LENGTH = 2048


def wilson_interval(correct: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (0.0, 0.0)
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def _accuracy(hits: list[bool]) -> dict:
    n = len(hits)
    return {"accuracy": sum(hits) / n if n else 0.0, "n": n, "ci95": list(wilson_interval(sum(hits), n))}


BOOTSTRAP_RESAMPLES = 1000


def _macro_f1_of_resamples(gold, guess, labels, index):
    """Macro-F1 of each row of `index` (resamples x questions), from per-class counts with numpy:
    a thousand calls of scikit-learn's f1_score take seconds, this a few milliseconds. It agrees
    with scikit-learn's (zero_division=0) on the full sample, which `macro_f1` returns from it."""
    import numpy as np

    is_gold = gold[index][..., None] == labels
    is_guess = guess[index][..., None] == labels
    true_pos = (is_gold & is_guess).sum(1)
    wrong = (is_gold ^ is_guess).sum(1)  # false positives and false negatives
    denominator = 2 * true_pos + wrong
    per_class = np.divide(2 * true_pos, denominator, out=np.zeros(denominator.shape), where=denominator > 0)
    return per_class.mean(1)


def macro_f1(answers: list[str], predicted: list[str | None], seed: int = 0) -> dict:
    """Macro-F1 over the classes of the gold answers (scikit-learn's), an unparseable answer a miss
    of its gold class, and its 95% interval from a seeded bootstrap over the questions."""
    import numpy as np
    from sklearn.metrics import f1_score

    if not answers:
        return {"macro_f1": 0.0, "macro_f1_ci95": [0.0, 0.0]}
    gold = np.asarray(answers)
    guess = np.asarray([p if p is not None else "" for p in predicted])
    labels = np.asarray(sorted(set(answers)))
    value = f1_score(gold, guess, labels=labels, average="macro", zero_division=0)
    index = np.random.default_rng(seed).integers(0, len(gold), (BOOTSTRAP_RESAMPLES, len(gold)))
    low, high = np.percentile(_macro_f1_of_resamples(gold, guess, labels, index), [2.5, 97.5])
    return {"macro_f1": float(value), "macro_f1_ci95": [float(low), float(high)]}


def by_subject(rows, hits: list[bool]) -> dict:
    """Accuracy, n and 95% interval overall and for each subject (rows without one count as "all")."""
    groups = defaultdict(list)
    for row, hit in zip(rows, hits, strict=True):
        groups[row["subject"] or "all"].append(hit)
    return {**_accuracy(hits), "subjects": {s: _accuracy(h) for s, h in sorted(groups.items())}}


# ---------------------------------------------------------------------------
# generate: chat prompt, completion, extracted letter


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
    progress=False,
) -> tuple[list[str], list[bool]]:
    """Completions of each row's chat prompt, in row order; greedy unless `temperature` > 0.
    `shots[i]` are the few-shot examples of row i. Also returns, for each row, whether its reply
    ended at a stop token (the generation config's eos_token_id) before `max_new_tokens`."""
    if tokenizer.chat_template is None:
        raise UserError("generate mode needs a chat template and the tokenizer has none; use --mode loglik")
    max_new_tokens = max_new_tokens or (REASONING_TOKENS if chain_of_thought else LETTER_TOKENS)
    shots = shots or [()] * len(rows)
    prompts = [
        chat_prompt(tokenizer, row, row_shots, system_prompt, chain_of_thought)
        for row, row_shots in zip(rows, shots, strict=True)
    ]
    sampling = {"temperature": temperature, "top_p": top_p} if temperature > 0 else {}
    # The template already holds BOS. A prompt longer than the model's positions less the reply's
    # keeps its last tokens, as loglik scoring does (`evaluate_task` counts them in its report):
    # generating past the positions would fail, or grow memory without bound.
    room = max(max_context_length(model, tokenizer) - max_new_tokens, 1)
    ids = [tokens[-room:] for tokens in tokenizer(prompts, add_special_tokens=False)["input_ids"]]
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
    samples that named it, whose calibration is reported (medrecipes.calibration)."""
    chosen, ends, votes_by_row, probabilities, smoothed, gold = [], [], [], [], [], []
    for row, answers, stops in zip(rows, completions, stopped, strict=True):
        letters = letters_for(row)
        votes = [extract_answer(a, letters, options=list(option_map(row).values())) for a in answers]
        shares = cal.vote_probabilities(votes, letters)
        pick = votes.index(letters[_first_argmax(list(shares))]) if shares.max() > 0 else 0
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


# ---------------------------------------------------------------------------
# loglik: lm-evaluation-harness's multiple-choice scoring


def max_context_length(model, tokenizer) -> int:
    """The model's context length as lm-eval resolves it: the (text) config, then the tokenizer."""
    config = getattr(model.config, "text_config", None) or model.config
    for attribute in ("n_positions", "max_position_embeddings", "n_ctx"):
        if getattr(config, attribute, None) is not None:
            return int(getattr(config, attribute))
    # Tokenizers without a limit report a huge sentinel (int(1e30)).
    limit = getattr(tokenizer, "model_max_length", None)
    return int(limit) if limit is not None and limit < 1e29 else DEFAULT_MAX_LENGTH


def _encode(tokenizer, text: str) -> list[int]:
    # The tokenizer's own special tokens (its BOS, if it adds one), unless the text starts with it already.
    prefix_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    starts_with_prefix = prefix_id is not None and text.startswith(tokenizer.decode([prefix_id]))
    return tokenizer.encode(text, add_special_tokens=not starts_with_prefix)


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """Context and continuation tokens as lm-eval makes them: the context's trailing spaces move
    to the continuation, and the continuation is what the joint encoding adds after the context's
    own tokens, so that " A" is tokenized as it would be in running text."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = _encode(tokenizer, context + continuation)
    context_ids = _encode(tokenizer, context)
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


def _first_argmax(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)


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
                "predicted": LETTERS[_first_argmax(logliks)],
                "predicted_norm": LETTERS[_first_argmax(normalised)],
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
    """Calibration of the answers' probabilities over the options (medrecipes.calibration): for
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


# ---------------------------------------------------------------------------
# Tasks


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
    """Score one `eval_tasks.TaskData`; the report also records the source, mode and one full
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
    """Questions asked more than once (the same context, question and options): each copy is
    scored and counted, so a figure that holds them weighs those questions more; {} when none."""
    first: dict[tuple, str] = {}
    copies = []
    for row in rows:
        key = (row.get("context") or "", row["question"], tuple(row["options"]))
        if key in first:
            copies.append([first[key], row["id"]])
        else:
            first[key] = row["id"]
    if not copies:
        return {}
    logger.warning(
        "%d questions repeat an earlier one (first: %s is %s again); each copy is scored",
        len(copies),
        copies[0][1],
        copies[0][0],
    )
    return {"duplicates": {"copies": len(copies), "pairs": copies[:20]}}


def _too_long(tokenizer, prompts: list[str], room: int, how: str) -> dict:
    """How many prompts do not fit the `room` the model's positions leave them, and what was done:
    {} when all fit; logged as well, since a figure on cut questions is not the same figure."""
    over = sum(len(tokenizer(p, add_special_tokens=False)["input_ids"]) > room for p in prompts)
    if not over:
        return {}
    logger.warning(
        "%d of %d prompts are longer than the %d tokens the model has room for: %s", over, len(prompts), room, how
    )
    return {"truncated": {"prompts": over, "room_tokens": room, "how": how}}


def task_metrics(reports: dict[str, dict], prefix: str = "eval") -> dict[str, float]:
    """The scalars a trainer logs for each task: <prefix>_<task>_acc, _macro_f1, and _acc_norm or
    _unparseable, _abstained and _stopped (the share of replies that ended at a stop token); and the
    calibration of the acc ranking (or of sampled answers' votes): _ece, _brier, _nll, _auroc."""
    metrics = {}
    for name, report in reports.items():
        metrics[f"{prefix}_{name}_acc"] = report["accuracy"]
        for key in ("macro_f1", "acc_norm", "unparseable", "abstained", "stopped"):
            if key in report:
                metrics[f"{prefix}_{name}_{key}"] = report[key]
        found = cal.headline(report.get("calibration", {}))
        for key in ("ece", "brier", "nll", "auroc"):
            if found.get(key) is not None:
                metrics[f"{prefix}_{name}_{key}"] = found[key]
    return metrics


def format_report(name: str, report: dict) -> str:
    lo, hi = report["ci95"]
    extra = f", {report['unparseable']:.1%} unparseable" if "unparseable" in report else ""
    extra += f", {report['abstained']:.1%} abstained" if report.get("abstained") else ""
    extra += f", {report['stopped']:.1%} ended at a stop token" if "stopped" in report else ""
    extra += f", acc_norm {report['acc_norm']:.1%}" if "acc_norm" in report else ""
    extra += f", macro-F1 {report['macro_f1']:.3f}" if "macro_f1" in report else ""
    lines = [f"{name}: accuracy {report['accuracy']:.1%} (95% CI {lo:.1%}-{hi:.1%}) on {report['n']} questions{extra}"]
    for variant, found in report.get("calibration", {}).items():
        lines.append(f"  calibration ({variant}): {format_calibration(found)}")
    for subject, result in report["subjects"].items():
        lines.append(f"  {subject:<24} {result['accuracy']:6.1%}  n={result['n']}")
    return "\n".join(lines)


def format_calibration(found: dict) -> str:
    """One line: ECE, Brier, NLL, AUROC and selective accuracy, each with its 95% interval."""
    selective = ", ".join(
        f"{c:.0%}: {cal.with_interval(found, f'selective_accuracy@{c:g}', '.1%')}" for c in cal.COVERAGES
    )
    return (
        f"ECE {cal.with_interval(found, 'ece', '.3f')}, Brier {cal.with_interval(found, 'brier', '.3f')}, NLL {cal.with_interval(found, 'nll', '.3f')}, "
        f"AUROC {cal.with_interval(found, 'auroc', '.3f')}; accuracy of the most confident (coverage {selective}), "
        f"area under the accuracy-coverage curve {cal.with_interval(found, 'aurc_accuracy', '.3f')}"
    )


def format_table(reports: dict[str, dict]) -> str:
    """A markdown table: one line per task, then one per subject when a task has several."""
    lines = [
        "| task | mode | n | accuracy | 95% CI | macro-F1 (95% CI) | acc_norm | unparseable | stopped |",
        "|---|---|---:|---:|---|---|---:|---:|---:|",
    ]

    def line(name: str, mode: str, result: dict) -> str:
        lo, hi = result["ci95"]
        norm = f"{result['acc_norm']:.1%}" if "acc_norm" in result else ""
        unparseable = f"{result['unparseable']:.1%}" if "unparseable" in result else ""
        f1 = (
            f"{result['macro_f1']:.3f} ({result['macro_f1_ci95'][0]:.3f}-{result['macro_f1_ci95'][1]:.3f})"
            if "macro_f1" in result
            else ""
        )
        stopped = f"{result['stopped']:.1%}" if "stopped" in result else ""
        return f"| {name} | {mode} | {result['n']} | {result['accuracy']:.1%} | {lo:.1%}-{hi:.1%} | {f1} | {norm} | {unparseable} | {stopped} |"

    for name, report in reports.items():
        lines.append(line(name, report["mode"], report))
        if len(report["subjects"]) > 1:
            lines += [line(f"  {name} / {s}", report["mode"], r) for s, r in report["subjects"].items()]
    calibrated = [(name, v, found) for name, r in reports.items() for v, found in r.get("calibration", {}).items()]
    if calibrated:
        lines += ["", calibration_table(calibrated)]
    return "\n".join(lines)


def calibration_table(rows: list[tuple[str, str, dict]]) -> str:
    """A markdown table of calibration reports, one per (task, confidence variant, report)."""
    head = (
        "| task | confidence from | mean confidence | ECE | Brier | NLL | AUROC | acc @50% | acc @80% | acc @90% "
        "| area acc-coverage |\n|---|---|---:|---|---|---|---|---|---|---|---|"
    )
    return "\n".join([head, *(_calibration_row(*row) for row in rows)])


def _calibration_row(name: str, variant: str, found: dict) -> str:
    """A row of `calibration_table`: each figure with its 95% interval."""
    cells = [cal.with_interval(found, key, ".3f") for key in ("ece", "brier", "nll", "auroc")]
    cells += [cal.with_interval(found, f"selective_accuracy@{c:g}", ".1%") for c in cal.COVERAGES]
    cells.append(cal.with_interval(found, "aurc_accuracy", ".3f"))
    return (
        f"| {name} | {VARIANTS.get(variant, variant)} | {found['mean_confidence']:.3f} | " + " | ".join(cells) + " |"
    )


# What each calibration report's confidence is, in the tables.
VARIANTS = {
    "acc": "option log-likelihoods (softmax)",
    "acc_norm": "per-character log-likelihoods",
    "acc_temperature_scaled": "log-likelihoods / fitted temperature",
    "votes": "agreement of sampled answers",
}


def lm_eval_agreement(report: dict, samples: list[dict]) -> dict:
    """How a loglik report agrees with lm-eval's logged samples (`--log_samples`) of the same
    questions in the same order: identical predictions and the largest loglik difference."""
    if len(samples) != len(report["predictions"]):
        raise UserError(f"lm-eval logged {len(samples)} samples but the report has {len(report['predictions'])}")
    identical, largest = 0, 0.0
    for prediction, sample in zip(report["predictions"], sorted(samples, key=lambda s: s["doc_id"]), strict=True):
        theirs = [float(response[0]) for response in sample["filtered_resps"]]
        identical += LETTERS[_first_argmax(theirs)] == prediction["predicted"]
        largest = max(largest, *(abs(a - b) for a, b in zip(theirs, prediction["logliks"], strict=True)))
    n = len(samples)
    theirs_acc = sum(float(s["acc"]) for s in samples) / n
    return {"n": n, "identical_predictions": identical, "max_loglik_difference": largest, "lm_eval_acc": theirs_acc}


# ---------------------------------------------------------------------------
# Perplexity of whole documents


@torch.no_grad()
def _document_loss(model, ids: list[int], window: int, stride: int) -> float:
    """The summed loss of every token of `ids` after the first, each scored once: in one pass where
    the document fits the `window`, else in windows that move `stride` tokens at a time, each
    scoring its new tokens with the window's earlier ones as their context (memory stays that of
    one window, however long the document)."""
    device = next(model.parameters()).device
    total, done, end = 0.0, 1, min(window, len(ids))
    while True:
        begin = max(0, end - window)
        chunk = torch.tensor([ids[begin:end]], device=device)
        logits = model(input_ids=chunk).logits[0, done - 1 - begin : end - 1 - begin].float()
        total += torch.nn.functional.cross_entropy(logits, chunk[0, done - begin :], reduction="sum").item()
        if end == len(ids):
            return total
        done, end = end, min(end + stride, len(ids))


def document_perplexity(model, tokenizer, texts: list[str], seed: int = 0, window: int | None = None) -> dict:
    """Perplexity of whole documents as the model is used: each document tokenized alone, with the
    tokenizer's special tokens (BOS in front where it adds one), every token after the first scored,
    one document per forward pass (no padding) where it fits the model's positions (`window`), and
    a document longer than that in windows moving half a window at a time (`_document_loss`), so
    that every token is scored with at least half a window of context; the output says how many
    documents that took and the stride. Packed training blocks would favour a model trained on
    that packing; this does not. The 95% interval comes from a seeded bootstrap over the documents
    (total loss over total tokens of each resample); each document's loss and token count are
    returned too, for paired comparisons."""
    import numpy as np

    window = window or max_context_length(model, tokenizer)
    stride = max(window // 2, 1)
    losses, counts, windowed = [], [], 0
    for text in texts:
        ids = _encode(tokenizer, text)
        if len(ids) < 2:
            continue
        windowed += len(ids) > window
        losses.append(_document_loss(model, ids, window, stride))
        counts.append(len(ids) - 1)
    if not counts:
        raise UserError("perplexity: no document has two tokens or more; pass documents with text")
    losses, counts = np.asarray(losses), np.asarray(counts)
    index = np.random.default_rng(seed).integers(0, len(counts), (BOOTSTRAP_RESAMPLES, len(counts)))
    resampled = np.exp(losses[index].sum(1) / counts[index].sum(1))
    low, high = np.percentile(resampled, [2.5, 97.5])
    loss = losses.sum() / counts.sum()
    return {
        "perplexity": float(np.exp(loss)),
        "ci95": [float(low), float(high)],
        "loss": float(loss),
        "documents": len(counts),
        "tokens": int(counts.sum()),
        # Documents longer than the model's positions, scored in windows of `window` tokens that
        # move `stride` at a time.
        "windowed_documents": windowed,
        "window": window,
        "stride": stride,
        # Each document's summed loss and scored tokens, in order: two models' figures on the same
        # documents can be compared pair by pair.
        "document_losses": losses.tolist(),
        "document_tokens": counts.tolist(),
    }


# ---------------------------------------------------------------------------
# The `medrecipes eval` command and recipes/evaluate.py


def load_for_evaluation(name_or_path: str, revision=None, dtype=None, device=None):
    """(model, tokenizer) as the recipes load them: Hub id, local folder or .gguf file."""
    from trl import ModelConfig

    from medrecipes.models import check_model_folder, load_model, load_tokenizer

    check_model_folder(name_or_path)
    if os.path.isfile(os.path.join(name_or_path, "adapter_config.json")):
        raise UserError(
            f"model: {name_or_path} is a LoRA adapter; fold it into its base first with "
            f"`medrecipes merge-lora {name_or_path} OUT_DIR` and evaluate OUT_DIR"
        )
    tokenizer = load_tokenizer(name_or_path, revision)
    model_args = ModelConfig(model_name_or_path=name_or_path, model_revision=revision, dtype=dtype)
    model = load_model(model_args, None, tokenizer)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device).eval(), tokenizer


def _versions() -> dict:
    import transformers

    import medrecipes

    return {
        "medrecipes": medrecipes.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def run_evaluation(args) -> dict:
    """Load the tasks and the model of `args` (config.EvalArguments), score every task, write
    `args.output` when set, and return {"tasks": {name: report}, "settings": ..., ...}."""
    from transformers import set_seed

    from medrecipes.eval_tasks import load_task

    if args.output:  # before the data and the model load: a refused output must not cost the evaluation
        where = f"{getattr(args, 'where', 'command line')}: output"
        claim_output(args.output, "eval", where, getattr(args, "inputs", []), overwrite=args.overwrite)
    started = time.time()
    set_seed(args.seed)
    tasks = {
        name: load_task(
            name,
            data=args.data_by_task.get(name),
            data_dir=args.data_dir,
            limit=args.limit,
            num_fewshot=args.num_fewshot,
            fewshot_data=args.fewshot_by_task.get(name),
            pubmedqa_setting=args.pubmedqa_setting,
        )
        for name in args.tasks
    }
    fitted = cal.read_temperature(args.model_name_or_path)  # saved with the model by `medrecipes calibrate`
    model, tokenizer = load_for_evaluation(args.model_name_or_path, args.model_revision, args.dtype, args.device)
    generation = {
        "system_prompt": args.system_prompt,
        "chain_of_thought": args.chain_of_thought,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "samples": args.samples,
    }
    reports = {}
    for name, data in tasks.items():
        logger.info("%s: %d questions from %s, %s mode", name, len(data.rows), data.source, args.mode)
        reports[name] = evaluate_task(
            model, tokenizer, data, args.mode, args.num_fewshot, args.batch_size, args.max_length, generation, True,
            fitted,
        )  # fmt: skip
    settings = {
        "model": args.model_name_or_path,
        "mode": args.mode,
        "num_fewshot": args.num_fewshot,
        "limit": args.limit,
        "batch_size": args.batch_size,
        "max_length": args.max_length or max_context_length(model, tokenizer),
        "dtype": str(next(model.parameters()).dtype),
        "device": str(next(model.parameters()).device),
        "seed": args.seed,
        **(generation if args.mode == "generate" else {}),
        **({"calibration_temperature": fitted} if fitted is not None and args.mode == "loglik" else {}),
    }
    results = {"tasks": reports, "settings": settings, "versions": _versions(), "wall_time_s": time.time() - started}
    if args.output:
        with staged(args.output, folder=False, kind="eval") as path, open(path, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
        logger.info("results written to %s", args.output)
    return results


def run_calibration(
    model_path: str,
    task: str,
    dev: str,
    held_out: str | None = None,
    data_dir: str | None = None,
    limit: int | None = None,
    batch_size: int = 8,
    overwrite: bool = False,
) -> dict:
    """Temperature scaling (`medrecipes calibrate`): fit one temperature to the option
    log-likelihoods of the `dev` questions of `task` (questions the model did not train on),
    measure calibration before and after on the held-out questions (`held_out`, else the task's
    own evaluation data), and save the temperature with the model (calibration.json), where
    `medrecipes eval` finds it."""
    from medrecipes.eval_tasks import load_task

    if not os.path.isdir(model_path):
        raise UserError(
            f"calibrate: {model_path} is not a local model folder; the temperature is saved with the model"
        )
    target = os.path.join(model_path, cal.TEMPERATURE_FILE)
    claim_output(target, "calibration", "calibrate", [dev, *([held_out] if held_out else [])], overwrite)
    fit_data = load_task(task, data=dev, limit=limit)
    test_data = load_task(task, data=held_out, data_dir=data_dir, limit=limit)
    if {r["question"] for r in fit_data.rows} & {r["question"] for r in test_data.rows}:
        raise UserError(
            f"calibrate: the development questions ({fit_data.source}) and the held-out ones ({test_data.source}) "
            "share questions; fit on questions that are not measured"
        )
    model, tokenizer = load_for_evaluation(model_path)
    fitted = evaluate_task(model, tokenizer, fit_data, "loglik", batch_size=batch_size, progress=True)
    logliks = [p["logliks"] for p in fitted["predictions"]]
    gold = [LETTERS.index(p["answer"]) for p in fitted["predictions"]]
    temperature = cal.fit_temperature(logliks, gold)
    measured = evaluate_task(model, tokenizer, test_data, "loglik", batch_size=batch_size, progress=True,
                             temperature=temperature)  # fmt: skip
    record = {
        "temperature": temperature,
        "task": task,
        "fitted_on": {
            "source": fit_data.source,
            "questions": len(fit_data.rows),
            "nll_before": cal.gold_nll(logliks, gold),
            "nll_after": cal.gold_nll(logliks, gold, temperature),
        },
        "held_out": {
            "source": test_data.source,
            "questions": len(test_data.rows),
            "before": _summary(measured["calibration"]["acc"]),
            "after": _summary(measured["calibration"]["acc_temperature_scaled"]),
        },
    }
    with staged(target, folder=False, kind="calibration") as path, open(path, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    return {**record, "report": measured}


def _summary(found: dict) -> dict:
    """A calibration report's figures and intervals, without its bins and curve."""
    return {k: v for k, v in found.items() if k not in ("bins", "coverage_curve")}
