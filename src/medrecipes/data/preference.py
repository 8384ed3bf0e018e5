"""Preference data for DPO and KTO: pairs built from multiple-choice questions (the gold answer
against a distractor, or the model's own right answer against its own wrong one), TRL's
unpaired layout of them, and the recipe's mixture of preference sources (TRL's layouts: prompt,
chosen, rejected; or prompt, completion, label; plain text or conversational)."""

import logging
import random
from collections import Counter

from medrecipes import usmle
from medrecipes.data.mixture import build_mixture, training_mixture
from medrecipes.data.sources import load_source
from medrecipes.errors import UserError
from medrecipes.locations import model_run_record

logger = logging.getLogger(__name__)


def mcq_pairs(rows, system_prompt: str | None = None, seed: int = 42) -> list[dict]:
    """One conversational pair per answered question: the gold answer chosen against a wrong
    option drawn with `seed`, as the SFT recipes ask and answer (usmle.preference_pair)."""
    rng = random.Random(seed)
    pairs = []
    for row in rows:
        wrong = [letter for letter in usmle.option_map(row) if letter != row["answer"]]
        if wrong:
            pairs.append({"id": row["id"], **usmle.preference_pair(row, rng.choice(wrong), system_prompt)})
    return pairs


def on_policy_pairs(
    rows, samples: list[list[str]], system_prompt: str | None = None, seed: int = 42
) -> tuple[list[dict], dict[str, int]]:
    """Pairs of a model's own answers: for each question, one of its sampled answers whose letter
    is the gold one chosen against one whose letter is not (or that names none), each drawn with
    `seed` among the distinct answers. A question whose samples are all right, or all wrong,
    teaches no preference: it is left out and counted ({"all right": n, "all wrong": n})."""
    rng = random.Random(seed)
    pairs, left_out = [], {"all right": 0, "all wrong": 0}
    for row, answers in zip(rows, samples, strict=True):
        options = list(usmle.option_map(row).values())
        right, wrong = [], []
        for answer in dict.fromkeys(answer.strip() for answer in answers):  # distinct, in sampled order
            letter = usmle.extract_answer(answer, usmle.letters_for(row), options=options)
            (right if letter == row["answer"] else wrong).append(answer)
        if not wrong or not right:
            left_out["all right" if right else "all wrong"] += 1
            continue
        pairs.append(
            {
                "id": row["id"],
                "prompt": usmle.chat_messages(row, system_prompt=system_prompt),
                "chosen": [{"role": "assistant", "content": rng.choice(right)}],
                "rejected": [{"role": "assistant", "content": rng.choice(wrong)}],
            }
        )
    return pairs, left_out


def chosen_account(rows, pairs: list[dict]) -> str:
    """How many of `pairs` choose each gold letter (rows by id), "the pairs choose A 2, B 9", and
    where they all choose one letter of questions whose letters vary, that they teach it. A model
    that knows its training questions by heart disagrees with itself on a few of them only, often
    of one answer: pairs of one letter, or mostly one, teach that letter whatever the question."""
    gold = {row["id"]: row["answer"] for row in rows}
    chosen = sorted(Counter(gold[pair["id"]] for pair in pairs).items())
    account = "the pairs choose " + (", ".join(f"{letter} {n}" for letter, n in chosen) or "nothing")
    if len(chosen) == 1 and len(set(gold.values())) > 1:
        account += (
            ": one letter, which preference training on them teaches whatever the question (sample more answers "
            "a question, or make the pairs from questions the model has not trained on)"
        )
    return account


PAIR = ("chosen", "rejected")


def _split_pairs(batch: dict) -> dict:
    """TRL's unpaired layout of a batch of pairs: each chosen answer labelled true, followed by
    its rejected one labelled false, the other columns repeated. TRL's own
    `unpair_preference_dataset` puts a whole batch's chosen answers before its rejected ones, so
    that an unshuffled eval batch holds answers of one kind only (KTO's margin is then never
    logged) and KTO's KL estimate pairs an answer with a neighbour of its own kind."""
    split = {key: [v for v in values for _ in range(2)] for key, values in batch.items() if key not in PAIR}
    split["completion"] = [a for pair in zip(batch["chosen"], batch["rejected"], strict=True) for a in pair]
    split["label"] = [True, False] * len(batch["chosen"])
    return split


def split_pairs(dataset):
    """`dataset`'s pairs as unpaired answers (see `_split_pairs`); a Dataset or a stream."""
    return dataset.map(_split_pairs, batched=True, remove_columns=list(PAIR))


def unpaired(pairs: list[dict]) -> list[dict]:
    """`pairs` (rows with prompt, chosen, rejected) in TRL's unpaired layout, for KTO."""
    columns = {key: [pair[key] for pair in pairs] for key in (pairs[0] if pairs else {})}
    split = _split_pairs(columns) if pairs else {}
    return [dict(zip(split, row, strict=True)) for row in zip(*split.values(), strict=True)]


def _check_both_kinds(rows) -> None:
    """KTO weighs desirable answers against undesirable ones: data of one kind has nothing to weigh
    (TRL trains on it, its loss a function of the KL estimate alone). A stream is not counted."""
    if not hasattr(rows, "__len__") or len(rows) == 0:
        return
    labels = set(rows["label"])
    if len(labels) == 1:
        kind = "desirable (label true)" if labels == {True} else "undesirable (label false)"
        raise UserError(
            f"dataset_mixture: every one of the {len(rows)} answers is {kind}; KTO needs both kinds "
            "(medrecipes pairs --layout unpaired writes one of each a question)"
        )


def _check_balance(rows, args) -> None:
    """KTO's paper (Eq. 8) has desirable_weight x desirable answers against undesirable_weight x
    undesirable ones from 1 to 4/3; TRL advises it only when the counts differ. Said in one line
    wherever it is off, with the desirable_weight that puts it back. A stream is not counted."""
    if args is None or not hasattr(rows, "__len__") or len(rows) == 0:
        return
    desirable = sum(rows["label"])
    undesirable = len(rows) - desirable
    if not desirable or not undesirable:
        return
    ratio = args.desirable_weight * desirable / (args.undesirable_weight * undesirable)
    if not 1 <= ratio <= 4 / 3:
        low = args.undesirable_weight * undesirable / desirable
        logger.warning(
            "desirable_weight %g x %d desirable answers against undesirable_weight %g x %d undesirable ones is "
            "%.3g, outside KTO's 1 to 4/3 (its paper, Eq. 8): one kind would outweigh the other; set "
            "desirable_weight from %.3g to %.3g",
            args.desirable_weight, desirable, args.undesirable_weight, undesirable, ratio, low, low * 4 / 3,
        )  # fmt: skip


def say_prompts_unlike_start(train, start: str | None) -> None:
    """One line where conversational pairs ask their questions with another system turn (or none)
    than the run that made the starting model (`start`: its output_dir/final, run.json beside it)
    trained with: the preferences are then learnt on prompts the model was not trained on, as
    when `medrecipes pairs` was run without the SFT recipe's --system-prompt."""
    record = model_run_record(start) if start else None
    recipe = record.get("recipe") if isinstance(record, dict) else None
    if not isinstance(recipe, dict) or "system_prompt" not in recipe or "prompt" not in (train.column_names or []):
        return
    trained = recipe["system_prompt"] or None
    turns = [p for p in train["prompt"] if isinstance(p, list) and p and isinstance(p[0], dict)]
    systems = [p[0].get("content") if p[0].get("role") == "system" else None for p in turns]
    if unlike := sum(system != trained for system in systems):
        asked = f"the system prompt {trained!r}" if trained else "no system prompt"
        logger.warning(
            "%d of %d preference rows ask their question with another system turn than the run of the starting model "
            "%s trained with (%s, its run.json), so preferences are learnt on prompts it was not trained on; write "
            "them as that run asked (medrecipes pairs --system-prompt, or without it)",
            unlike, len(systems), start, asked,
        )  # fmt: skip


def preference_data(recipe, unpair: bool = False, args=None, start: str | None = None):
    """(train rows, {eval set: rows}) from the recipe's preference sources; with `unpair` (KTO)
    pairs are split into one desirable and one undesirable answer, and the weights of the two
    kinds in `args` (KTO's config) are checked against their counts. `start`, the starting
    model's path, is compared with the pairs' prompts (`say_prompts_unlike_start`)."""
    training_mixture(recipe, "preference source")
    train = build_mixture(recipe.mixture)
    say_prompts_unlike_start(train, start)
    evals = {name: load_source(source) for name, source in recipe.eval_sources.items()}
    if unpair:
        if recipe.mixture.sources[0].format == "preference":  # every source has one layout (config.checks)
            train = split_pairs(train)
        else:
            _check_both_kinds(train)
        _check_balance(train, args)
        evals = {
            name: split_pairs(rows) if recipe.eval_sources[name].format == "preference" else rows
            for name, rows in evals.items()
        }
    return train, evals
