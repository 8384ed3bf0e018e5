"""run.json: what a run records about itself in its output_dir. At its start: the recipe script,
the model it starts from and a fingerprint of its training data (which tell runs apart,
`IDENTITY`), how it was started and the resolved recipe; once settled, the settled run
(`runs.settle.SettledRun`, whole); at its end, that it finished and on what hardware. Written
atomically (`outputs.writes.staged`); read by the run folder's claim, the resume point,
`medrecipes report`, `medrecipes card` and the push."""

import hashlib
import json
import os

from medrecipes.outputs.writes import staged

RECORD = "run.json"
IDENTITY = ("script", "model", "data")


def run_identity(method: str, recipe, model_args) -> dict:
    """The script, the starting model and a fingerprint of the data settings of a run."""
    model = model_args.model_name_or_path
    if recipe.init_from_scratch:
        model = f"random weights ({recipe.architecture})"
    data = json.dumps(recipe.dataset_mixture, sort_keys=True, default=str)
    return {
        "script": f"recipes/{method}.py",
        "model": model,
        "data": hashlib.sha256(data.encode()).hexdigest()[:16],
    }


def read_record(output_dir: str) -> dict | None:
    path = os.path.join(output_dir, RECORD)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_record(output_dir: str, record: dict) -> None:
    with staged(os.path.join(output_dir, RECORD), folder=False) as path, open(path, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)


def update_record(training_args, **entries) -> None:
    """Add `entries` to the run's record, from the process that writes (a run's other processes
    write nothing)."""
    if not training_args.should_save:
        return
    record = read_record(training_args.output_dir) or {}
    write_record(training_args.output_dir, {**record, **entries})


def record_finished(training_args, state, hardware: str) -> None:
    """Note in the record that the run finished (after final/ is in place), and on what
    (`plan.hardware.hardware`: the card's line)."""
    finished = {
        "global_step": state.global_step,
        "max_steps": training_args.max_steps,
        "num_train_epochs": training_args.num_train_epochs,
        "hardware": hardware,
    }
    update_record(training_args, finished=finished)
