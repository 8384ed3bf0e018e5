"""What `medrecipes report` reads: a training run's folder (`Run`) and an `eval --output` file
(`Evaluation`), and the series the plots draw from them."""

import glob
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from medrecipes.errors import UserError, is_number, quoted
from medrecipes.locations import absent
from medrecipes.outputs.checkpoints import checkpoint_step
from medrecipes.runs.folder import RunFolder


@dataclass
class Run:
    """A training run's folder, read."""

    name: str
    path: str
    log_history: list[dict]
    best_step: int | None = None
    record: dict = field(default_factory=dict)
    reports: dict[int, dict[str, dict]] = field(default_factory=dict)  # step -> task -> report


@dataclass
class Evaluation:
    """One `medrecipes eval --output` file."""

    name: str
    path: str
    tasks: dict[str, dict]
    settings: dict = field(default_factory=dict)


STATE_FIX = "it was cut short or edited: put back the one in the run's newest checkpoint-N/, or pass another run"


def _read_json(path: str, what: str, fix: str = "pass a run folder or an eval --output file"):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"{path}: not a JSON {what} ({str(err).splitlines()[0]}); {fix}") from None


def is_run(folder: str) -> bool:
    """A run's output_dir: it has logged or saved (trainer_state.json), or it has started (run.json,
    written before the first step)."""
    run = RunFolder(folder)
    return run.trainer_state() is not None or os.path.isfile(run.record_file)


def read_run(folder: str, name: str) -> Run:
    """A run's folder; one that has started but not yet saved has its record and no steps."""
    run = RunFolder(folder)
    state_path = run.trainer_state()
    if state_path is None and not os.path.isfile(run.record_file):
        raise UserError(
            f"{folder}: no trainer_state.json in it or in a checkpoint; pass the output_dir of a run that has "
            "logged or saved, or an eval --output file"
        )
    state = _read_json(state_path, "trainer state", STATE_FIX) if state_path else {"log_history": []}
    if problem := state_problem(state):
        raise UserError(
            f"{state_path}: not a trainer state as the trainer writes it ({problem}); pass a run's output_dir, "
            "or put back the file from the run's newest checkpoint"
        )
    best = state.get("best_model_checkpoint")
    best_step = checkpoint_step(best) if best else None
    record = run.record() or {}  # a damaged run.json is one line (runs.record.read_record)
    reports = {
        step: _tasks(_read_json(path, "evaluation report", STEP_REPORT_FIX), path, STEP_REPORT_FIX)
        for step, path in run.eval_reports().items()
    }
    return Run(name, folder, state.get("log_history", []), best_step, record, reports)


def state_problem(state) -> str | None:
    """What in a trainer_state.json the report and the card cannot read (a file edited or cut by
    hand): the fields they read, of the kinds the trainer writes; None where it is whole."""
    if not isinstance(state, dict) or not isinstance(state.get("log_history"), list):
        return "no log_history list"
    for key in ("global_step", "num_input_tokens_seen"):
        if key in state and not isinstance(state[key], int):
            return f"{key} {state[key]!r} is not a whole number"
    if not isinstance(state.get("best_model_checkpoint"), str | type(None)):
        return "best_model_checkpoint is not a path"
    last = 0
    for number, entry in enumerate(state.get("log_history", []), 1):
        if not isinstance(entry, dict) or not isinstance(entry.get("step"), int):
            return f"log_history entry {number} is not a logged step with its step number"
        if entry["step"] < last:  # a run logs forwards, a resumed one from its checkpoint's state
            return f"log_history entry {number} goes back from step {last} to {entry['step']}"
        last = entry["step"]
        if bad := next((k for k, v in entry.items() if not (is_number(v) or v is None)), None):
            return f"log_history entry {number}: {bad} {entry[bad]!r} is not a number"
    return None


def task_problem(report) -> str | None:
    """What in one task's report (`medrecipes eval`'s, or an evaluation's during training) the report
    and the card cannot read; None where it is whole."""
    if not isinstance(report, dict):
        return "its report is not a mapping"
    if "accuracy" not in report:  # eval writes it for every task, null where no question was scored
        return "its report has no accuracy"
    accuracy, ci, n = report.get("accuracy"), report.get("ci95"), report.get("n")
    if accuracy is not None and not (is_number(accuracy) and 0 <= accuracy <= 1):
        return f"accuracy {accuracy!r} is not a number from 0 to 1"
    if ci is not None and not (isinstance(ci, list) and len(ci) == 2 and all(map(is_number, ci))):
        return f"ci95 {ci!r} is not two numbers"
    if ci is not None and ci[0] > ci[1]:
        return f"ci95 {ci!r} runs from high to low"
    if n is not None and not (isinstance(n, int) and not isinstance(n, bool) and n >= 0):
        return f"n {n!r} is not a count"
    if n == 0 and accuracy is not None:
        return f"accuracy {accuracy!r} of n 0 questions: no question was scored"
    return None


def _tasks(data, path: str, fix: str = "pass a file written by medrecipes eval --output") -> dict:
    """The tasks of an evaluation file, each report checked (`task_problem`); `fix`: what to do."""
    if not isinstance(data, dict) or "tasks" not in data:
        raise UserError(f"{path}: no 'tasks' in it (a mapping of task to report); {fix}")
    if not isinstance(data["tasks"], dict):
        raise UserError(f"{path}: its 'tasks' is {quoted(data['tasks'])}, not a mapping of task to report; {fix}")
    if not data["tasks"]:  # eval writes one report a task it scored, and it scores at least one
        raise UserError(f"{path}: its 'tasks' is empty, so it holds no result to report; {fix}")
    for task, report in data["tasks"].items():
        if problem := task_problem(report):
            raise UserError(f"{path}: task {task}: {problem}; {fix}")
    return data["tasks"]


# What to do with a damaged report of an evaluation during training: the run wrote it.
STEP_REPORT_FIX = (
    "move it out of the run folder (the run wrote it at that evaluation; the rest of the run reads without it)"
)


def run_state(run: Run) -> str:
    """How the run ended, from its record and folder: finished (its final model written), or
    stopped before that (killed, preempted, failed) with the checkpoint the same command resumes
    from; a run still training reads as stopped at its newest checkpoint too."""
    folder = RunFolder(run.path)
    done = folder.finished(run.record)
    if done is not None:
        return f"finished at step {done.get('global_step', '?')}"
    checkpoint, _ = folder.resume_point()
    if checkpoint is None:
        return "stopped before a checkpoint it can resume from (or still training)"
    return f"stopped (or still training): the same command resumes from {os.path.basename(checkpoint)}"


def read_evaluation(path: str, name: str) -> Evaluation:
    data = _read_json(path, "evaluation")
    tasks = _tasks(data, path)
    settings = data.get("settings", {})
    return Evaluation(name, path, tasks, settings if isinstance(settings, dict) else {})


def _names(paths: list[str]) -> list[str]:
    """A short label per path: its last part, or more of it where two would be the same."""
    parts = [Path(os.path.abspath(p)).parts for p in paths]
    depth = 1
    while depth < max(len(p) for p in parts):
        names = ["/".join(p[-depth:]) for p in parts]
        if len(set(names)) == len(names):
            return names
        depth += 1
    return ["/".join(p[-depth:]) for p in parts]


def read_inputs(paths: list[str]) -> tuple[list[Run], list[Evaluation]]:
    """Runs and evaluations from the paths given: run folders, eval --output files, or folders
    holding run folders and eval --output files (each a run or an evaluation, named by it)."""
    runs, evaluations = [], []
    for path, name in zip(paths, _names(paths), strict=True):
        if os.path.isfile(path):
            evaluations.append(read_evaluation(path, name.removesuffix(".json")))
        elif os.path.isdir(path) and is_run(path):
            runs.append(read_run(path, name))
        elif os.path.isfile(os.path.join(path, "config.json")):
            parent = os.path.dirname(os.path.abspath(path))
            run = f"the run it came from ({parent})" if is_run(parent) else "the output_dir of the run it came from"
            raise UserError(
                f"{path}: a model folder (config.json), which holds no run's logs and no evaluation; pass {run} "
                "or the file that `medrecipes eval --output` wrote of it"
            )
        elif os.path.isdir(path):  # a folder of runs and evaluations (outputs/demo): each one in it
            inner = sorted(entry.path for entry in os.scandir(path) if entry.is_dir() and is_run(entry.path))
            files = sorted(glob.glob(os.path.join(path, "*.json")))
            if not inner and not files:
                raise UserError(
                    f"{path}: holds no run (trainer_state.json or run.json), no run folders and no eval --output "
                    "files; pass a run's output_dir"
                )
            runs += [read_run(folder, f"{name}/{Path(folder).name}") for folder in inner]
            evaluations += [read_evaluation(f, f"{name}/{Path(f).stem}") for f in files]
        else:
            raise UserError(f"{path}: {absent(path)}; pass a run's output_dir or an eval --output file")
    return runs, evaluations


def training_logs(run: Run) -> list[dict]:
    """The trainer's logs of training steps (not evaluations or the closing summary)."""
    return [e for e in run.log_history if "loss" in e and "learning_rate" in e]


def tokens_at(run: Run):
    """Tokens seen at a step, interpolated between the training logs that record them (None
    where no log does)."""
    import numpy as np

    points = sorted(
        {(e["step"], e["num_input_tokens_seen"]) for e in training_logs(run) if "num_input_tokens_seen" in e}
    )
    if not points:
        return None
    steps, tokens = [0, *(s for s, _ in points)], [0, *(t for _, t in points)]
    return lambda step: float(np.interp(step, steps, tokens))


def eval_loss_series(run: Run) -> dict[str, list[tuple[int, float]]]:
    series: dict[str, list[tuple[int, float]]] = {}
    for entry in run.log_history:
        for key, value in entry.items():
            if key.startswith("eval_") and key.endswith("_loss"):
                name = key.removeprefix("eval_").removesuffix("_loss") or "eval"
                series.setdefault(name, []).append((entry["step"], value))
    return series


def accuracy_series(run: Run) -> dict[str, list[tuple[int, float, tuple[float, float] | None]]]:
    """Accuracy per task or eval set against steps: from the reports (with their intervals),
    and from the logs where no report was written (eval_<name>_acc, no interval)."""
    series: dict[str, dict[int, tuple[float, tuple[float, float] | None]]] = {}
    for step, tasks in run.reports.items():
        for name, report in tasks.items():
            series.setdefault(name, {})[step] = (report["accuracy"], tuple(report["ci95"]))
    for entry in run.log_history:
        for key, value in entry.items():
            if key.startswith("eval_") and key.endswith("_acc"):
                name = key.removeprefix("eval_").removesuffix("_acc")
                series.setdefault(name, {}).setdefault(entry["step"], (value, None))
    return {name: [(s, *points[s]) for s in sorted(points)] for name, points in series.items()}


def step_series(run: Run, key: str) -> list[tuple[int, float]]:
    return [(e["step"], e[key]) for e in training_logs(run) if key in e]


def reward_names(run: Run) -> list[str]:
    names = {
        k.split("/")[1] for e in training_logs(run) for k in e if k.startswith("rewards/") and k.endswith("/mean")
    }
    return sorted(names)
