"""How far a model's confidence can be trusted: calibration and selective answering of
multiple-choice answers, with seeded bootstrap intervals over questions.

Each question gives a probability for each of its options: the softmax of the options'
log-likelihoods in loglik mode (per character of the answer for acc_norm, as lm-eval normalises
it), optionally divided by a fitted temperature first; in generate mode the share of k sampled
answers that named each option. From them:

- confidence: the probability of the answer given (the highest), and whether it is right;
- `ece`: expected calibration error of that confidence, |accuracy - confidence| over 15
  equal-width bins weighted by their questions (the bins are returned too);
- `brier`: the Brier score of the confidence against correctness, mean (confidence - right)^2;
- `nll`: the negative log-likelihood of the gold option, mean -log p(gold) (vote shares are
  smoothed by half a vote per option first, so that a gold answer never sampled is finite);
- `auroc`: the area under the ROC curve of confidence as a detector of right answers (None when
  every answer is right, or every one wrong);
- `selective`: accuracy on the most confident 50%, 80% and 90% of questions, and `aurc_accuracy`,
  the area under the accuracy-coverage curve (the mean over k of the accuracy of the k most
  confident answers).

Written here with numpy rather than taken from scikit-learn or torchmetrics because the
bootstrap computes each metric on a thousand resamples at once, as one array operation; the
tests hold every metric to scikit-learn's or torchmetrics' on the same predictions.
"""

import json
import math
import os

import numpy as np

from medrecipes.errors import UserError

BINS = 15
COVERAGES = (0.5, 0.8, 0.9)
RESAMPLES = 1000
VOTE_SMOOTHING = 0.5  # votes added to every option for the NLL of sampled answers (smoothed_votes)


def softmax(logliks, temperature: float = 1.0) -> np.ndarray:
    """Probabilities over the options of one question from their log-likelihoods."""
    scaled = np.asarray(logliks, dtype=np.float64) / temperature
    scaled -= scaled.max()
    weights = np.exp(scaled)
    return weights / weights.sum()


def loglik_probabilities(prediction: dict, choices: list[str] | None = None, temperature: float = 1.0) -> np.ndarray:
    """A loglik prediction's option probabilities; with `choices` (the answer strings) per
    character, as acc_norm ranks them."""
    logliks = np.asarray(prediction["logliks"], dtype=np.float64)
    if choices is not None:
        logliks = logliks / np.asarray([len(c) for c in choices], dtype=np.float64)
    return softmax(logliks, temperature)


def vote_probabilities(votes: list[str | None], letters: list[str]) -> np.ndarray:
    """The share of sampled answers that named each option (an answer naming none counts for
    none, so the shares may sum to less than 1)."""
    return np.asarray([sum(v == letter for v in votes) for letter in letters], dtype=np.float64) / max(len(votes), 1)


def question_arrays(probabilities: list[np.ndarray], gold: list[int], for_nll: list[np.ndarray] | None = None):
    """(confidence, right, gold probability) per question; the gold probability from `for_nll`
    where given (sampled answers' smoothed shares, `smoothed_votes`)."""
    confidence = np.asarray([p.max() for p in probabilities], dtype=np.float64)
    # An answer with no probability anywhere (no sample named an option) is no answer: not right.
    right = np.asarray(
        # numpy's argmax takes the first of equal values, as lm-eval does
        [p.max() > 0 and int(np.argmax(p)) == g for p, g in zip(probabilities, gold, strict=True)],
        dtype=bool,
    )
    gold_p = np.asarray([p[g] for p, g in zip(for_nll or probabilities, gold, strict=True)], dtype=np.float64)
    return confidence, right, gold_p


def smoothed_votes(votes: list[str | None], letters: list[str]) -> np.ndarray:
    """Each option's share of sampled answers with VOTE_SMOOTHING votes added to every option,
    for the NLL: a gold answer that no sample named would otherwise cost an infinite NLL."""
    counts = vote_probabilities(votes, letters) * len(votes)
    return (counts + VOTE_SMOOTHING) / (len(votes) + VOTE_SMOOTHING * len(letters))


def _bin_index(confidence: np.ndarray, bins: int) -> np.ndarray:
    """Equal-width bins over [0, 1], right-closed ((0, 1/15], ..., (14/15, 1]) as torchmetrics
    and most calibration papers bin; a confidence of 0 goes to the first."""
    return np.clip(np.ceil(confidence * bins).astype(int) - 1, 0, bins - 1)


def _ece(confidence: np.ndarray, right: np.ndarray, bins: int) -> np.ndarray:
    """ECE of each row of (resamples x questions) arrays."""
    rows, n = confidence.shape
    # One bincount over (row, bin) pairs: the sums of every bin of every resample at once.
    index = _bin_index(confidence, bins) + bins * np.arange(rows)[:, None]
    conf_sum = np.bincount(index.ravel(), weights=confidence.ravel(), minlength=rows * bins).reshape(rows, bins)
    right_sum = np.bincount(index.ravel(), weights=right.ravel().astype(float), minlength=rows * bins).reshape(
        rows, bins
    )
    return np.abs(right_sum - conf_sum).sum(axis=1) / n


def _auroc(confidence: np.ndarray, right: np.ndarray) -> np.ndarray:
    """AUROC of each row (Mann-Whitney: the chance that a right answer is more confident than a
    wrong one, ties counting half); NaN where a row has only one kind."""
    from scipy.stats import rankdata

    ranks = rankdata(confidence, axis=1)  # ties get their average rank
    positives = right.sum(axis=1)
    negatives = right.shape[1] - positives
    with np.errstate(invalid="ignore", divide="ignore"):
        u = (ranks * right).sum(axis=1) - positives * (positives + 1) / 2
        return np.where((positives > 0) & (negatives > 0), u / (positives * negatives), np.nan)


def _selective(confidence: np.ndarray, right: np.ndarray, coverages) -> tuple[np.ndarray, np.ndarray]:
    """(accuracy at each coverage: rows x coverages, area under the accuracy-coverage curve:
    rows). The most confident first; equal confidences in question order."""
    n = confidence.shape[1]
    order = np.argsort(-confidence, axis=1, kind="stable")
    cumulative = np.cumsum(np.take_along_axis(right, order, axis=1), axis=1) / np.arange(1, n + 1)
    kept = [max(1, math.ceil(c * n)) - 1 for c in coverages]
    return cumulative[:, kept], cumulative.mean(axis=1)


def _metrics(confidence: np.ndarray, right: np.ndarray, gold_p: np.ndarray, bins: int, coverages) -> dict:
    """Every metric for each row of (rows x questions) arrays."""
    at, area = _selective(confidence, right, coverages)
    return {
        "ece": _ece(confidence, right, bins),
        "brier": ((confidence - right) ** 2).mean(axis=1),
        "nll": -np.log(np.clip(gold_p, 1e-12, None)).mean(axis=1),
        "auroc": _auroc(confidence, right),
        **{f"selective_accuracy@{c:g}": at[:, i] for i, c in enumerate(coverages)},
        "aurc_accuracy": area,
    }


def reliability_bins(confidence: np.ndarray, right: np.ndarray, bins: int = BINS) -> list[dict]:
    """The reliability diagram's bins: [lower, upper), questions, accuracy and mean confidence
    (None for an empty bin)."""
    index = _bin_index(confidence, bins)
    table = []
    for b in range(bins):
        members = index == b
        count = int(members.sum())
        table.append(
            {
                "lower": b / bins,
                "upper": (b + 1) / bins,
                "n": count,
                "accuracy": float(right[members].mean()) if count else None,
                "confidence": float(confidence[members].mean()) if count else None,
            }
        )
    return table


def coverage_curve(confidence: np.ndarray, right: np.ndarray, points: int = 20) -> list[list[float]]:
    """[coverage, accuracy of the most confident answers at it] at `points` coverages, for the plot."""
    n = len(confidence)
    order = np.argsort(-confidence, kind="stable")
    cumulative = np.cumsum(right[order]) / np.arange(1, n + 1)
    return [
        [k / n, float(cumulative[k - 1])]
        for k in sorted({max(1, round(n * i / points)) for i in range(1, points + 1)})
    ]


def calibration_report(
    confidence: np.ndarray,
    right: np.ndarray,
    gold_p: np.ndarray,
    seed: int = 0,
    bins: int = BINS,
    coverages=COVERAGES,
    resamples: int = RESAMPLES,
) -> dict:
    """Every metric on the questions, with its 95% interval from a seeded bootstrap that
    resamples questions (the same resamples for every metric); the reliability bins and the
    accuracy-coverage curve."""
    confidence, right, gold_p = (np.asarray(a) for a in (confidence, right, gold_p))
    right = right.astype(bool)
    n = len(confidence)
    if n == 0:
        return {"n": 0}
    point = {k: float(v[0]) for k, v in _metrics(confidence[None], right[None], gold_p[None], bins, coverages).items()}
    index = np.random.default_rng(seed).integers(0, n, (resamples, n))
    samples = _metrics(confidence[index], right[index], gold_p[index], bins, coverages)
    report = {"n": n, "mean_confidence": float(confidence.mean()), "bins": reliability_bins(confidence, right, bins)}
    for key, value in point.items():
        finite = samples[key][np.isfinite(samples[key])]
        report[key] = None if math.isnan(value) else value
        report[f"{key}_ci95"] = [float(x) for x in np.percentile(finite, [2.5, 97.5])] if len(finite) else None
    report["coverage_curve"] = coverage_curve(confidence, right)
    return report


def gold_nll(logliks: list, gold: list[int], temperature: float = 1.0) -> float:
    """Mean -log p(gold option), p the softmax of each question's `logliks` / `temperature`."""
    return float(
        np.mean([-math.log(max(softmax(row, temperature)[g], 1e-12)) for row, g in zip(logliks, gold, strict=True)])
    )


# `medrecipes calibrate` fits on at least this many questions: one question's fit gave a
# temperature of 0.05, which made a held-out NLL 1.93 -> 15.87 for every later evaluation.
MIN_FIT_QUESTIONS = 50


TEMPERATURE_RANGE = (1 / 20, 20)  # where a temperature is searched; a fit at either end found none inside


def fit_temperature(logliks: list, gold: list[int]) -> float:
    """The temperature that minimises `gold_nll` on a development set, searched over log T in
    TEMPERATURE_RANGE: one parameter, so scipy's bounded scalar search is enough."""
    from scipy.optimize import minimize_scalar

    found = minimize_scalar(
        lambda log_t: gold_nll(logliks, gold, math.exp(log_t)),
        bounds=tuple(math.log(t) for t in TEMPERATURE_RANGE),
        method="bounded",
        options={"xatol": 1e-4},
    )
    return math.exp(found.x)


def headline(calibration: dict) -> dict:
    """The calibration report a summary shows from an evaluation's: the acc ranking's (loglik)
    or the sampled answers' votes (generate); {} when there is none."""
    return calibration.get("acc") or calibration.get("votes") or {}


def with_interval(found: dict, key: str, spec: str) -> str:
    """A figure of a calibration report with its 95% interval ("0.052 (0.031-0.081)"); "n/a"
    where it is undefined (AUROC when every answer is right)."""
    value, interval = found.get(key), found.get(f"{key}_ci95")
    if value is None:
        return "n/a"
    return f"{value:{spec}} ({interval[0]:{spec}}-{interval[1]:{spec}})" if interval else f"{value:{spec}}"


TEMPERATURE_FILE = "calibration.json"  # in the model folder, written by `medrecipes calibrate`


def read_temperature(model: str) -> tuple[float, str | None] | None:
    """(temperature, the task it was fitted on) that `medrecipes calibrate` saved with a local
    model, or None."""
    path = os.path.join(model, TEMPERATURE_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
        value, task = saved["temperature"], saved.get("task")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        value, task = None, None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise UserError(
            f"{path}: no positive temperature in it; fit one again with `medrecipes calibrate`, or delete the file"
        )
    return float(value), task if isinstance(task, str) else None
