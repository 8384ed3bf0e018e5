"""run.json: what a run records about itself in its output_dir. At its start: the recipe script,
the model it starts from and a fingerprint of its training data (which tell runs apart,
`IDENTITY`), how it was started and the resolved recipe; once settled, the settled run
(`SettledRun`, whole, as `runs.settle.settle_run` decided it); at its end, that it finished and on what hardware. Written
atomically (`outputs.writes.staged`); read by the run folder's claim, the resume point,
`medrecipes report`, `medrecipes card` and the push."""

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from medrecipes.config.methods import method_named
from medrecipes.config.schema import world_size
from medrecipes.data.rows import local_files
from medrecipes.errors import UserError
from medrecipes.locations import (
    RUN_RECORD,
    SAMPLED,
    START_WEIGHTS,
    files_fingerprint,
    run_record,
    weights_fingerprint,
)
from medrecipes.outputs.checkpoints import FINAL
from medrecipes.outputs.writes import staged

RECORD = RUN_RECORD
# What else a run writes into its output_dir beside its checkpoints and final/: the benchmark
# reports of its evaluations during training, and the model card its push writes.
EVAL_TASKS = "eval_tasks"
CARD = "card"
IDENTITY = ("script", "model", "data")
# The words a difference in each is told by, and the fingerprint of a local starting model's weights,
# compared where both records have it (a run recorded before it was kept has none).
IDENTITY_WORDS = {"script": "script", "model": "model", "data": "dataset_mixture"}
WEIGHTS = START_WEIGHTS
DATA_FILES = "data_files"  # a fingerprint of the training data files' contents (their sizes and ends)
PROCESSES = "processes"  # in a checkpoint's stamp: how many processes trained to it


def run_identity(method: str, recipe, model_args) -> dict:
    """The script, the starting model and a fingerprint of the data settings of a run, and where the
    model is a local folder, a fingerprint of its weights (their ends: `locations.weights_fingerprint`)."""
    model = model_args.model_name_or_path
    if recipe.init_from_scratch:
        model = f"random weights ({recipe.architecture})"
    data = json.dumps(recipe.dataset_mixture, sort_keys=True, default=str)
    identity = {
        "script": method_named(method).script,
        "model": model,
        "data": hashlib.sha256(data.encode()).hexdigest()[:16],
    }
    weights = None if recipe.init_from_scratch else weights_fingerprint(model, ends=SAMPLED)
    if weights is not None:
        identity[WEIGHTS] = weights
    if files := data_files(recipe):
        identity[DATA_FILES] = files_fingerprint(files, ends=SAMPLED)
    return identity


def data_files(recipe) -> list[str]:
    """The local files a run's training data is read from, source by source: its sources' files and
    the pass-rate files that filter them (a file replaced between a kill and the rerun is other data)."""
    sources = recipe.mixture.sources if recipe.mixture else []
    found = [f for source in sources for f in sorted(local_files(source)) if os.path.isfile(f)]
    return found + [s.pass_rate.file for s in sources if s.pass_rate and os.path.isfile(s.pass_rate.file)]


def identity_differences(saved: dict, ours: dict, mixture: dict | None = None) -> list[str]:
    """How run record `saved` is another run than `ours`: "model a, here b" for each of script,
    model and data that differ (a model path written otherwise whose weights both keep, the same, is
    the same model; data named by the first setting of the recipe's `mixture` that differs from the
    record's, where both are known, else by fingerprints), and the starting model's weights and the
    data files' contents where both keep theirs (a record written before they were kept has neither)."""
    # The same starting weights however the path to them is written (a link, ../x, x/, a copy): one model.
    same_weights = bool(saved.get(WEIGHTS)) and saved.get(WEIGHTS) == ours.get(WEIGHTS)
    then = (saved.get("recipe") or {}).get("dataset_mixture") if isinstance(saved.get("recipe"), dict) else None
    found = [
        (
            key == "data"
            and mixture is not None
            and then is not None
            and first_difference(then, mixture, "dataset_mixture")
        )
        or f"{IDENTITY_WORDS[key]} {saved.get(key)}, here {ours.get(key)}"
        for key in IDENTITY
        if saved.get(key) != ours.get(key) and not (key == "model" and same_weights)
    ]
    if not found and saved.get(WEIGHTS) and ours.get(WEIGHTS) and saved[WEIGHTS] != ours[WEIGHTS]:
        found.append(f"the weights of model {ours.get('model')} changed since that run started from them")
    if not found and saved.get(DATA_FILES) and ours.get(DATA_FILES) and saved[DATA_FILES] != ours[DATA_FILES]:
        found.append("the data files changed since that run read them")
    return found


def first_difference(then, now, where: str) -> str | None:
    """The first setting, by its dotted path, where `now` differs from `then`: "where.seed 7, here 42"."""
    if isinstance(then, dict) and isinstance(now, dict):
        for key in [*then, *(k for k in now if k not in then)]:
            if then.get(key) != now.get(key):
                return first_difference(then.get(key), now.get(key), f"{where}.{key}")
        return None
    if isinstance(then, list) and isinstance(now, list) and len(then) == len(now):
        return next(
            (
                first_difference(a, b, f"{where}[{i}]")
                for i, (a, b) in enumerate(zip(then, now, strict=True))
                if a != b
            ),
            None,
        )
    return None if then == now else f"{where} {json.dumps(then, default=str)}, here {json.dumps(now, default=str)}"


def read_record(output_dir: str) -> dict | None:
    record = run_record(output_dir)
    if isinstance(record, str):
        raise UserError(
            f"{os.path.join(output_dir, RECORD)}: not a run record ({record}); put back a copy the run wrote, or, to "
            "train in that folder anew, move it aside or set overwrite_output_dir: true"
        )
    return record


def stamp_checkpoint(checkpoint: str, output_dir: str) -> None:
    """Write the identity of the run in `output_dir` (its script, model, data and starting weights)
    into a checkpoint it saves, so that a checkpoint copied into another run's folder is known
    there for another run's (`runs.resume.last_checkpoint`)."""
    record = read_record(output_dir)
    if record:
        kept = {key: record[key] for key in (*IDENTITY, WEIGHTS, DATA_FILES) if key in record}
        write_record(checkpoint, {**kept, PROCESSES: world_size()})  # the processes its data position counts


def write_record(output_dir: str, record: dict) -> None:
    with staged(os.path.join(output_dir, RECORD), folder=False) as path, open(path, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)


@dataclass(frozen=True)
class SettledRun:
    """What a training run is, as `runs.settle.settle_run` decided it at the run's start; run.json
    keeps it whole (`record`), and the report, the card and the push read it from there."""

    method: str
    output_dir: str
    resume_from: str | None  # the checkpoint the run starts from, None for a new run
    activation_checkpointing: bool
    checkpointing_by: str  # "recipe", "plan" (the memory plan's choice) or "default" (on)
    chat_template: str | None  # the template's text, as the tokenizer applies it
    end_of_turn: str | None  # the token a turn of that template ends with
    prompt_room: int | None = None  # GRPO: tokens a prompt may take; None: no limit
    rewards: tuple[dict, ...] = ()  # GRPO: {name, weight, <settings>} as the functions were built
    # GRPO: the reward functions of `rewards`, in their order (not recorded: code, not data)
    reward_funcs: tuple[Callable, ...] = field(default=(), compare=False, repr=False)

    @property
    def script(self) -> str:
        return method_named(self.method).script

    def record(self) -> dict:
        """The run as run.json keeps it (plain JSON data)."""
        recorded = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "reward_funcs"}
        return {**recorded, "rewards": [dict(r) for r in self.rewards]}

    @classmethod
    def from_record(cls, record: dict) -> "SettledRun | None":
        """The settled run of a run.json record; None for a record written before runs were settled."""
        settled = record.get("settled")
        if not isinstance(settled, dict):
            return None
        names = {f.name for f in dataclasses.fields(cls)} - {"reward_funcs"}
        values = {key: value for key, value in settled.items() if key in names}
        return cls(**{**values, "rewards": tuple(values.get("rewards") or ())})


def update_record(training_args, **entries) -> None:
    """Add `entries` to the run's record, from the process that writes (a run's other processes
    write nothing)."""
    if not training_args.should_save:
        return
    record = read_record(training_args.output_dir) or {}
    write_record(training_args.output_dir, {**record, **entries})


def finished_entry(output_dir: str, record: dict) -> dict | None:
    """What the record says of the run's end (`record_finished`: its step, its target, the
    hardware) where the run finished: the record says so and final/ is there; else None."""
    done = record.get("finished")
    return done if done and os.path.isdir(os.path.join(output_dir, FINAL)) else None


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
