"""Accuracy with its Wilson 95% interval, overall and by subject, and macro-F1 with a seeded
bootstrap interval over the questions."""

import math
from collections import defaultdict


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


def first_argmax(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)
