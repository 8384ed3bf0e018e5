"""The model card of a run: a reproducible record.

The card records the resolved recipe (also pushed as `recipe.yaml`), the base model, every
data source with its weight and revision (a local file's revision is its content hash), the
decontamination result when the run was given one, the evaluation table, the hardware, the
tokens seen and the training time; and what a medical release needs besides: intended and
out-of-scope uses, the multiple-choice results with their 95% intervals (also as `model-index`
metadata, which the Hub shows as evaluation results), what those results do not say, the
limitations, and the run's plots (`medrecipes report`) as images in the repository.
Credentials never reach it: the recipe's token fields are left out, and the finished card is
checked for the token in use.

The Hub address comes from `HF_ENDPOINT`, as everywhere in huggingface_hub.
"""

import datetime
import filecmp
import json
import logging
import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import yaml
from huggingface_hub import EvalResult, ModelCard, ModelCardData, get_token

from medrecipes.errors import UserError
from medrecipes.evaluation.calibration import COVERAGES, headline, with_interval
from medrecipes.locations import absent, looks_local
from medrecipes.models.files import check_model_folder, missing_part
from medrecipes.names import TASK_NAMES
from medrecipes.report import figures, read_run, task_problem
from medrecipes.rewards import signal_share
from medrecipes.runs.described import facts_problem
from medrecipes.runs.folder import RunFolder

logger = logging.getLogger(__name__)

CARD_TEMPLATE = Path(__file__).parent.parent / "model_card.md"
FRAMEWORKS = ("medrecipes", "transformers", "trl", "torch", "accelerate", "datasets", "peft")


def _framework_versions() -> str:
    versions = []
    for name in FRAMEWORKS:
        try:
            versions.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            pass
    return ", ".join(versions)


def training_summary(state) -> dict:
    """Steps, tokens, time and loss from the trainer state (elapsed time carries over resumptions);
    for GRPO, the steps in which some group's answers were scored apart (`rewards.signal_share`)."""
    elapsed = [e["elapsed_hours"] for e in state.log_history if "elapsed_hours" in e]
    losses = [e["loss"] for e in state.log_history if "loss" in e]
    runtimes = [e["train_runtime"] for e in state.log_history if "train_runtime" in e]
    hours = elapsed[-1] if elapsed else (runtimes[-1] / 3600 if runtimes else None)
    return {
        "steps": state.global_step,
        "tokens_seen": state.num_input_tokens_seen,
        "training_time": str(datetime.timedelta(seconds=round(hours * 3600))) if hours is not None else None,
        "final_train_loss": losses[-1] if losses else None,
        "learning_signal": signal_share(state.log_history),
    }


def evaluation_rows(metrics: dict) -> list[tuple[str, str]]:
    skip = ("runtime", "per_second", "epoch")
    return [
        (key.removeprefix("eval_"), f"{value:.4g}" if isinstance(value, float) else str(value))
        for key, value in metrics.items()
        if key.startswith("eval_") and not key.endswith(skip)
    ]


def calibration_rows(reports: dict[str, dict]) -> list[dict]:
    """The card's calibration table, one row per task with a calibration report, and what its
    figures mean for use, in one sentence."""
    rows = []
    for name, report in reports.items():
        found = headline(report.get("calibration") or {})
        if not found.get("n"):
            continue
        kept = found.get("selective_accuracy@0.8")
        helps = kept is not None and kept > report["accuracy"]
        trust = "is close to" if found["ece"] < 0.05 else "is not"
        label = task_label(name, report)
        rows.append(
            {
                "task": label,
                "source": "agreement of sampled answers"
                if "votes" in report["calibration"]
                else "option probabilities",
                **{key: with_interval(found, key, ".3f") for key in ("ece", "brier", "nll", "auroc")},
                **{f"at{c:g}": with_interval(found, f"selective_accuracy@{c:g}", ".1%") for c in COVERAGES},
                "meaning": (
                    f"On {label} the model is right {report['accuracy']:.0%} of the time; its 80% most confident answers "
                    f"are right {kept:.0%} of the time, so sending its least confident 20% to a person "
                    f"{'raises' if helps else 'does not raise'} the accuracy of what it answers alone; its stated "
                    f"confidence {trust} how often it is right (ECE {found['ece']:.3f})."
                ),
            }
        )
    return rows


def _hub_source(name: str, report: dict) -> str | None:
    """The Hub id a report's questions came from, None for a local file."""
    source = str(report.get("source") or name)
    return source if "/" in source and not looks_local(source) and not os.path.exists(source) else None


def task_label(name: str, report: dict) -> str:
    """A task as the card names it: a benchmark's name (`TASK_NAMES`) with the file its questions
    came from where that is a local file (`--data mine.jsonl` is scored under the default task's
    name, medqa_4opt, and a reader of the card would take it for MedQA's questions)."""
    if name.split(" ")[0] not in TASK_NAMES or _hub_source(name, report) or not report.get("source"):
        return name
    return f"{name} ({os.path.basename(str(report['source']).rstrip('/'))})"


def training_files(facts: dict) -> list[str]:
    """The local files the run trained on, as its card facts name its sources."""
    named = [[f.strip() for f in row["files"].split(",") if f.strip()] or [row["path"]] for row in facts["sources"]]
    return [file for files in named for file in files if os.path.isfile(file)]


def scored_on_training_data(report: dict, trained: list[str]) -> bool:
    """Whether a report's questions are a file the run trained on (the same file, or the same bytes)."""
    source = str(report.get("source") or "")
    if not os.path.isfile(source):
        return False
    return any(os.path.samefile(source, file) or filecmp.cmp(source, file, shallow=False) for file in trained)


def mcq_results(reports: dict[str, dict]) -> list[EvalResult]:
    """The reports as the Hub's evaluation results (`model-index` in the card's metadata)."""
    results = []
    for name, report in reports.items():
        hub_id = _hub_source(name, report)
        results.append(
            EvalResult(
                task_type="multiple-choice",
                task_name="Multiple-choice question answering",
                dataset_type=hub_id or task_label(name, report),
                dataset_name=task_label(name, report),
                metric_type="accuracy",
                metric_name=f"accuracy ({report.get('mode', 'generate')}, n={report['n']})",
                metric_value=round(report["accuracy"], 4),
            )
        )
    return results


def model_card(
    repo_id: str,
    record: dict,
    summary: dict,
    eval_metrics: dict,
    mcq_reports: dict[str, dict] | None = None,
    images: dict[str, str] | None = None,
) -> ModelCard:
    """The model card of a run, from its run.json `record` (`runs.described.card_facts`, the resolved
    recipe, the settled run, what it finished on) and what it measured: `summary`
    (`training_summary`), `eval_metrics` (its last evaluation's scalars), `mcq_reports` (the
    multiple-choice reports of that evaluation and of `medrecipes eval` outputs) and `images`
    ({path in the repository: caption} of its plots)."""
    method, script, command, hardware = recorded_facts(record)
    facts = record["card"]
    mcq_reports = mcq_reports or {}
    # A score on the run's own training data says how well it learnt them, not how well it answers:
    # in the table as such, never among the Hub's evaluation results.
    trained = training_files(facts)
    seen = {name for name, report in mcq_reports.items() if scored_on_training_data(report, trained)}
    for name in seen:
        logger.warning(
            "card: %s scored %s, which the run trained on: its table says so, and the card's evaluation results "
            "(model-index) leave it out", name, mcq_reports[name]["source"],
        )  # fmt: skip
    card_data = ModelCardData(
        model_name=repo_id.split("/")[-1],
        base_model=facts["hub_base_model"],
        datasets=facts["hub_datasets"] or None,
        library_name="peft" if facts["adapters"] else "transformers",
        pipeline_tag="text-generation",
        tags=["medrecipes", method, "medical"],
        eval_results=mcq_results({n: r for n, r in mcq_reports.items() if n not in seen}) or None,
    )
    return ModelCard.from_template(
        card_data,
        template_path=str(CARD_TEMPLATE),
        model_name=repo_id.split("/")[-1],
        method=method,
        base_model=facts["base_model"],
        sources=facts["sources"],
        decontamination=facts["decontamination"],
        evaluation=evaluation_rows(eval_metrics),
        mcq=[
            (
                task_label(name, r) + (" (its training data: not held out)" if name in seen else ""),
                r.get("mode", ""),
                r["n"],
                f"{r['accuracy']:.1%}",
                f"{r['ci95'][0]:.1%}-{r['ci95'][1]:.1%}",
                with_interval(r, "macro_f1", ".3f") if r.get("macro_f1") is not None else "",
            )
            for name, r in mcq_reports.items()
        ],  # fmt: skip
        calibration=calibration_rows(mcq_reports),
        trained_splits=facts["trained_splits"],
        images=images or {},
        summary=summary,
        hardware=hardware,
        precision=facts["precision"],
        command=command,
        script=script,
        recipe_yaml=recipe_yaml(record).rstrip(),
        versions=_framework_versions(),
    )


def recipe_yaml(record: dict) -> str:
    """The run's resolved recipe as it recorded it (`config.resolved_yaml`'s text)."""
    return yaml.safe_dump(record["recipe"], sort_keys=False)


def described_run(run_folder: str, name: str):
    """The run in `run_folder` (`report.read_run`), whose run.json holds what its card needs; one
    line otherwise."""
    run = read_run(run_folder, name)
    if RunFolder(run_folder).finished(run.record) is None or not isinstance(run.record.get("recipe"), dict):
        raise UserError(
            f"{run_folder}: no finished run there (run.json says none, or final/ is missing); pass the output_dir "
            "of a run that wrote final/"
        )
    record = run.record
    if "card" not in record or "settled" not in record:
        raise UserError(
            f"{run_folder}/run.json: the run recorded no card facts (an earlier medrecipes trained it); "
            "train it again with this version to make its card"
        )
    settled, finished = record.get("settled"), record.get("finished")
    stated = {  # what the card states as text
        "script": record.get("script"),
        "command": record.get("command"),
        "settled.method": settled.get("method") if isinstance(settled, dict) else None,
        "finished.hardware": finished.get("hardware") if isinstance(finished, dict) else None,
    }
    problem = facts_problem(record["card"]) or next(
        (f"'{key}' is not text" for key, value in stated.items() if not isinstance(value, str)), None
    )
    if problem:
        raise UserError(
            f"{run_folder}/run.json: {problem}, so the card cannot say it; the run wrote it whole: restore it "
            "from a copy, or train the run again"
        )
    final = RunFolder(run_folder).final  # emptied or cut short since: the card would describe no weights
    if missing := missing_part(final):
        raise UserError(f"{final}: no {missing} there, so the run's model is not whole; restore final/ from a copy")
    check_model_folder(final)
    return run


def write_card(
    folder: str,
    run,
    repo_id: str,
    summary: dict,
    eval_metrics: dict,
    reports: dict[str, dict] | None = None,
    secrets: tuple[str, ...] = (),
) -> None:
    """Write the model card of `run` (`described_run`) into `folder` (README.md, its plots under
    images/ and the resolved recipe as recipe.yaml), from its run.json and what it logged. The
    multiple-choice table holds the run's last evaluation and `reports` ({name: report} of
    `medrecipes eval` outputs, after training); `secrets` (the token in use) never reach it."""
    images = {}
    os.makedirs(os.path.join(folder, "images"), exist_ok=True)
    for name, (caption, png) in figures([run], []).items():  # the run's plots, as in its report
        Path(folder, "images", f"{name}.png").write_bytes(png)
        images[f"images/{name}.png"] = caption
    last = run.reports[max(run.reports)] if run.reports else {}  # its last evaluation's MCQ reports
    text = str(model_card(repo_id, run.record, summary, eval_metrics, {**last, **(reports or {})}, images))
    for secret in {*secrets, get_token(), os.environ.get("HF_TOKEN")} - {None, ""}:
        if secret in text:  # e.g. a token pasted into a recipe value
            text = text.replace(secret, "<redacted>")
    Path(folder, "README.md").write_text(text)
    Path(folder, "recipe.yaml").write_text(recipe_yaml(run.record))


def evaluation_reports(paths: list[str]) -> dict[str, dict]:
    """{name: report} of the tasks in `medrecipes eval` output files; a PubMedQA task asked in a
    setting other than its standard one is named with that setting (never shown as the standard score)."""
    reports = {}
    for path in paths:
        try:
            tasks = json.loads(Path(path).read_text(encoding="utf-8"))["tasks"]
            items = list(tasks.items())
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
            raise UserError(f"{path}: not a `medrecipes eval --output` file (no 'tasks'); pass one") from None
        for task, report in items:
            setting = report.get("pubmedqa_setting") if isinstance(report, dict) else None
            name = task if setting in (None, "reasoning_required") else f"{task} ({setting})"
            if not isinstance(report, dict) or not {"accuracy", "n", "ci95"} <= set(report):
                raise UserError(
                    f"{path}: task {task} has no accuracy, n and ci95; pass a `medrecipes eval --output` file"
                )
            if problem := task_problem(report):
                raise UserError(f"{path}: task {task}: {problem}; pass a `medrecipes eval --output` file")
            if name in reports:
                raise UserError(f"{path}: {name} is in an earlier eval file too; give each task once")
            reports[name] = report
    return reports


def _check_scored_model(eval_file: str, final: str) -> None:
    """An evaluation in a run's card is of the run's model: the weights' fingerprint the eval file
    recorded is final/'s (a copy of final/ elsewhere has the same) or, for a LoRA run, the adapter
    that the scored merge-lora output folded in is final/'s; for an eval file written before
    fingerprints were recorded, its model is final/ itself. One line otherwise: its figures would
    be published as this model's."""
    from medrecipes.locations import weights_fingerprint
    from medrecipes.outputs.records import same_path

    settings = json.loads(Path(eval_file).read_text(encoding="utf-8")).get("settings") or {}
    scored, recorded = settings.get("model"), settings.get("model_fingerprint")
    ours = weights_fingerprint(final)
    if recorded and ours:
        same = ours in (recorded, settings.get("merged_adapter_fingerprint"))
    else:
        same = bool(scored) and same_path(str(scored), final)
    if not same:
        raise UserError(
            f"{eval_file}: it evaluated {scored} ({recorded or 'no fingerprint recorded'}), not this run's model "
            f"{final} ({ours or 'no weights found'}) nor a merge-lora output of it; pass evaluations of {final} "
            "or of its merge"
        )


def run_method(record: dict) -> str:
    """The method of the run a run.json records, as `runs.settle` settled it."""
    return record["settled"]["method"]


def recorded_facts(record: dict) -> tuple[str, str, str, str]:
    """(method, script, command, hardware) of the finished run a run.json records, as its card
    states them."""
    return run_method(record), record["script"], record["command"], record["finished"]["hardware"]


def card_of_run(run_folder: str, eval_files: list[str], output: str, repo_id: str | None, overwrite: bool) -> None:
    """Write the model card of the finished run in `run_folder` into the folder `output`, as a push
    would (`write_card`, from run.json), with the evaluations of `eval_files` (`medrecipes eval`
    outputs made after training) in its table."""
    from transformers import TrainerState

    from medrecipes.outputs.claims import claim_output
    from medrecipes.outputs.writes import staged

    for path in (run_folder, *eval_files):
        if not os.path.exists(path):
            raise UserError(f"{path}: {absent(path)}; pass a run's output_dir and eval --output files")
    folder = RunFolder(run_folder)
    state_path = folder.trainer_state() if os.path.isdir(run_folder) else None
    if state_path is None:
        raise UserError(
            f"{run_folder}: no trainer_state.json in it or in a checkpoint; pass a training run's output_dir"
        )
    repo_id = repo_id or Path(run_folder).absolute().name
    run = described_run(run_folder, repo_id.split("/")[-1])
    reports = evaluation_reports(eval_files)
    for path in eval_files:
        _check_scored_model(path, folder.final)
    claim_output(output, "card", "card --output", [run_folder, *eval_files], overwrite, folder=True)
    state = TrainerState.load_from_json(state_path)
    eval_file = Path(run_folder, "eval_results.json")
    metrics = json.loads(eval_file.read_text()) if eval_file.is_file() else {}
    with staged(output, folder=True, kind="card") as folder:
        write_card(folder, run, repo_id, training_summary(state), metrics, reports)
