"""medrecipes.evaluation.calibration: every metric held to an independent implementation on the same
predictions (scikit-learn's Brier score, log loss and ROC AUC, torchmetrics' calibration error,
a sort in plain Python for selective accuracy), the bootstrap intervals, temperature scaling,
and the calibration that loglik and sampled generate evaluations report."""

import json
import logging
import math
import shutil

import numpy as np
import pytest
import torch
from conftest import ROOT, card_record
from sklearn.metrics import brier_score_loss, log_loss, roc_auc_score
from torchmetrics.functional.classification import binary_calibration_error

from medrecipes import cli
from medrecipes.errors import UserError
from medrecipes.evaluation import calibration as cal
from medrecipes.evaluation.generate import score_votes
from medrecipes.evaluation.loglik import score_loglik
from medrecipes.evaluation.tables import calibration_table, format_report, task_metrics


def predictions(seed: int, n: int = 400, options: int = 4, sharpness: float = 2.0, ties: bool = False):
    """Random option log-likelihoods and gold answers, the gold somewhat favoured (a model that
    knows something), as the arrays the metrics take."""
    rng = np.random.default_rng(seed)
    logliks = rng.normal(0, sharpness, (n, options))
    gold = rng.integers(0, options, n)
    logliks[np.arange(n), gold] += rng.normal(1.0, 1.0, n)
    if ties:
        logliks = np.round(logliks, 0)  # equal confidences between questions
    probabilities = [cal.softmax(row) for row in logliks]
    return logliks, gold.tolist(), probabilities


CASES = [
    dict(seed=s, n=n, options=k, ties=t)
    for s, n, k, t in [(0, 400, 4, False), (1, 57, 3, True), (2, 1000, 5, False), (3, 31, 4, True)]
]


@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"seed{c['seed']}-n{c['n']}-k{c['options']}{'-ties' if c['ties'] else ''}"
)
def test_every_metric_equals_an_independent_implementation(case):
    logliks, gold, probabilities = predictions(**case)
    confidence, right, gold_p = cal.question_arrays(probabilities, gold)
    report = cal.calibration_report(confidence, right, gold_p, resamples=50)
    expected_ece = binary_calibration_error(
        torch.tensor(confidence), torch.tensor(right.astype(int)), n_bins=15, norm="l1"
    ).item()
    assert report["ece"] == pytest.approx(expected_ece, abs=1e-6)
    assert report["brier"] == pytest.approx(brier_score_loss(right, confidence), abs=1e-6)
    options = case["options"]
    assert report["nll"] == pytest.approx(
        log_loss(gold, np.stack(probabilities), labels=list(range(options))), abs=1e-6
    )
    assert report["auroc"] == pytest.approx(roc_auc_score(right, confidence), abs=1e-6)
    # Selective accuracy: the most confident first, equal confidences in question order.
    ranked = [r for _, _, r in sorted(zip(-confidence, range(len(right)), right, strict=True))]
    for coverage in cal.COVERAGES:
        kept = ranked[: math.ceil(coverage * len(ranked))]
        assert report[f"selective_accuracy@{coverage:g}"] == pytest.approx(sum(kept) / len(kept), abs=1e-12)
    curve = [sum(ranked[:k]) / k for k in range(1, len(ranked) + 1)]
    assert report["aurc_accuracy"] == pytest.approx(sum(curve) / len(curve), abs=1e-12)
    assert report["selective_accuracy@0.9"] >= sum(right) / len(right) - 0.1  # confidence tells something here
    # The bins are the reliability diagram: every question in one, their gaps adding up to the ECE.
    bins = report["bins"]
    assert len(bins) == 15 and sum(b["n"] for b in bins) == len(right)
    gaps = sum(b["n"] * abs(b["accuracy"] - b["confidence"]) for b in bins if b["n"]) / len(right)
    assert gaps == pytest.approx(report["ece"], abs=1e-9)


def test_intervals_are_seeded_bootstraps_that_hold_the_estimate():
    _, gold, probabilities = predictions(seed=4)
    arrays = cal.question_arrays(probabilities, gold)
    first, again = cal.calibration_report(*arrays, seed=7), cal.calibration_report(*arrays, seed=7)
    other = cal.calibration_report(*arrays, seed=8)
    assert first == again and first["ece_ci95"] != other["ece_ci95"]
    for key in ("ece", "brier", "nll", "auroc", "selective_accuracy@0.5", "aurc_accuracy"):
        low, high = first[f"{key}_ci95"]
        assert low <= first[key] <= high and high - low < 0.4, key


def test_a_perfectly_calibrated_model_has_an_ece_near_zero_and_an_overconfident_one_does_not():
    rng = np.random.default_rng(5)
    confidence = rng.uniform(0.25, 1.0, 20000)
    right = rng.uniform(size=confidence.size) < confidence  # right exactly as often as it is sure
    calibrated = cal.calibration_report(confidence, right, confidence, resamples=20)
    overconfident = cal.calibration_report(np.minimum(1.0, confidence + 0.2), right, confidence, resamples=20)
    assert calibrated["ece"] < 0.01 and overconfident["ece"] > 0.15


def test_auroc_is_none_when_every_answer_is_right():
    report = cal.calibration_report(np.array([0.9, 0.6, 0.7]), np.array([True, True, True]), np.ones(3), resamples=20)
    assert report["auroc"] is None and report["auroc_ci95"] is None and report["brier"] > 0


def test_temperature_scaling_recovers_the_temperature_that_made_the_answers():
    rng = np.random.default_rng(6)
    logits = rng.normal(0, 3, (4000, 4))
    gold = [int(rng.choice(4, p=cal.softmax(row, 2.5))) for row in logits]  # answers drawn at temperature 2.5
    fitted = cal.fit_temperature(list(logits), gold)
    assert fitted == pytest.approx(2.5, rel=0.1)
    grid = min(np.linspace(0.5, 5, 451), key=lambda t: cal.gold_nll(list(logits), gold, t))
    assert fitted == pytest.approx(grid, abs=0.02)  # the bounded search finds the grid's minimum
    assert cal.gold_nll(list(logits), gold, fitted) < cal.gold_nll(list(logits), gold)


def test_the_saved_temperature_is_read_and_a_bad_one_refused(tmp_path):
    assert cal.read_temperature(str(tmp_path)) is None
    (tmp_path / "calibration.json").write_text(json.dumps({"temperature": 1.7}))
    assert cal.read_temperature(str(tmp_path)) == (1.7, None)
    (tmp_path / "calibration.json").write_text(json.dumps({"temperature": 1.7, "task": "medqa_4opt"}))
    assert cal.read_temperature(str(tmp_path)) == (1.7, "medqa_4opt")
    for bad in ({"temperature": 0}, {"temperature": "warm"}, {"temperature": True}, {}, []):
        (tmp_path / "calibration.json").write_text(json.dumps(bad))
        with pytest.raises(UserError, match="calibration.json: no positive temperature in it"):
            cal.read_temperature(str(tmp_path))


ROWS = [{"id": f"q{i}", "subject": "medicine", "answer": "ABCD"[i % 4]} for i in range(40)]


def test_loglik_reports_calibration_for_acc_acc_norm_and_a_fitted_temperature():
    logliks, _, _ = predictions(seed=9, n=40)
    rows = [
        {**row, "answer": "ABCD"[int(np.argmax(scores + np.array([0, 0.5, 0, 0])))]}
        for row, scores in zip(ROWS, logliks, strict=True)
    ]
    choices = [["yes", "no", "perhaps", "n/a"]] * len(rows)
    results = [[(float(x), False) for x in row] for row in logliks]
    report = score_loglik(rows, choices, results, temperature=2.0)
    found = report["calibration"]
    assert set(found) == {"acc", "acc_norm", "acc_temperature_scaled"}
    gold = ["ABCD".index(row["answer"]) for row in rows]
    for variant, per_character, t in (
        ("acc", False, 1.0),
        ("acc_norm", True, 1.0),
        ("acc_temperature_scaled", False, 2.0),
    ):
        probabilities = [
            cal.loglik_probabilities(p, c if per_character else None, t)
            for p, c in zip(report["predictions"], choices, strict=True)
        ]
        confidence, right, _ = cal.question_arrays(probabilities, gold)
        assert found[variant]["brier"] == pytest.approx(brier_score_loss(right, confidence), abs=1e-9)
    # The acc ranking's calibration is the one whose answers are the report's predictions.
    confidence, right, _ = cal.question_arrays([cal.softmax(scores) for scores in logliks], gold)
    assert right.mean() == pytest.approx(report["accuracy"])
    assert found["acc_temperature_scaled"]["temperature"] == 2.0
    assert found["acc_temperature_scaled"]["mean_confidence"] < found["acc"]["mean_confidence"]  # T > 1 softens
    metrics = task_metrics({"medqa": report})
    assert metrics["eval_medqa_ece"] == found["acc"]["ece"] and metrics["eval_medqa_auroc"] == found["acc"]["auroc"]
    assert "calibration (acc): ECE" in format_report("medqa", report)
    table = calibration_table([("medqa", v, f) for v, f in found.items()])
    assert "| medqa | log-likelihoods / fitted temperature |" in table and len(table.splitlines()) == 5


def test_sampled_answers_vote_and_their_agreement_is_the_confidence():
    rows = [
        {"id": "a", "subject": "s", "question": "?", "options": {"A": "yes", "B": "no", "C": "maybe"}, "answer": "A"},
        {"id": "b", "subject": "s", "question": "?", "options": {"A": "yes", "B": "no", "C": "maybe"}, "answer": "C"},
        {"id": "c", "subject": "s", "question": "?", "options": {"A": "yes", "B": "no", "C": "maybe"}, "answer": "B"},
    ]
    completions = ["A. yes", "B. no", "A. yes", "A. yes",  # A by 3 of 4: right, confidence 0.75
                   "B. no", "C. maybe", "B. no", "C. maybe",  # a tie, B first in option order: wrong, 0.5
                   "I am not sure", "hmm", "no idea", "B. no"]  # fmt: skip
    report = score_votes(rows, [completions[i : i + 4] for i in range(0, 12, 4)], [[True] * 4] * 3)
    assert [p["predicted"] for p in report["predictions"]] == ["A", "B", "B"]
    assert report["predictions"][2]["votes"] == [None, None, None, "B"]
    assert report["accuracy"] == pytest.approx(2 / 3) and report["samples"] == 4
    found = report["calibration"]["votes"]
    confidence, right = np.array([0.75, 0.5, 0.25]), np.array([True, False, True])
    assert found["brier"] == pytest.approx(brier_score_loss(right, confidence), abs=1e-12)
    assert found["auroc"] == pytest.approx(roc_auc_score(right, confidence), abs=1e-12)
    # NLL on vote counts with half a vote added to each of the 3 options: the tie's gold C had 2 of 4.
    smoothed = [(3 + 0.5) / 5.5, (2 + 0.5) / 5.5, (1 + 0.5) / 5.5]
    assert found["nll"] == pytest.approx(-np.mean(np.log(smoothed)), abs=1e-12)


SAMPLE = ROOT / "data/usmle_sample"


def test_calibrate_saves_a_temperature_that_eval_then_reports(tiny_model, tmp_path, capsys, caplog):
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    argv = ["calibrate", "--model", str(model), "--task", "medqa_4opt", "--dev", str(SAMPLE / "train.jsonl"),
            "--held-out", str(SAMPLE / "test.jsonl"), "--batch-size", "4"]  # fmt: skip
    cli.main(argv)
    printed = capsys.readouterr().out
    saved = json.loads((model / "calibration.json").read_text())
    assert saved["temperature"] > 0 and saved["fitted_on"]["questions"] == 60 and saved["held_out"]["questions"] == 20
    assert saved["fitted_on"]["nll_after"] <= saved["fitted_on"]["nll_before"] + 1e-9  # the fit lowers what it fits
    assert f"temperature {saved['temperature']:.3f}, fitted on 60 questions" in printed
    assert "| medqa_4opt | option log-likelihoods (softmax) |" in printed
    assert "| medqa_4opt | log-likelihoods / fitted temperature |" in printed
    # eval finds the temperature: the same answers, and their confidences scaled.
    output = tmp_path / "eval.json"
    cli.main(["eval", "--model", str(model), "--tasks", "medqa_4opt", "--data", f"medqa_4opt={SAMPLE / 'test.jsonl'}",
              "--batch_size", "4", "--output", str(output)])  # fmt: skip
    report = json.loads(output.read_text())["tasks"]["medqa_4opt"]
    scaled, raw = report["calibration"]["acc_temperature_scaled"], report["calibration"]["acc"]
    assert scaled["temperature"] == saved["temperature"] and scaled["n"] == raw["n"] == 20
    # A temperature changes no answer, only how sure each is (and so which answers are the most sure).
    assert (scaled["mean_confidence"] < raw["mean_confidence"]) == (saved["temperature"] > 1)
    assert scaled["ece"] == pytest.approx(saved["held_out"]["after"]["ece"])
    assert "log-likelihoods / fitted temperature" in capsys.readouterr().out
    # A task it was not fitted on is scaled by it too: said as the evaluation starts.
    with caplog.at_level(logging.WARNING):
        cli.main(["eval", "--model", str(model), "--tasks", "other", "--data", f"other={SAMPLE / 'test.jsonl'}",
                  "--batch_size", "4", "--limit", "2"])  # fmt: skip
    assert "was fitted on medqa_4opt and scales the confidences of other too" in caplog.text
    # Its own earlier result is replaced only when asked; questions both fitted and measured are refused.
    for extra, words in (
        ([], "calibration.json already exists; pass --overwrite to replace it"),  # its path is its model's
        (["--overwrite", "--held-out", str(SAMPLE / "train.jsonl")], "share questions"),
    ):
        with pytest.raises(SystemExit) as info:
            cli.main([*argv, *extra])
        assert info.value.code == 2 and words in capsys.readouterr().err


def test_calibrate_says_a_fit_on_the_runs_own_training_questions_and_one_at_the_range_end(
    tiny_model, tmp_path, caplog
):
    """--dev the very file the run trained on (its run.json beside final/ names it): the fit makes
    the model overconfident, said; a temperature at an end of the range searched is said too."""
    import math

    from medrecipes.evaluation.calibration import TEMPERATURE_RANGE, fit_temperature

    run = tmp_path / "run"
    shutil.copytree(tiny_model, run / "final")
    sources = [{"path": str(SAMPLE / "train.jsonl"), "format": "usmle"}]
    (run / "run.json").write_text(
        json.dumps({"script": "recipes/sft.py", "recipe": {"dataset_mixture": {"sources": sources}}})
    )
    with caplog.at_level(logging.WARNING):
        cli.main(["calibrate", "--model", str(run / "final"), "--task", "medqa_4opt", "--dev", str(SAMPLE / "train.jsonl"),
                  "--held-out", str(SAMPLE / "test.jsonl"), "--batch-size", "4"])  # fmt: skip
    assert f"--dev {SAMPLE / 'train.jsonl'} is data the run that saved {run / 'final'} trained on" in caplog.text
    fitted = json.loads((run / "final" / "calibration.json").read_text())["temperature"]
    at_end = min(abs(math.log(fitted / bound)) for bound in TEMPERATURE_RANGE) < 0.01
    assert ("is at the end of the range searched" in caplog.text) == at_end
    # Answers sure and always wrong: no temperature inside the range fits them, the search ends at its top.
    assert fit_temperature([[0.0, -9.0, -9.0]] * 50, [1] * 50) == pytest.approx(TEMPERATURE_RANGE[1], rel=1e-3)


def test_sampled_generate_mode_reports_the_votes_calibration(chat_model, tmp_path, capsys):
    output = tmp_path / "eval.json"
    cli.main(["eval", "--model", chat_model, "--tasks", "medqa_4opt", "--data", f"medqa_4opt={SAMPLE / 'test.jsonl'}",
              "--mode", "generate", "--samples", "3", "--temperature", "1.0", "--max_new_tokens", "4",
              "--output", str(output)])  # fmt: skip
    report = json.loads(output.read_text())["tasks"]["medqa_4opt"]
    assert report["samples"] == 3 and set(report["calibration"]) == {"votes"}
    assert all(len(p["votes"]) == 3 for p in report["predictions"])
    confidences = {round(max(sum(v == x for v in p["votes"]) for x in "ABCD") / 3, 6) for p in report["predictions"]}
    assert confidences <= {0.0, round(1 / 3, 6), round(2 / 3, 6), 1.0}
    with pytest.raises(SystemExit) as info:
        cli.main(["eval", "--model", chat_model, "--tasks", "medqa_4opt", "--samples", "3"])
    assert info.value.code == 2 and "samples 3 draws several answers" in capsys.readouterr().err


def test_generate_mode_counts_abstentions_apart_from_unparseable_replies():
    from medrecipes.evaluation.generate import score

    rows = [
        {"id": str(i), "subject": "s", "question": "?", "options": {"A": "yes", "B": "no"}, "answer": "A"}
        for i in range(4)
    ]
    report = score(rows, ["A. yes", "I don't know.", "Hmm, hard to say", "I am not sure, maybe B"])
    assert [p["abstained"] for p in report["predictions"]] == [False, True, False, False]
    # "I am not sure, maybe B" hedges but names B: an answer (wrong), neither abstained nor unparseable.
    assert report["predictions"][3]["predicted"] == "B"
    assert report["abstained"] == 0.25 and report["unparseable"] == 0.25 and report["accuracy"] == 0.25
    assert "25.0% abstained" in format_report("t", report)


@pytest.mark.parametrize(
    "text, letters, expected",
    [
        ("I don't know.", "ABCD", True),
        ("I do not know", "ABCDEFGHIJ", True),  # its own "I" is not option I
        ("I don't know. A guess: B", "ABCD", False),
        ("I cannot tell from the abstract", "ABC", True),
        ("The answer is C, though I am not sure", "ABC", False),
        ("Not enough information", "ABC", False),  # no explicit abstention: unparseable
    ],
)
def test_an_abstention_declines_and_names_no_option(text, letters, expected):
    from medrecipes.usmle import is_abstention

    assert is_abstention(text, letters) is expected


def test_the_card_has_a_calibration_table_and_says_what_it_means_for_use():
    from medrecipes.config import parse_recipe
    from medrecipes.hub.card import model_card

    logliks, gold, probabilities = predictions(seed=10, n=200)
    confidence, right, gold_p = cal.question_arrays(probabilities, gold)
    found = cal.calibration_report(confidence, right, gold_p, resamples=50)
    report = {
        "accuracy": float(right.mean()),
        "n": 200,
        "ci95": [0.4, 0.6],
        "mode": "loglik",
        "calibration": {"acc": found},
    }
    record = card_record("cpt", parse_recipe("cpt", ["recipes/tiny_cpt.yaml"]))
    summary = {"steps": 1, "tokens_seen": 1024, "training_time": "0:01:00", "final_train_loss": 2.0}
    text = str(model_card("med/x", record, summary, {}, mcq_reports={"medqa_4opt": report}))
    assert "| task | confidence from | ECE | Brier | NLL | AUROC | acc @50% | acc @80% | acc @90% |" in text
    assert f"| medqa_4opt | option probabilities | {cal.with_interval(found, 'ece', '.3f')} |" in text
    kept = found["selective_accuracy@0.8"]
    assert (
        f"On medqa_4opt the model is right {right.mean():.0%} of the time; its 80% most confident answers are right {kept:.0%}"
        in text
    )
    assert ("raises the accuracy" if kept > right.mean() else "does not raise") in text
