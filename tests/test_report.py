"""`medrecipes report`: the page and plots of runs and evaluations, read from what they wrote.

The runs here are folders laid out as the recipes leave them (trainer_state.json with the
trainer's log history, eval_tasks/step-<N>.json reports, run.json), with the keys the recipes
log; tests/test_cpt_recipe.py reports on a real run, and `make demo` on all three recipes.
"""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import PYTHON, ROOT

from medrecipes.errors import UserError
from medrecipes.report import read_inputs, subject_points, write_report

SUBJECTS = ("cardiology", "nephrology", "neurology")


def mcq_report(accuracy: float, n: int = 30) -> dict:
    half = 0.15
    subjects = {
        s: {
            "accuracy": min(1.0, accuracy + d),
            "n": n // 3,
            "ci95": [max(0, accuracy + d - 0.3), min(1, accuracy + d + 0.3)],
        }
        for s, d in zip(SUBJECTS, (-0.1, 0.0, 0.1), strict=True)
    }
    # A subject answered in full: its Wilson interval's upper bound is 1 up to rounding (0.9999999...).
    subjects["pharmacology"] = {"accuracy": 1.0, "n": 6, "ci95": [0.6096569663469354, 0.9999999999999999]}
    return {"accuracy": accuracy, "n": n, "ci95": [accuracy - half, accuracy + half], "subjects": subjects}


def write_run(folder: Path, grpo: bool = False, shift: float = 0.0, best: int = 20) -> Path:
    logs = []
    for step in range(10, 41, 10):
        entry = {
            "step": step,
            "loss": 3.0 - step / 20 - shift,
            "learning_rate": 1e-4,
            "num_input_tokens_seen": step * 1000,
        }
        entry |= {"tokens_per_second": 900.0 + step, "eta_hours": 0.1}
        if grpo:
            entry |= {"kl": step / 1000, "completions/mean_length": 40.0 + step, "reward": 0.5}
            entry |= {"frac_reward_zero_std": 0.75 - step / 100}
            entry |= {"rewards/usmle_accuracy/mean": 0.3 + step / 100, "rewards/answer_format/mean": 0.9}
        logs.append(entry)
        if step % 20 == 0:
            logs.append({"step": step, "eval_usmle_loss": 3.1 - step / 25 - shift, "eval_usmle_acc": 0.3 + step / 100})
    logs.append({"step": 40, "train_loss": 2.0, "train_runtime": 10.0})
    folder.mkdir(parents=True)
    state = {"log_history": logs, "best_model_checkpoint": str(folder / f"checkpoint-{best}"), "global_step": 40}
    (folder / "trainer_state.json").write_text(json.dumps(state))
    (folder / "eval_tasks").mkdir()
    for step in (20, 40):
        report = {"step": step, "tasks": {"usmle": mcq_report(0.3 + step / 100 + shift)}}
        (folder / "eval_tasks" / f"step-{step}.json").write_text(json.dumps(report))
    recipe = {
        "learning_rate": 1e-4 * (1 + shift),
        "max_steps": 40,
        "dataset_mixture": {"sources": [{"path": "json", "data_files": "train.jsonl", "weight": 1.0}]},
    }
    (folder / "run.json").write_text(
        json.dumps(
            {"script": "recipes/grpo.py" if grpo else "recipes/cpt.py", "model": "tiny", "data": "0", "recipe": recipe}
        )
    )
    return folder


def write_evaluation(path: Path, accuracy: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tasks = {
        "medqa_4opt": {**mcq_report(accuracy), "mode": "loglik"},
        "mmlu_medical": {**mcq_report(accuracy / 2), "mode": "loglik"},
    }
    path.write_text(json.dumps({"tasks": tasks, "settings": {"mode": "loglik"}}))
    return path


def pngs(folder: Path) -> dict[str, bytes]:
    return {p.stem: p.read_bytes() for p in folder.glob("*.png")}


def test_two_runs_and_evaluations_in_one_page(tmp_path):
    baseline = write_run(tmp_path / "baseline")
    candidate = write_run(tmp_path / "candidate", grpo=True, shift=0.1, best=40)
    evals = tmp_path / "eval"
    write_evaluation(evals / "base-loglik.json", 0.3)
    write_evaluation(evals / "sft-loglik.json", 0.4)
    output = tmp_path / "out" / "report.html"
    images = write_report([str(baseline), str(candidate), str(evals)], str(output))
    assert sorted(images) == ["accuracy", "comparison", "grpo", "loss", "subjects", "throughput"]
    assert list(images)[0] == "comparison"  # what a reader came for, first
    files = pngs(tmp_path / "out" / "report_files")
    assert sorted(files) == sorted(images) and all(
        png.startswith(b"\x89PNG") and len(png) > 5000 for png in files.values()
    )
    page = output.read_text()
    # Self-contained: every image inline, nothing fetched from elsewhere.
    assert page.count('src="data:image/png;base64,') == 6 and not re.search(r"(src|href)=\"(https?:)?//", page)
    for name in ("baseline", "candidate", "eval/base-loglik", "eval/sft-loglik", "recipes/grpo.py", "train.jsonl"):
        assert name in page, name
    assert "learning_rate" in page and "step 40" in page  # settings that differ; the candidate's best checkpoint


def test_best_and_last_evaluation_by_subject(tmp_path):
    (run,), _ = read_inputs([str(write_run(tmp_path / "run", best=20))])
    points = subject_points(run)["usmle"]
    assert list(points) == ["best (step 20)", "last (step 40)"]
    assert points["best (step 20)"]["accuracy"] == pytest.approx(0.5)
    # Without a best checkpoint with a report, the evaluation of the highest accuracy, named so:
    # "best" is the trainer's decision alone.
    run.best_step = None
    assert list(subject_points(run)["usmle"]) == ["highest accuracy and last (step 40)"]


def test_a_run_still_training_is_read_from_its_newest_checkpoint(tmp_path):
    run = write_run(tmp_path / "run")
    checkpoint = run / "checkpoint-40"
    checkpoint.mkdir()
    (run / "trainer_state.json").rename(checkpoint / "trainer_state.json")
    (runs, _) = read_inputs([str(run)])
    assert runs[0].log_history and max(e["step"] for e in runs[0].log_history) == 40


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p / "absent", "no such file or folder"),
        (
            lambda p: (p / "empty").mkdir() or p / "empty",
            "holds no run (trainer_state.json or run.json), no run folders and no eval --output files",
        ),
        (lambda p: (p / "x.json").write_text("{not json") and p / "x.json", "not a JSON evaluation"),
        (lambda p: (p / "y.json").write_text('{"a": 1}') and p / "y.json", "no 'tasks' in it"),
        (
            lambda p: (p / "t.json").write_text('{"tasks": "medqa"}') and p / "t.json",
            "its 'tasks' is \"medqa\", not a",
        ),
        (lambda p: (p / "u.json").write_text('{"tasks": [1]}') and p / "u.json", "its 'tasks' is [1], not a mapping"),
        (lambda p: (p / "z.json").write_bytes(b"\xff\xfe\x00") and p / "z.json", "not a JSON evaluation"),
    ],
)
def test_bad_inputs_are_one_line(tmp_path, make, message):
    with pytest.raises(UserError, match=re.escape(message)) as info:
        write_report([str(make(tmp_path))], str(tmp_path / "report.html"))
    assert "\n" not in str(info.value)
    assert not (tmp_path / "report.html").exists()


def test_never_over_an_input_or_an_earlier_report(tmp_path):
    run = write_run(tmp_path / "run")
    evaluation = write_evaluation(tmp_path / "e.json", 0.5)
    with pytest.raises(UserError, match="is also what this command reads"):
        write_report([str(run), str(evaluation)], str(evaluation))
    write_report([str(run)], str(tmp_path / "r.html"))
    with pytest.raises(UserError, match="already exists; name a new path, or pass --overwrite"):
        write_report([str(run)], str(tmp_path / "r.html"))
    write_report([str(run)], str(tmp_path / "r.html"), overwrite=True)


def test_the_command(tmp_path):
    run = write_run(tmp_path / "run")
    out = tmp_path / "r.html"
    result = subprocess.run(
        [PYTHON, "-m", "medrecipes.cli", "report", str(run), "--output", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert f"report written to {out}: 5 plots" in result.stdout and out.is_file()
    bad = subprocess.run(
        [PYTHON, "-m", "medrecipes.cli", "report", str(tmp_path / "nope")], capture_output=True, text=True, cwd=ROOT
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def render(page: Path, tmp_path: Path) -> str:
    """The page's DOM after it has loaded in headless Chromium (its scripts run)."""
    result = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=5000",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (make browser installs it)")
def test_every_figure_loads_in_a_browser(tmp_path):
    output = tmp_path / "report.html"
    images = write_report([str(write_run(tmp_path / "a")), str(write_run(tmp_path / "b", grpo=True))], str(output))
    dom = render(output, tmp_path)
    figures = re.findall(r'<figure id="([a-z]+)"[^>]*data-loaded="(\w+)"', dom)
    assert sorted(figures) == sorted((name, "yes") for name in images), figures
    assert f'data-figures="{len(images)}"' in dom
    # The check itself sees a broken image.
    broken = tmp_path / "broken.html"
    broken.write_text(output.read_text().replace("base64,", "base64,AAAA", 1))
    assert 'data-loaded="no"' in render(broken, tmp_path)
    assert os.path.getsize(output) > 10_000


def test_a_dpo_run_gets_its_rewards_margins_and_reward_accuracy_plotted(tmp_path):
    from medrecipes.report.figures import preference_figure

    run = write_run(tmp_path / "dpo")
    state = json.loads((run / "trainer_state.json").read_text())
    for entry in state["log_history"]:
        if "loss" in entry and "learning_rate" in entry:
            entry |= {
                "rewards/chosen": -0.1,
                "rewards/rejected": -0.5,
                "rewards/margins": 0.4,
                "rewards/accuracies": 0.8,
            }
        elif "eval_usmle_loss" in entry:
            entry |= {"eval_rewards/chosen": -0.2, "eval_rewards/rejected": -0.3, "eval_rewards/margins": 0.1,
                      "eval_rewards/accuracies": 0.6}  # fmt: skip
    (run / "trainer_state.json").write_text(json.dumps(state))
    images = write_report([str(run)], str(tmp_path / "report.html"))
    assert "preference" in images and "grpo" not in images
    runs, _ = read_inputs([str(run)])
    lines = {line.get_label(): line.get_ydata().tolist() for ax in preference_figure(runs).axes for line in ax.lines}
    assert lines["dpo: accuracy, train"] == [0.8] * 4 and lines["dpo: accuracy, held-out"] == [0.6] * 2
    assert lines["dpo: margin, held-out"] == [0.1] * 2 and lines["dpo: rejected, train"] == [-0.5] * 4
    assert preference_figure(read_inputs([str(write_run(tmp_path / "sft"))])[0]) is None


def test_a_grpo_run_draws_the_panels_it_logged_and_no_empty_one(tmp_path):
    from medrecipes.report.figures import grpo_figure

    whole, bare = write_run(tmp_path / "grpo", grpo=True), write_run(tmp_path / "bare", grpo=True)
    state = json.loads((bare / "trainer_state.json").read_text())
    for entry in state["log_history"]:  # a run whose rewards were never logged
        for key in [k for k in entry if k.startswith("rewards/")]:
            del entry[key]
    (bare / "trainer_state.json").write_text(json.dumps(state))
    titles = [ax.get_title() for ax in grpo_figure(read_inputs([str(bare)])[0]).axes if ax.get_title()]
    assert "mean reward per function" not in titles and "KL to the reference" in titles and len(titles) == 3
    both = grpo_figure(read_inputs([str(whole), str(bare)])[0])
    rewards = next(ax for ax in both.axes if ax.get_title() == "mean reward per function")
    assert sorted(line.get_label() for line in rewards.lines) == ["grpo: answer_format", "grpo: usmle_accuracy"]


def test_the_runs_table_says_whether_each_run_finished_or_stopped(tmp_path):
    """A run whose record says it finished and whose final/ is there, and one killed after its
    third step's checkpoint: the report tells them apart, and names the checkpoint a rerun resumes."""
    import torch
    from safetensors.torch import save_file

    from medrecipes.report.page import RUN_COLUMNS, run_rows
    from medrecipes.report.runs import Run

    finished, stopped = tmp_path / "finished", tmp_path / "stopped"
    (finished / "final").mkdir(parents=True)
    for step in (3, 4):  # checkpoint-4's weights are cut: the rule that resumes sets it aside
        (stopped / f"checkpoint-{step}").mkdir(parents=True)
        (stopped / f"checkpoint-{step}" / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
        save_file({"w": torch.zeros(8)}, stopped / f"checkpoint-{step}" / "model.safetensors")
    weights = stopped / "checkpoint-4" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8])
    runs = [
        Run("finished", str(finished), [{"step": 8, "loss": 1.0}], record={"finished": {"global_step": 8}}),
        Run("stopped", str(stopped), [{"step": 3, "loss": 2.0}], record={}),
        Run("never saved", str(tmp_path), [{"step": 1, "loss": 3.0}], record={}),
    ]
    state = {row[0]: row[RUN_COLUMNS.index("state")] for row in run_rows(runs)}
    assert state["finished"] == "finished at step 8"
    assert state["stopped"] == "stopped (or still training): the same command resumes from checkpoint-3"
    assert state["never saved"].startswith("stopped before a checkpoint it can resume from")


def test_a_run_that_has_started_but_not_logged_is_a_run_not_a_folder_of_evaluations(tmp_path):
    """run.json is written before the first step: a report of the run's folder then (a user checking
    on it, a check reporting as it goes) shows the run as started, beside the runs that have logged,
    and takes its record for no evaluation file."""
    from medrecipes.report.page import RUN_COLUMNS, run_rows

    started = tmp_path / "started"
    started.mkdir()
    (started / "run.json").write_text(json.dumps({"command": "recipes/grpo.py recipe.yaml"}))
    (started / "runs").mkdir()  # TensorBoard's folder, empty so far
    runs, evaluations = read_inputs([str(started), str(write_run(tmp_path / "logged"))])
    assert [run.name for run in runs] == ["started", "logged"] and evaluations == []
    assert runs[0].log_history == [] and runs[0].record["command"] == "recipes/grpo.py recipe.yaml"
    state = {row[0]: row[RUN_COLUMNS.index("state")] for row in run_rows(runs)}
    assert state["started"] == "stopped before a checkpoint it can resume from (or still training)"
    write_report([str(started), str(tmp_path / "logged")], str(tmp_path / "report.html"))
    assert "started" in (tmp_path / "report.html").read_text(encoding="utf-8")
    with pytest.raises(UserError, match="holds no run"):
        read_inputs([str(started / "runs")])


def test_a_folder_of_runs_and_evaluations_is_each_of_them(tmp_path):
    """`report outputs/demo`: the run folders in it and its eval --output files, each named by it;
    a folder inside them that is neither is not read."""
    write_run(tmp_path / "all" / "cpt")
    write_run(tmp_path / "all" / "sft")
    write_evaluation(tmp_path / "all" / "eval.json", 0.5)
    (tmp_path / "all" / "tiny-model").mkdir()  # a model folder, no run
    runs, evaluations = read_inputs([str(tmp_path / "all")])
    assert [run.name for run in runs] == ["all/cpt", "all/sft"]
    assert [evaluation.name for evaluation in evaluations] == ["all/eval"]


def test_the_page_names_the_scored_weights_and_the_adapter_a_merge_came_from():
    from medrecipes.report.page import _scored_model

    assert _scored_model({"model": "m", "model_fingerprint": "sha256:a"}) == "m (sha256:a)"
    merged = {"model": "m", "model_fingerprint": "sha256:a", "merged_adapter_fingerprint": "sha256:b"}
    assert _scored_model(merged) == "m (sha256:a, merged from adapter sha256:b)"
    assert _scored_model({"model": "m"}) == "m"


def png_size(png: bytes) -> tuple[int, int]:
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


@pytest.mark.parametrize("count", [1, 5, 30])
def test_the_report_reads_the_same_at_one_five_and_thirty_runs(tmp_path, count):
    """Runs named by stage and seed (sft-s1, grpo-s2, ...) with evaluations of each and the base
    model's: the comparison has a row per stage whose points are its seeds, the base model as a
    line; every figure keeps a readable shape (no strip, however many runs); no legend lies on a
    plot; tables longer than a screen fold."""
    from medrecipes.report.comparison import comparison_figure

    stages = ["sft", "grpo", "dpo", "kto", "cpt", "sft-long"]
    names = [f"{stages[i % len(stages)]}-s{i // len(stages) + 1}" for i in range(count)]
    paths = [
        str(write_run(tmp_path / name, grpo=name.startswith("grpo"), shift=i / 100)) for i, name in enumerate(names)
    ]
    evals = tmp_path / "eval"
    for i, name in enumerate(names):
        write_evaluation(evals / f"{name}-loglik.json", 0.3 + i / 200)
    write_evaluation(evals / "base-loglik.json", 0.25)
    runs, evaluations = read_inputs([*paths, str(evals)])
    comparison = comparison_figure(runs, evaluations)
    medqa = next(ax for ax in comparison.axes if ax.get_title().startswith("medqa_4opt"))
    rows = [t.get_text() for t in medqa.get_yticklabels()]
    seeds = -(-count // len(stages))
    assert len(rows) == min(count, len(stages)), rows  # one row a stage, whatever its seeds
    assert (f"eval/sft-loglik ({seeds})" if seeds > 1 else "eval/sft-loglik") in rows
    assert "eval/base-loglik: 25.0%" in [line.get_label() for line in medqa.lines]
    comparison.canvas.draw()
    for ax in comparison.axes:
        legend = ax.get_legend()
        if legend is not None:
            assert not legend.get_window_extent().overlaps(ax.get_window_extent()), ax.get_title()
    output = tmp_path / "report.html"
    images = write_report([*paths, str(evals)], str(output))
    assert list(images)[0] == "comparison"
    for name, path in images.items():
        width, height = png_size(Path(path).read_bytes())
        assert height >= 250 and height >= 0.12 * width, (name, width, height)
    page = output.read_text()
    assert ("<details><summary>" in page.split("<h2>Runs</h2>")[1].split("<h2>")[0]) == (count > 12)


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (make browser installs it)")
def test_thirty_runs_load_in_a_browser_and_leave_a_screenshot(tmp_path):
    """The page of 30 runs in headless Chromium: every figure loads, and a screenshot of its top
    (the comparison) is kept beside it, to be looked at."""
    paths = [str(write_run(tmp_path / f"stage{i % 6}-s{i // 6 + 1}", shift=i / 100)) for i in range(30)]
    output = tmp_path / "report.html"
    images = write_report(paths, str(output))
    dom = render(output, tmp_path)
    assert sorted(re.findall(r'<figure id="([a-z]+)"[^>]*data-loaded="(\w+)"', dom)) == sorted(
        (name, "yes") for name in images
    )
    shot = tmp_path / "top.png"
    subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'shot'}",
         "--window-size=1280,1600", f"--screenshot={shot}", output.as_uri()],
        capture_output=True, timeout=120, check=True,
    )  # fmt: skip
    assert png_size(shot.read_bytes()) == (1280, 1600)


DAMAGES = {  # file, what is done to it: each field the report reads, missing, or of another kind
    "log history missing": ("trainer_state.json", lambda s: s.pop("log_history")),
    "log entry not a mapping": ("trainer_state.json", lambda s: s["log_history"].__setitem__(0, 3)),
    "log entry without its step": ("trainer_state.json", lambda s: s["log_history"][0].pop("step")),
    "log step as text": ("trainer_state.json", lambda s: s["log_history"][0].__setitem__("step", "one")),
    "logged loss as text": ("trainer_state.json", lambda s: s["log_history"][0].__setitem__("loss", "high")),
    "global_step as text": ("trainer_state.json", lambda s: s.__setitem__("global_step", "many")),
    "best checkpoint a number": ("trainer_state.json", lambda s: s.__setitem__("best_model_checkpoint", 4)),
    "tasks a list": ("eval_tasks/step-1.json", lambda r: r.__setitem__("tasks", [])),
    "tasks empty": ("eval_tasks/step-1.json", lambda r: r.__setitem__("tasks", {})),
    "report not a mapping": ("eval_tasks/step-1.json", lambda r: r["tasks"].__setitem__("usmle", 0.5)),
    "accuracy as text": ("eval_tasks/step-1.json", lambda r: r["tasks"]["usmle"].__setitem__("accuracy", "high")),
    "accuracy above 1": ("eval_tasks/step-1.json", lambda r: r["tasks"]["usmle"].__setitem__("accuracy", 1.5)),
    "accuracy NaN": ("eval_tasks/step-1.json", lambda r: r["tasks"]["usmle"].__setitem__("accuracy", float("nan"))),
    "interval of one bound": ("eval_tasks/step-1.json", lambda r: r["tasks"]["usmle"].__setitem__("ci95", [0.4])),
    "count negative": ("eval_tasks/step-1.json", lambda r: r["tasks"]["usmle"].__setitem__("n", -2)),
    "interval upside down": ("eval_tasks/step-1.json", lambda r: r["tasks"]["usmle"].__setitem__("ci95", [0.9, 0.2])),
    "steps that go back": ("trainer_state.json", lambda s: s["log_history"].append({"loss": 1.0, "step": 0})),
    "accuracy of no question": ("eval_tasks/step-1.json", lambda r: r["tasks"]["usmle"].__setitem__("n", 0)),
    "run record a list": ("run.json", lambda r: r.clear()),
}


@pytest.mark.parametrize("case", list(DAMAGES))
def test_a_run_folder_file_damaged_by_hand_is_one_line(tmp_path, case):
    """A run folder whose files parse but hold what the run never writes there (edited or mixed up
    by hand): the report names the file and what is wrong in one line and writes nothing."""
    from medrecipes.errors import UserError
    from medrecipes.report.page import write_report

    run = tmp_path / "run"
    (run / "eval_tasks").mkdir(parents=True)
    files = {
        "trainer_state.json": {"global_step": 1, "best_model_checkpoint": None,
                               "log_history": [{"loss": 2.0, "learning_rate": 1e-3, "step": 1}]},
        "eval_tasks/step-1.json": {"step": 1, "tasks": {"usmle": {"accuracy": 0.5, "n": 10, "ci95": [0.2, 0.8]}}},
        "run.json": {"script": "recipes/cpt.py"},
    }  # fmt: skip
    for name, content in files.items():
        (run / name).write_text(json.dumps(content))
    write_report([str(run)], str(tmp_path / "whole.html"))  # as the run left them: read
    name, damage = DAMAGES[case]
    content = files[name]
    damage(content)
    (run / name).write_text(json.dumps([] if case == "run record a list" else content))
    with pytest.raises(UserError) as err:
        write_report([str(run)], str(tmp_path / "report.html"))
    assert str(run / name) in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert not (tmp_path / "report.html").exists()
