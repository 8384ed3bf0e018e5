"""The learning check (benchmarks/real_learning_gemma.py): its validation questions carved from the
training ones, its recipes rewritten seed by seed, and its report: figures read from the eval
outputs seed by seed, each stage's mean, worst seed and spread, a paired bootstrap per seed for
"stage B beats stage A", label counts that show a collapse, each target judged on the figures it
names."""

import json
from collections import Counter

import pytest
import real_learning_gemma as check
import yaml
from checks import ablations as ablation_arms
from checks import learning_markdown, learning_recipes, learning_report
from checks import stages as stage_commands
from conftest import ROOT, SHARED_DATA

GOLD = "AAAAABBBC" * 4  # 36 dev questions: 20 yes, 12 no, 4 maybe


def eval_output(answers: str, predicted: str, setting: str) -> dict:
    """`medrecipes eval`'s output for PubMedQA questions q0, q1, ... with these gold and predicted letters."""
    from medrecipes.evaluation.generate import score

    rows = [
        {"id": f"q{i}", "subject": "", "answer": a, "options": ["yes", "no", "maybe"]} for i, a in enumerate(answers)
    ]
    report = score(rows, [f"{p}. {learning_recipes.LABELS.get(p, '')}" for p in predicted])
    return {"tasks": {"pubmedqa": {**report, "pubmedqa_setting": setting}}}


def write_eval(out, stage: str, mode: str, seed: int | None, predicted: str, setting: str = "reasoning_free") -> None:
    path = learning_report.eval_file(out, stage, mode, seed)
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(eval_output(GOLD, predicted, setting)))


@pytest.fixture
def out(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "split.json").write_text(json.dumps({"seed": 42, "labels": {}}))
    decisions = {"A": "yes", "B": "no", "C": "maybe"}
    dev = {f"q{i}": {"final_decision": decisions[a]} for i, a in enumerate(GOLD)}
    (tmp_path / "data" / "pubmedqa_dev.json").write_text(json.dumps(dev))
    write_eval(tmp_path, "base-free", "loglik", None, "B" * len(GOLD))  # 12 of 36 right
    write_eval(tmp_path, "sft-free", "generate", 1, "A" * len(GOLD))  # always yes: 20 of 36
    write_eval(tmp_path, "sft-free", "generate", 2, GOLD[:-18] + "A" * 18)  # yes to the last 18: 28 of 36
    write_eval(tmp_path, "grpo-free", "generate", 1, GOLD[:-4] + "AAAA")  # all but the last four: 32
    write_eval(tmp_path, "grpo-free", "generate", 2, GOLD[:-18] + "A" * 18)  # as its SFT: 28
    return tmp_path


def test_the_report_gives_every_seed_the_mean_the_worst_and_the_spread(out):
    report = learning_report.summarise(out, {"sft-free-s1": 60.0, "sft-free-s2": 70.0, "cpt": 900.0}, [1, 2], "cpu")
    stages = report["stages"]
    assert list(stages) == ["always yes", "base (loglik)", "SFT", "GRPO from SFT"]
    sft = stages["SFT"]
    assert [(e["seed"], e["accuracy"]) for e in sft["seeds"]] == [
        (1, pytest.approx(20 / 36)),
        (2, pytest.approx(28 / 36)),
    ]
    assert sft["accuracy"] == pytest.approx(24 / 36) and sft["worst"] == pytest.approx(20 / 36)
    assert sft["spread"] == pytest.approx(8 / 36) and sft["setting"] == "reasoning_free"
    assert sft["macro_f1"] == pytest.approx(sum(e["macro_f1"] for e in sft["seeds"]) / 2)
    assert sft["seeds"][0]["predicted"] == {"yes": 36, "no": 0, "maybe": 0, "none": 0}
    assert [e["seed"] for e in stages["base (loglik)"]["seeds"]] == [None]  # trained by no one: once
    # Each seed's GRPO against the same seed's SFT: it holds only where every seed's interval does.
    grpo = report["claims"]["GRPO beats SFT"]
    assert [p["seed"] for p in grpo["seeds"]] == [1, 2]
    assert grpo["seeds"][0]["difference"] == pytest.approx(12 / 36) and grpo["seeds"][0]["ci95"][0] > 0
    assert grpo["seeds"][1] == {"seed": 2, "difference": 0.0, "ci95": [0.0, 0.0]}
    assert grpo["difference"] == pytest.approx(6 / 36) and not grpo["holds"]
    yes = report["claims"]["SFT beats always-yes"]  # the unseeded baseline against each seed
    assert [p["difference"] for p in yes["seeds"]] == [0.0, pytest.approx(8 / 36)] and not yes["holds"]
    met = {t["target"]: t for t in report["targets"]}
    sft_target = met["reasoning-free SFT: mean accuracy >= 65%, worst seed >= 60%, mean macro-F1 >= 0.45"]
    assert not sft_target["met"] and "worst 55.6%" in sft_target["figure"]  # the mean (66.7%) alone would pass
    # Its claim pooled over the seeds: every seed's answers against its own SFT's, together.
    pool = stages["GRPO from SFT"]["pooled_paired"]
    assert stages["GRPO from SFT"]["from"] == "SFT" and pool["seeds"] == 2
    assert pool["mean"] == pytest.approx(12 / 72) and 0 < pool["ci95"][0] < pool["mean"] < pool["ci95"][1]
    grpo_target = met[
        "GRPO over its SFT start: mean >= +3 points and the paired interval pooled over the seeds above 0"
    ]
    assert grpo_target["met"] and "pooled +16.7% (" in grpo_target["figure"]
    assert met["reasoning-free SFT, 2 seeds, within 60 minutes on this machine"]["met"]
    assert not met["SFT: predicted labels not all one class, in every seed"]["met"]  # seed 1 said yes to all
    assert met["SFT: predicted labels not all one class, in every seed"]["figure"] == "one class in seed(s) [1]"
    base = met["base (loglik): predicted labels not all one class, in every seed"]  # said "no" to all, once
    assert not base["met"] and base["figure"] == "one class in its one run"
    assert report["seconds"] == {"sft-free-s1": 60.0, "sft-free-s2": 70.0}
    text = learning_markdown.markdown(report)
    assert "| reasoning_free | SFT | s1: 55.6% (" in text and "<br>s2: 77.8% (" in text
    assert "| 66.7% | 55.6% | 22.2% |" in text and "not in every seed" in text


def test_a_seed_missing_its_stage_is_left_out_and_the_time_target_counts_the_seeds(out):
    report = learning_report.summarise(out, {"sft-free-s1": 3000.0, "sft-free-s2": 700.0}, [1, 2, 3], "cpu")
    assert [e["seed"] for e in report["stages"]["SFT"]["seeds"]] == [1, 2]
    met = {t["target"]: t for t in report["targets"]}
    timing = met["reasoning-free SFT, 3 seeds, within 60 minutes on this machine"]
    assert not timing["met"] and timing["figure"] == "61.7 min for 2 seeds"


def test_the_report_names_the_checkpoint_each_run_kept(out):
    state = {"best_global_step": 76, "best_metric": 0.62, "global_step": 152, "log_history": []}
    (out / "sft-free-s1").mkdir()
    (out / "sft-free-s1" / "trainer_state.json").write_text(json.dumps(state))
    report = learning_report.summarise(out, {}, [1, 2], "cpu")
    first, second = report["stages"]["SFT"]["seeds"]
    assert first["selected_checkpoint"] == {"step": 76, "validation": 0.62, "of_steps": 152}
    assert "selected_checkpoint" not in second
    assert "s1: 55.6% (" in learning_markdown.markdown(report) and "[step 76]" in learning_markdown.markdown(report)


def test_the_paired_interval_is_zero_for_the_same_answers_and_refuses_other_questions(out):
    sft = learning_report.read(learning_report.eval_file(out, "sft-free", "generate", 1))
    assert learning_report.paired(sft, sft) == {"difference": 0.0, "ci95": [0.0, 0.0]}
    fewer = {**sft, "predictions": sft["predictions"][:-1]}
    with pytest.raises(SystemExit, match="different questions"):
        learning_report.paired(sft, fewer)


def test_the_gpu_runs_reasoning_required_grpo_is_judged_against_its_sft(out):
    write_eval(out, "sft-long", "generate", 1, GOLD[:-9] + "A" * 9, "reasoning_required")
    write_eval(out, "grpo-long", "generate", 1, GOLD, "reasoning_required")
    report = learning_report.summarise(out, {"grpo-long-s1": 90.0}, [1], "gpu")
    assert report["stages"]["GRPO from long-answer SFT"]["accuracy"] == 1.0
    assert report["claims"]["GRPO beats long-answer SFT"]["difference"] == pytest.approx(4 / 36)
    met = {t["target"]: t for t in report["targets"]}
    best = met["reasoning-required, best recipe: mean accuracy >= 58%, worst seed above always-yes (54.7%)"]
    assert best["met"] and best["figure"].startswith("GRPO from long-answer SFT: mean 100.0%")
    assert report["seconds"] == {"grpo-long-s1": 90.0}


def pqal(decisions: str) -> dict:
    names = {"A": "yes", "B": "no", "C": "maybe"}
    return {str(1000 + i): {"QUESTION": f"Q{i}?", "CONTEXTS": ["c"], "final_decision": names[d]}
            for i, d in enumerate(decisions)}  # fmt: skip


def carve(tmp_path, rows: dict, dev: int, size: int, seed: int = 42):
    """The check's own data stages on `rows` (PQA-L's layout): dev, then the validation questions."""
    from real_check_gemma import stage_data

    tmp_path.mkdir(parents=True, exist_ok=True)
    source = tmp_path / "pqal.json"
    source.write_text(json.dumps(rows))
    out = tmp_path / f"out-{seed}"
    medqa = tmp_path / "medqa.jsonl"
    medqa.write_text(
        "".join(json.dumps({"question": "q", "options": {"A": "a"}, "answer": "A"}) + "\n" for _ in range(3))
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("real_check_gemma.PUBMEDQA", source)
        patch.setattr("real_check_gemma.MEDQA", medqa)
        stage_data(out, dev, 1, seed)
    check.stage_validation(out, size, seed)
    read = {
        name: json.loads((out / "data" / f"pubmedqa_{name}.json").read_text())
        for name in ("dev", "train", "fit", "val")
    }
    return out, read


@pytest.mark.parametrize(
    "source",
    [
        pytest.param("fixture", id="bundled rows"),
        pytest.param(
            "pqal", id="PubMedQA PQA-L",
            marks=pytest.mark.skipif(not (SHARED_DATA / "pubmedqa").is_dir(), reason="no ../shared/data"),
        ),
    ],
)  # fmt: skip
def test_the_validation_questions_are_training_questions_in_their_label_proportions(tmp_path, source):
    """Validation comes from the training questions (never dev), the recipes train on the rest, the
    labels keep their proportions, and the same seed gives the same questions."""
    rows = (
        pqal("AAAAABBBC" * 40)
        if source == "fixture"
        else json.loads((SHARED_DATA / "pubmedqa" / "pqal_trainval_500.json").read_text())
    )
    out, read = carve(tmp_path, rows, dev=150, size=50)
    assert len(read["val"]) == 50 and len(read["fit"]) == len(read["train"]) - 50
    assert set(read["val"]) | set(read["fit"]) == set(read["train"]) and not set(read["val"]) & set(read["fit"])
    assert not set(read["val"]) & set(read["dev"])
    train = Counter(r["final_decision"] for r in read["train"].values())
    val = Counter(r["final_decision"] for r in read["val"].values())
    for label, count in train.items():
        assert abs(val[label] - 50 * count / len(read["train"])) <= 1, (label, val, train)
    split = json.loads((out / "data" / "split.json").read_text())
    assert split["labels"]["validation"] == {label: val[label] for label in ("yes", "no", "maybe")}
    assert carve(tmp_path / "again", rows, dev=150, size=50)[1]["val"].keys() == read["val"].keys()


def test_each_seed_runs_the_recipe_with_its_own_folders_and_seed(tmp_path):
    sft = yaml.safe_load(open(check.seeded_recipe(tmp_path, "sft-free", 2)))
    shipped = yaml.safe_load((ROOT / learning_recipes.RECIPES["sft-free"]).read_text())
    assert sft["seed"] == 2 and sft["output_dir"] == str(tmp_path / "sft-free-s2")
    assert sft["dataset_mixture"]["sources"][0]["path"] == str(tmp_path / "data" / "pubmedqa_fit.json")
    assert sft["eval_sets"]["validation"]["path"] == str(tmp_path / "data" / "pubmedqa_val.json")
    assert sft["metric_for_best_model"] == "eval_validation_acc" and sft["load_best_model_at_end"]
    assert {k: v for k, v in sft.items() if k not in ("seed", "output_dir", "dataset_mixture", "eval_sets")} == {
        k: v for k, v in shipped.items() if k not in ("seed", "output_dir", "dataset_mixture", "eval_sets")
    }
    grpo = yaml.safe_load(open(check.seeded_recipe(tmp_path, "grpo-free", 3)))
    assert grpo["model_name_or_path"] == str(tmp_path / "sft-free-s3" / "final") and grpo["seed"] == 3
    dpo = yaml.safe_load(open(check.seeded_recipe(tmp_path, "dpo-free", 3)))
    assert dpo["dataset_mixture"]["sources"][0]["path"] == str(
        tmp_path / "preference-gold-free-s3" / "pairs_train.jsonl"
    )
    balanced = bool(shipped["dataset_mixture"]["sources"][0].get("balance_answers"))
    shipped_file = check.seeded_recipe(tmp_path, "sft-free", 1)
    flip_file = check.seeded_recipe(
        tmp_path, "sft-free", 1, **ablation_arms.ABLATIONS["balance"].switched(tmp_path, 1)
    )
    assert flip_file != shipped_file  # one file per run
    kept = yaml.safe_load(open(shipped_file))["dataset_mixture"]["sources"][0]
    assert bool(kept.get("balance_answers")) == balanced and ablation_arms.ABLATIONS["balance"].arms() == (
        balanced,
        not balanced,
    )
    flip = yaml.safe_load(open(flip_file))
    switched = flip["dataset_mixture"]["sources"][0]
    # on where the recipe is off; off, its default, by the key taken out: the recipe without the key
    assert switched == (
        {k: v for k, v in kept.items() if k != "balance_answers"} if balanced else {**kept, "balance_answers": True}
    )
    assert flip["output_dir"] == str(tmp_path / "sft-free-flip-s1")
    assert "balance_answers" not in flip["eval_sets"]["validation"]  # validation is scored as it is
    assert {k: v for k, v in flip.items() if k not in ("dataset_mixture", "output_dir")} == {
        k: v for k, v in yaml.safe_load(open(shipped_file)).items() if k not in ("dataset_mixture", "output_dir")
    }  # nothing else switched
    passes = yaml.safe_load(
        open(check.seeded_recipe(tmp_path, "sft-free", 1, **ablation_arms.ABLATIONS["passes"].switched(tmp_path, 1)))
    )
    assert passes["num_train_epochs"] == {3: 4, 4: 3}[shipped["num_train_epochs"]]
    assert passes["output_dir"] == str(tmp_path / "sft-free-passes-s1")
    assert {k: v for k, v in passes.items() if k not in ("num_train_epochs", "output_dir")} == {
        k: v for k, v in yaml.safe_load(open(shipped_file)).items() if k not in ("num_train_epochs", "output_dir")
    }


def test_each_seed_runs_the_pipeline_a_user_would_and_sft_on_every_question_beside_it(tmp_path, monkeypatch):
    """A seed's reasoning-free stages, as the check lists them without running them: SFT on its part,
    that model's pass rate on the GRPO recipe's part, DPO on the gold pairs the pass rate keeps
    (validation, then dev), GRPO on the questions it keeps, then the SFT recipe on every training
    question; each recipe as it ships, only its folders the seed's."""
    import argparse

    listed, commands = {}, []

    def stage(name, done, work, recipe=()):
        listed[name] = (done, work, recipe)

    monkeypatch.setattr(check, "medrecipes", lambda *words: commands.append(words))
    monkeypatch.setattr(stage_commands, "medrecipes", lambda *words: commands.append(words))  # its evaluations
    args = argparse.Namespace(part="free", ablation=[], stop_after=None, samples=8, rationale=False)
    check.cpu_stages(tmp_path, stage, args, [2])
    assert list(listed) == [
        "eval-base-free", "sft-free-s2", "eval-sft-free-s2", "pass-rate-free-s2", "pairs-gold-free-s2", "dpo-free-s2",
        "eval-dpo-free-validation-s2", "eval-dpo-free-s2", "grpo-free-s2", "eval-grpo-free-s2", "sft-all-free-s2",
        "eval-sft-all-free-s2",
    ]  # fmt: skip
    recipes = {
        name: yaml.safe_load(open(listed[name][2][1]))
        for name in ("sft-free-s2", "grpo-free-s2", "dpo-free-s2", "sft-all-free-s2")
    }
    sft, grpo, dpo, everything = recipes.values()
    rates = str(tmp_path / "pass-rate-free-s2" / "pass_rate.jsonl")
    source = grpo["dataset_mixture"]["sources"][0]
    assert sft["dataset_mixture"]["sources"][0]["part"] == {"share": 0.6, "take": "first", "seed": 42}
    assert source["part"] == {"share": 0.6, "take": "rest", "seed": 42}  # the questions SFT never saw
    assert source["pass_rate"]["file"] == dpo["dataset_mixture"]["sources"][0]["pass_rate"]["file"] == rates
    assert grpo["model_name_or_path"] == dpo["model_name_or_path"] == str(tmp_path / "sft-free-s2" / "final")
    assert "part" not in everything["dataset_mixture"]["sources"][0]
    assert everything["output_dir"] == str(tmp_path / "sft-all-free-s2")
    assert {k: v for k, v in everything.items() if k not in ("dataset_mixture", "output_dir")} == {
        k: v for k, v in sft.items() if k not in ("dataset_mixture", "output_dir")
    }  # nothing else changed
    done, work, _ = listed["pass-rate-free-s2"]
    work()
    assert commands[-1] == ("pass-rate", listed["grpo-free-s2"][2][1], "--samples", "8", "--seed", "2")
    assert str(done) == rates  # where the GRPO recipe reads it
    done, work, _ = listed["eval-dpo-free-validation-s2"]
    work()  # the validation questions, never dev
    assert f"pubmedqa={tmp_path / 'data' / 'pubmedqa_val.json'}" in commands[-1]
    assert commands[-1][commands[-1].index("--model") + 1] == str(tmp_path / "dpo-free-s2" / "merged")
    done, work, _ = listed["pairs-gold-free-s2"]
    work()
    assert commands[-1][commands[-1].index("--out") + 1] == str(done) and "--model" not in commands[-1]


@pytest.mark.skipif(not (SHARED_DATA / "pubmedqa").is_dir(), reason="no ../shared/data")
def test_the_sft_and_rl_parts_of_the_real_training_questions_are_disjoint(tmp_path):
    """The shipped SFT and GRPO recipes on the check's real training questions (PQA-L, the seed-42
    split): the GRPO recipe's questions are none of the SFT's, the two together every one, each
    answer in the same proportion in both."""
    from medrecipes.config import parse_recipe
    from medrecipes.data.sources import load_mcq_source

    rows = json.loads((SHARED_DATA / "pubmedqa" / "pqal_trainval_500.json").read_text())
    out, _ = carve(tmp_path, rows, dev=150, size=50)
    parts = {}
    for name, method in (("sft-free", "sft"), ("grpo-free", "grpo")):
        recipe, _, _ = parse_recipe(method, [check.seeded_recipe(out, name, 1)])
        source = recipe.mixture.sources[0]
        source.pass_rate = None  # the questions the part gives, before any pass rate
        parts[name] = load_mcq_source(source)
    sft, grpo = (set(parts[name]["id"]) for name in ("sft-free", "grpo-free"))
    fit = json.loads((out / "data" / "pubmedqa_fit.json").read_text())
    assert not sft & grpo and sft | grpo == set(fit) and (len(sft), len(grpo)) == (180, 120)
    for answer, n in Counter(parts["sft-free"]["answer"]).items():
        assert abs(n / 180 - Counter(parts["grpo-free"]["answer"])[answer] / 120) < 0.02, answer


def test_the_dpo_runs_are_compared_on_validation_with_dev_beside(out):
    write_eval(out, "dpo-free-validation", "generate", 1, GOLD)  # 36 of 36
    write_eval(out, "dpo-free-validation", "generate", 2, GOLD[:-9] + "A" * 9)  # 32 of 36
    write_eval(out, "dpo-free", "generate", 2, GOLD[:-18] + "A" * 18)  # dev: 28 of 36
    write_eval(out, "dpo-free", "generate", 3, GOLD)  # dev without validation: not compared
    found = ablation_arms.pair_sources(out, [1, 2, 3])
    assert found == {
        "DPO on gold pairs (recipe)": {
            "1": {"validation": 1.0},
            "2": {"validation": pytest.approx(32 / 36), "dev": pytest.approx(28 / 36)},
        },
    }
    text = ablation_arms.ablation_markdown(found, "DPO")
    assert "| DPO | seed 1 | seed 2 | mean of the seeds run |" in text
    assert "| DPO on gold pairs (recipe) | 100.0% | 88.9%; dev 77.8% | 94.4% |" in text


def test_every_gpu_stage_runs_a_recipe_that_exists_with_keys_it_takes():
    """The GPU run's stages parse as they will run there: each recipe with its overrides (the
    model and output folder as the stage sets them), before any GPU time is spent."""
    from medrecipes.config import parse_recipe

    for name, overrides in learning_recipes.GPU_STAGES.items():
        recipe = learning_recipes.RECIPES[name]
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


def test_each_finished_run_gets_its_card_with_its_dev_evaluation(out, tmp_path, monkeypatch):
    calls = []

    def card(*args):  # `medrecipes card RUN EVAL --output DIR ...`, as the command writes it
        calls.append(args)
        folder = args[args.index("--output") + 1]
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "README.md").write_text(f"card of {args[1]}")

    monkeypatch.setattr(check, "medrecipes", card)
    monkeypatch.setattr(check, "RESULTS", tmp_path / "results")
    for run in ("sft-free-s1", "grpo-free-s1", "sft-free-flip-s1", "dpo-free-s1"):
        (out / run / "final").mkdir(parents=True)  # grpo-free-s1 trained; sft-free-flip-s1 has no dev evaluation
    learning_report.eval_file(out, "grpo-free", "generate", 1).unlink()
    (out / "dpo-free-s1" / "final" / "adapter_config.json").write_text("{}")  # a LoRA run, evaluated merged
    dpo = learning_report.eval_file(out, "dpo-free", "generate", 1)
    dpo.write_text(learning_report.eval_file(out, "sft-free", "generate", 1).read_text())
    written = check.cards(out, "learning", [1, 2])
    assert [c[:3] for c in calls] == [
        ("card", str(out / "sft-free-s1"), str(learning_report.eval_file(out, "sft-free", "generate", 1))),
        ("card", str(out / "dpo-free-s1"), str(dpo)),
    ]
    cards = tmp_path / "results" / "learning_cards"
    assert written == [cards / "sft-free-s1.md", cards / "dpo-free-s1.md"]
    assert written[0].read_text() == f"card of {out / 'sft-free-s1'}"


def test_the_balance_ablation_compares_the_kept_validation_accuracy_seed_by_seed(out):
    shipped = bool(
        yaml.safe_load((ROOT / learning_recipes.RECIPES["sft-free"]).read_text())["dataset_mixture"]["sources"][0].get(
            "balance_answers"
        )
    )
    for run, step, accuracy, balanced in (
        ("sft-free-s1", 152, 0.72, shipped),
        ("sft-free-s2", 114, 0.64, shipped),
        ("sft-free-flip-s1", 189, 0.7, not shipped),
    ):
        (out / run).mkdir()
        state = {"best_global_step": step, "best_metric": accuracy, "global_step": 252, "log_history": []}
        (out / run / "trainer_state.json").write_text(json.dumps(state))
        source = {"path": "fit.json", "format": "usmle", **({"balance_answers": True} if balanced else {})}
        (out / run / "run.json").write_text(json.dumps({"recipe": {"dataset_mixture": {"sources": [source]}}}))
    found = ablation_arms.ablation(out, [1, 2], "balance")
    ours, other = f"balance_answers {shipped}".lower(), f"balance_answers {not shipped}".lower()
    assert list(found) == [ours, other]  # the recipe's setting first
    assert found[ours] == {  # the recipe's runs, evaluated on dev (the fixture's 20 and 28 of 36)
        "1": {"step": 152, "validation": 0.72, "of_steps": 252, "dev": pytest.approx(20 / 36)},
        "2": {"step": 114, "validation": 0.64, "of_steps": 252, "dev": pytest.approx(28 / 36)},
    }
    assert found[other] == {"1": {"step": 189, "validation": 0.7, "of_steps": 252}}  # not on dev yet
    text = ablation_arms.ablation_markdown(found)
    assert f"| {ours} | 72.0% (step 152); dev 55.6% | 64.0% (step 114); dev 77.8% | 68.0% |" in text
    assert f"| {other} | 70.0% (step 189) | not run | 70.0% |" in text
    write_eval(out, "sft-free-flip", "generate", 1, GOLD[:-9] + "A" * 9)  # 32 of 36 right
    found = ablation_arms.ablation(out, [1, 2], "balance")
    assert found[other]["1"]["dev"] == pytest.approx(32 / 36)
    assert f"| {other} | 70.0% (step 189); dev 88.9% | not run | 70.0% |" in ablation_arms.ablation_markdown(found)
    # A run is put by the setting its record names, not by its folder: a folder trained before the
    # recipe switched its setting is read right.
    (out / "sft-free-s2" / "run.json").write_text(
        json.dumps({"recipe": {"dataset_mixture": {"sources": [{"balance_answers": not shipped}]}}})
    )
    found = ablation_arms.ablation(out, [1, 2], "balance")
    assert set(found[ours]) == {"1"} and found[other]["2"]["validation"] == 0.64


def test_the_passes_ablation_puts_each_run_by_the_passes_its_record_names(out):
    """Each ablation reads only the recipe's runs and its own folder's; the report gives every
    ablation with a run there, each in its own table."""
    shipped = yaml.safe_load((ROOT / learning_recipes.RECIPES["sft-free"]).read_text())["num_train_epochs"]
    other = 7 - shipped
    for run, passes, step, accuracy in (
        ("sft-free-s1", shipped, 152, 0.72),
        ("sft-free-passes-s1", other, 114, 0.76),
        ("sft-free-passes-s2", other, 114, 0.7),
        ("sft-free-flip-s1", shipped, 189, 0.9),  # the balance ablation's: not this one's
    ):
        (out / run).mkdir()
        state = {"best_global_step": step, "best_metric": accuracy, "global_step": 152, "log_history": []}
        (out / run / "trainer_state.json").write_text(json.dumps(state))
        recipe = {"num_train_epochs": passes, "dataset_mixture": {"sources": [{"path": "fit.json"}]}}
        (out / run / "run.json").write_text(json.dumps({"recipe": recipe}))
    found = ablation_arms.ablation(out, [1, 2], "passes")
    assert list(found) == [f"num_train_epochs {shipped}", f"num_train_epochs {other}"]
    assert found[f"num_train_epochs {shipped}"] == {
        "1": {"step": 152, "validation": 0.72, "of_steps": 152, "dev": pytest.approx(20 / 36)}
    }
    assert {s: run["validation"] for s, run in found[f"num_train_epochs {other}"].items()} == {"1": 0.76, "2": 0.7}
    text = ablation_arms.ablation_markdown(found)
    assert f"| num_train_epochs {shipped} | 72.0% (step 152); dev 55.6% | not run | 72.0% |" in text
    assert f"| num_train_epochs {other} | 76.0% (step 114) | 70.0% (step 114) | 73.0% |" in text
    assert list(ablation_arms.ablations(out, [1, 2])) == ["balance", "passes"]
    assert list(ablation_arms.ablations(out, [2])) == ["passes"]  # seed 2 has no switched balance run


def test_the_long_answer_balance_ablation_switches_balance_for_one_pass_and_answers_at_length(tmp_path, monkeypatch):
    """--ablation long-balance adds each seed's long-answer SFT with balance_answers switched (one
    pass where balanced), evaluated on dev as the recipe's long-answer runs are; the reasoning-free
    ablations are not the reasoning-required part's."""
    import argparse

    listed, commands = {}, []

    def stage(name, done, work, recipe=()):
        listed[name] = (done, work, recipe)

    def stages(ablation):
        listed.clear()
        check.cpu_stages(tmp_path, stage, argparse.Namespace(part="required", ablation=ablation, samples=8), [1])
        return [name for name in listed if name.startswith(("sft-", "eval-sft-"))]

    monkeypatch.setattr(check, "medrecipes", lambda *words: commands.append(words))
    monkeypatch.setattr(stage_commands, "medrecipes", lambda *words: commands.append(words))  # its evaluations
    assert stages([]) == ["sft-long-s1", "eval-sft-long-s1", "eval-sft-answer-only"]
    # GRPO with room to reason from the seed's long-answer SFT: its pass rate on the other part first
    assert [n for n in listed if "long" in n and "sft" not in n] == [
        "pass-rate-long-s1",
        "grpo-long-s1",
        "eval-grpo-long-s1",
    ]
    grpo = yaml.safe_load(open(listed["grpo-long-s1"][2][1]))
    assert grpo["model_name_or_path"] == str(tmp_path / "sft-long-s1-merged") and grpo["chain_of_thought"]
    source = grpo["dataset_mixture"]["sources"][0]
    assert source["part"]["take"] == "rest" and source["pass_rate"]["file"] == str(listed["pass-rate-long-s1"][0])
    assert stages(["balance", "long-balance"]) == [
        "sft-long-s1", "eval-sft-long-s1", "sft-long-flip-s1", "eval-sft-long-flip-s1", "eval-sft-answer-only",
    ]  # fmt: skip
    shipped, flip = (yaml.safe_load(open(listed[name][2][1])) for name in ("sft-long-s1", "sft-long-flip-s1"))
    assert ablation_arms.balance_of(flip) != ablation_arms.balance_of(shipped) and flip["num_train_epochs"] == (
        1 if ablation_arms.balance_of(flip) else 2
    )
    assert flip["output_dir"] == str(tmp_path / "sft-long-flip-s1")
    switched = ("dataset_mixture", "num_train_epochs", "output_dir")
    assert {k: v for k, v in flip.items() if k not in switched} == {
        k: v for k, v in shipped.items() if k not in switched
    }
    done, work, _ = listed["eval-sft-long-flip-s1"]
    work()
    command = commands[-1]
    assert command[command.index("--model") + 1] == str(tmp_path / "sft-long-flip-s1-merged")
    assert command[command.index("--output") + 1] == str(done) and "--chain_of_thought" in command
    # Its arms are read from the long-answer runs' records, beside the recipe's runs
    for run, balanced, accuracy in (
        ("sft-long-s1", ablation_arms.balance_of(shipped), 0.52),
        ("sft-long-flip-s1", ablation_arms.balance_of(flip), 0.6),
    ):
        (tmp_path / run / "trainer_state.json").parent.mkdir(exist_ok=True)
        state = {"best_global_step": 38, "best_metric": accuracy, "global_step": 76, "log_history": []}
        (tmp_path / run / "trainer_state.json").write_text(json.dumps(state))
        source = {"path": "fit.json", **({"balance_answers": True} if balanced else {})}
        (tmp_path / run / "run.json").write_text(json.dumps({"recipe": {"dataset_mixture": {"sources": [source]}}}))
    found = ablation_arms.ablation(tmp_path, [1], "long-balance")
    assert [arm["1"]["validation"] for arm in found.values()] == [0.52, 0.6]  # the recipe's setting first
    assert "long-answer SFT" in ablation_arms.WHAT[ablation_arms.ABLATIONS["long-balance"].stage]


def test_a_done_training_stage_is_passed_only_if_its_run_is_what_the_recipe_gives_now(tmp_path, capsys):
    """The check skips a stage whose result is there; for a training stage only where the run there
    trained with what its recipe gives now, else it stops in one line naming the difference (a
    recipe that changed since is not passed over). Where it logs or saves, or a folder moved, is
    the same run."""
    from checks.stages import stage_runner

    from medrecipes.config import parse_recipe
    from medrecipes.training.run_folder import claim_run_folder

    sft, run = "recipes/tiny_sft.yaml", tmp_path / "sft-s1"
    assert not claim_run_folder("sft", *parse_recipe("sft", [sft, "--output_dir", str(run)]))  # its record
    (run / "final").mkdir()
    moved = tmp_path / "moved"
    moved.mkdir()
    for name in ("run.json", "final"):
        (run / name).rename(moved / name)
    stage, seconds = stage_runner(tmp_path)
    same = [("--output_dir", str(moved)), ("--output_dir", str(moved), "--logging_steps", "7", "--report_to", "none")]
    for overrides in same:
        stage("sft-s1", moved / "final", lambda: pytest.fail("a done stage ran"), ("sft", sft, *overrides))
        assert "sft-s1 done" in capsys.readouterr().out
    other = tmp_path / "another-model"  # a folder beside the run's, not one the run lies inside
    other.mkdir()
    changed = {
        ("--learning_rate", "0.5"): "learning_rate 0.003 there, 0.5 here",
        ("--seed", "3"): "seed 42 there, 3 here",
        (
            "--dataset_mixture",
            '{"sources": [{"path": "data/usmle_sample/train.jsonl", "format": "usmle", "balance_answers": true}]}',
        ): "dataset_mixture ",  # fmt: skip
        ("--model_name_or_path", str(other)): f"model outputs/demo/cpt/final, here {other}",
    }
    for overrides, difference in changed.items():
        with pytest.raises(SystemExit) as stopped:
            stage(
                "sft-s1",
                moved / "final",
                lambda: pytest.fail("ran"),
                ("sft", sft, "--output_dir", str(moved), *overrides),
            )
        line = str(stopped.value.code)
        assert line.startswith(f"real check: sft-s1 ({moved / 'final'}) was trained with other settings than {sft}")
        assert difference in line and "\n" not in line and "move its run folder aside" in line
    assert seconds == {}  # nothing ran


def test_the_report_shows_the_sft_and_grpo_runs_trained_on_disjoint_questions(out):
    """Each seed's SFT and GRPO runs, read from the recipes their records keep: the questions each
    trained on (GRPO's before its pass-rate filter) and how many both did."""
    source = {"path": str(ROOT / "data" / "usmle_sample" / "train.jsonl"), "format": "usmle"}
    for stage, take in (("sft-free", "first"), ("grpo-free", "rest")):
        (out / f"{stage}-s1").mkdir()
        part = {"share": 0.6, "take": take, "seed": 42}
        recipe = {"dataset_mixture": {"sources": [{**source, "part": part, "pass_rate": {"file": "x.jsonl"}}]}}
        (out / f"{stage}-s1" / "run.json").write_text(json.dumps({"recipe": recipe}))
    report = learning_report.summarise(out, {}, [1, 2], "cpu")
    assert report["questions_per_stage"] == {"1": {"sft": 36, "grpo": 24, "shared": 0}}  # seed 2 has no runs
    assert "| 1 | 36 | 24 | 0 |" in learning_markdown.markdown(report)
