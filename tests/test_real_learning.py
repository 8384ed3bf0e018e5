"""The report of the learning check (benchmarks/real_learning_gemma.py): figures read from the eval
outputs, a paired bootstrap for "stage B beats stage A", label counts that show a collapse, and
each target judged on the figure it names."""

import json
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import real_learning_gemma as check  # noqa: E402


def eval_output(answers: str, predicted: str, setting: str) -> dict:
    """`medrecipes eval`'s output for PubMedQA questions q0, q1, ... with these gold and predicted letters."""
    from medrecipes.evaluation.generate import score

    rows = [
        {"id": f"q{i}", "subject": "", "answer": a, "options": ["yes", "no", "maybe"]} for i, a in enumerate(answers)
    ]
    report = score(rows, [f"{p}. {check.LABELS.get(p, '')}" for p in predicted])
    return {"tasks": {"pubmedqa": {**report, "pubmedqa_setting": setting}}}


@pytest.fixture
def out(tmp_path):
    gold = "AAAAABBBC" * 4
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "split.json").write_text(json.dumps({"seed": 42, "labels": {}}))
    decisions = {"A": "yes", "B": "no", "C": "maybe"}
    dev = {f"q{i}": {"final_decision": decisions[a]} for i, a in enumerate(gold)}
    (tmp_path / "data" / "pubmedqa_dev.json").write_text(json.dumps(dev))
    (tmp_path / "eval").mkdir()
    outputs = {
        "base-free-pubmedqa-loglik": "B" * len(gold),  # 8 of 36 right
        "sft-free-pubmedqa-generate": "A" * len(gold),  # always yes: 20 of 36
        "grpo-free-pubmedqa-generate": gold[:-4] + "AAAA",  # all but the last four right
    }
    for stem, predicted in outputs.items():
        (tmp_path / "eval" / f"{stem}.json").write_text(json.dumps(eval_output(gold, predicted, "reasoning_free")))
    return tmp_path


def test_the_report_reads_every_stage_and_judges_its_targets(out):
    report = check.summarise(out, {"sft-free": 60.0, "cpt": 900.0})
    stages = report["stages"]
    assert list(stages) == ["always yes", "base (loglik)", "SFT", "GRPO from SFT"]
    assert stages["always yes"]["accuracy"] == stages["SFT"]["accuracy"] == pytest.approx(20 / 36)
    assert stages["SFT"]["predicted"] == {"yes": 36, "no": 0, "maybe": 0, "none": 0}
    assert stages["GRPO from SFT"]["accuracy"] == pytest.approx(32 / 36)
    assert stages["SFT"]["setting"] == "reasoning_free"
    assert set(report["claims"]) == {"SFT beats always-yes", "SFT beats the base", "GRPO beats SFT"}
    assert report["claims"]["SFT beats always-yes"] == {"difference": 0.0, "ci95": [0.0, 0.0]}  # the same answers
    grpo = report["claims"]["GRPO beats SFT"]
    assert grpo["difference"] == pytest.approx(12 / 36) and 0 < grpo["ci95"][0] < grpo["difference"] < grpo["ci95"][1]
    met = {t["target"]: t["met"] for t in report["targets"]}
    assert met["reasoning-free GRPO beats SFT, paired 95% interval above 0"]
    assert not met["reasoning-free SFT: accuracy >= 75%, macro-F1 >= 0.55, 95% lower bound above 54.7%"]
    assert (
        not met["SFT: predicted labels not all one class"] and met["GRPO from SFT: predicted labels not all one class"]
    )
    assert report["seconds"] == {"sft-free": 60.0}  # the real check's own stages are timed in its report
    text = check.markdown(report)
    assert "| reasoning_free | SFT | 55.6% (" in text and "| GRPO beats SFT | +33.3% (paired 95% CI +" in text


def test_the_paired_interval_is_zero_for_the_same_answers_and_refuses_other_questions(out):
    sft = check.read(out / "eval" / "sft-free-pubmedqa-generate.json")
    assert check.paired(sft, sft) == {"difference": 0.0, "ci95": [0.0, 0.0]}
    fewer = {**sft, "predictions": sft["predictions"][:-1]}
    with pytest.raises(SystemExit, match="different questions"):
        check.paired(sft, fewer)


def test_the_gpu_runs_reasoning_required_grpo_is_judged_against_its_sft(out):
    gold = "AAAAABBBC" * 4
    for stem, predicted in (
        ("sft-long-pubmedqa-generate", gold[:-9] + "A" * 9),
        ("grpo-long-pubmedqa-generate", gold),
    ):
        (out / "eval" / f"{stem}.json").write_text(json.dumps(eval_output(gold, predicted, "reasoning_required")))
    report = check.summarise(out, {"grpo-long": 90.0})
    assert report["stages"]["GRPO from long-answer SFT"]["accuracy"] == 1.0
    assert report["claims"]["GRPO beats long-answer SFT"]["difference"] == pytest.approx(4 / 36)
    met = {t["target"]: t for t in report["targets"]}
    assert met["reasoning-required GPU run: SFT accuracy >= 62%, macro-F1 >= 0.45"]["met"]  # 32 of 36
    assert met["reasoning-required GPU run: GRPO beats SFT, paired 95% interval above 0"]["met"]
    assert report["seconds"] == {"grpo-long": 90.0}


def test_every_gpu_stage_runs_a_recipe_that_exists_with_keys_it_takes():
    """The GPU run's stages parse as they will run there: each recipe with its overrides (the
    model and output folder as the stage sets them), before any GPU time is spent."""
    from medrecipes.config import parse_recipe

    for name, overrides in check.GPU_STAGES.items():
        recipe = check.GPU_RECIPES.get(name) or check.RECIPES[name]
        method = "grpo" if name.startswith("grpo") else "sft"
        # On this CPU: --use_cpu true, and no --bf16 (checked against the device it runs on).
        keys = dict(zip(overrides[::2], overrides[1::2], strict=True)) | {"--use_cpu": "true"}
        keys.pop("--bf16")
        where = ["--model_name_or_path", "models/any", "--output_dir", "/tmp/any"]
        where += [word for pair in keys.items() for word in pair]
        _, args, model_args = parse_recipe(method, [str(ROOT / recipe), *where])
        assert model_args.use_peft, name  # what comes back is an adapter
        if method == "grpo":
            assert args.max_steps == 100, name
        else:
            assert args.num_train_epochs == 12, name


def test_each_finished_stage_gets_its_card_with_its_dev_evaluation(out, tmp_path, monkeypatch):
    calls = []

    def card(*args):  # `medrecipes card RUN EVAL --output DIR ...`, as the command writes it
        calls.append(args)
        folder = args[args.index("--output") + 1]
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "README.md").write_text(f"card of {args[1]}")

    monkeypatch.setattr(check, "medrecipes", card)
    monkeypatch.setattr(check, "RESULTS", tmp_path / "results")
    (out / "sft-free" / "final").mkdir(parents=True)
    (out / "grpo-free" / "final").mkdir(parents=True)  # trained, then its evaluation is missing
    (out / "eval" / "grpo-free-pubmedqa-generate.json").unlink()
    written = check.cards(out, "learning")
    assert [c[:3] for c in calls] == [
        ("card", str(out / "sft-free"), str(out / "eval" / "sft-free-pubmedqa-generate.json"))
    ]
    assert written == [tmp_path / "results" / "learning_cards" / "sft-free.md"]
    assert written[0].read_text() == f"card of {out / 'sft-free'}"
