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
import hashlib
import json
import logging
import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import yaml
from huggingface_hub import EvalResult, ModelCard, ModelCardData, get_token

from medrecipes.config import method_named, parse_recipe, resolved_yaml
from medrecipes.data.manifest import decontamination_summary
from medrecipes.data.sources import PREFERENCE_FIELDS, local_files
from medrecipes.errors import UserError
from medrecipes.evaluation.calibration import COVERAGES, headline, with_interval
from medrecipes.locations import BUILDERS, absent, looks_local
from medrecipes.outputs.records import written_about
from medrecipes.report import figures, read_run, trainer_state_path
from medrecipes.rewards import signal_share
from medrecipes.runs.record import FINAL, SettledRun

logger = logging.getLogger(__name__)

CARD_TEMPLATE = Path(__file__).parent.parent / "model_card.md"
FRAMEWORKS = ("medrecipes", "transformers", "trl", "torch", "accelerate", "datasets", "peft")


def _hash_files(paths: list[str]) -> str:
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(os.path.relpath(path).encode())
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def is_hub_dataset(source) -> bool:
    return source.path not in BUILDERS.values() and not looks_local(source.path) and not os.path.exists(source.path)


def source_rows(sources) -> list[dict]:
    """One row per data source: where it comes from, which revision, its share of the mixture."""
    total = sum(s.weight for s in sources)
    rows = []
    for source in sources:
        made = []  # how `medrecipes pairs` made a local file of preference data, as it recorded
        if source.revision:
            revision = source.revision
        elif is_hub_dataset(source):
            revision = "not pinned (the Hub's latest at training time)"
        else:
            files = local_files(source)
            count = f"{len(files)} file{'s' if len(files) > 1 else ''}"
            revision = f"sha256:{_hash_files(files)[:16]} ({count})" if files else "files not found"
            made = [about for about in map(written_about, files) if about]
        data_files = source.data_files if isinstance(source.data_files, list | type(None)) else [source.data_files]
        rows.append(
            {
                "path": source.path,
                "name": source.name or "",
                "split": source.split,
                "files": ", ".join(data_files or []),
                "revision": revision,
                "weight": f"{source.weight / total:.1%}",
                "format": source.format,
                "how": "; ".join(made)
                or ("not recorded (not written by `medrecipes pairs`)" if source.format in PREFERENCE_FIELDS else ""),
            }
        )
    return rows


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
        rows.append(
            {
                "task": name,
                "source": "agreement of sampled answers"
                if "votes" in report["calibration"]
                else "option probabilities",
                **{key: with_interval(found, key, ".3f") for key in ("ece", "brier", "nll", "auroc")},
                **{f"at{c:g}": with_interval(found, f"selective_accuracy@{c:g}", ".1%") for c in COVERAGES},
                "meaning": (
                    f"On {name} the model is right {report['accuracy']:.0%} of the time; its 80% most confident answers "
                    f"are right {kept:.0%} of the time, so sending its least confident 20% to a person "
                    f"{'raises' if helps else 'does not raise'} the accuracy of what it answers alone; its stated "
                    f"confidence {trust} how often it is right (ECE {found['ece']:.3f})."
                ),
            }
        )
    return rows


def mcq_results(reports: dict[str, dict]) -> list[EvalResult]:
    """The reports as the Hub's evaluation results (`model-index` in the card's metadata)."""
    results = []
    for name, report in reports.items():
        source = str(report.get("source") or name)
        hub_id = "/" in source and not looks_local(source) and not os.path.exists(source)
        results.append(
            EvalResult(
                task_type="multiple-choice",
                task_name="Multiple-choice question answering",
                dataset_type=source if hub_id else name,
                dataset_name=name,
                metric_type="accuracy",
                metric_name=f"accuracy ({report.get('mode', 'generate')}, n={report['n']})",
                metric_value=round(report["accuracy"], 4),
            )
        )
    return results


def model_card(
    repo_id: str,
    method: str,
    recipe,
    model_args,
    training_args,
    summary: dict,
    eval_metrics: dict,
    hardware_line: str,
    command: str,
    decontamination: str | None = None,
    mcq_reports: dict[str, dict] | None = None,
    images: dict[str, str] | None = None,
    script: str | None = None,
) -> ModelCard:
    """The model card of a run, from what the run knows about itself; `mcq_reports`, the
    multiple-choice reports of its last evaluation; `images`, {path in the repository: caption}
    of its plots; `script`, the recipe script that ran (run.json's; by default the method's)."""
    base = model_args.model_name_or_path
    scratch = recipe.init_from_scratch
    sources = recipe.mixture.sources if recipe.mixture else []
    mcq_reports = mcq_reports or {}
    card_data = ModelCardData(
        model_name=repo_id.split("/")[-1],
        base_model=None if scratch or not base or looks_local(base) or os.path.exists(base) else base,
        datasets=[s.path for s in sources if is_hub_dataset(s)] or None,
        library_name="peft" if model_args.use_peft else "transformers",
        pipeline_tag="text-generation",
        tags=["medrecipes", method, "medical"],
        eval_results=mcq_results(mcq_reports) or None,
    )
    return ModelCard.from_template(
        card_data,
        template_path=str(CARD_TEMPLATE),
        model_name=repo_id.split("/")[-1],
        method=method,
        base_model=f"the `{recipe.architecture}` architecture, from scratch" if scratch else f"`{base}`",
        sources=source_rows(sources),
        decontamination=decontamination,
        evaluation=evaluation_rows(eval_metrics),
        mcq=[
            (
                name,
                r.get("mode", ""),
                r["n"],
                f"{r['accuracy']:.1%}",
                f"{r['ci95'][0]:.1%}-{r['ci95'][1]:.1%}",
                with_interval(r, "macro_f1", ".3f") if r.get("macro_f1") is not None else "",
            )
            for name, r in mcq_reports.items()
        ],  # fmt: skip
        calibration=calibration_rows(mcq_reports),
        trained_splits=sorted(
            {f"{s.path} {s.split}" + (f" ({s.data_files})" if s.data_files else "") for s in sources}
        ),
        images=images or {},
        summary=summary,
        hardware=hardware_line,
        precision="bf16" if training_args.bf16 else "fp16" if training_args.fp16 else "fp32",
        command=command,
        script=script or method_named(method).script,
        recipe_yaml=resolved_yaml(recipe, model_args, training_args).rstrip(),
        versions=_framework_versions(),
    )


def _secrets(training_args) -> list[str]:
    return [s for s in {training_args.hub_token, get_token(), os.environ.get("HF_TOKEN")} if s]


def write_card(
    folder: str,
    run_folder: str,
    repo_id: str,
    method: str,
    recipe,
    model_args,
    training_args,
    summary: dict,
    eval_metrics: dict,
    hardware_line: str,
    command: str,
    script: str,
    reports: dict[str, dict] | None = None,
) -> None:
    """Write the model card of the run in `run_folder` into `folder` (README.md, its plots under
    images/ and the resolved recipe as recipe.yaml). The multiple-choice table holds the run's
    last evaluation and `reports` ({name: report} of `medrecipes eval` outputs, after training)."""
    try:  # the run's plots, as in its report, and the multiple-choice reports of its last evaluation
        run = read_run(run_folder, repo_id.split("/")[-1])
    except UserError:
        run = None
    images = {}
    if run is not None:
        os.makedirs(os.path.join(folder, "images"), exist_ok=True)
        for name, (caption, png) in figures([run], []).items():
            Path(folder, "images", f"{name}.png").write_bytes(png)
            images[f"images/{name}.png"] = caption
    last = run.reports[max(run.reports)] if run is not None and run.reports else {}
    card = model_card(
        repo_id,
        method,
        recipe,
        model_args,
        training_args,
        summary,
        eval_metrics,
        hardware_line,
        command,
        decontamination_summary(recipe.built_data) if recipe.built_data else None,
        {**last, **(reports or {})},
        images,
        script,
    )
    text = str(card)
    for secret in _secrets(training_args):
        if secret in text:  # e.g. a token pasted into a recipe value
            text = text.replace(secret, "<redacted>")
    Path(folder, "README.md").write_text(text)
    Path(folder, "recipe.yaml").write_text(resolved_yaml(recipe, model_args, training_args))


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
    """The method of the run a run.json records: its settled run's (`runs.settle`), or, in a record
    written before runs were settled, its script's name."""
    settled = SettledRun.from_record(record)
    return settled.method if settled is not None else Path(str(record.get("script", ""))).stem


def recorded_facts(record: dict) -> tuple[str, str, str, str]:
    """(method, script, command, hardware) of the run a run.json records, as its card states them:
    what was not recorded is said so."""
    method = run_method(record)
    script = record.get("script") or method_named(method).script
    command = record.get("command") or f"python {script} (its command line was not recorded)"
    hardware = (record.get("finished") or {}).get("hardware") or "hardware not recorded"
    return method, script, command, hardware


def card_of_run(run_folder: str, eval_files: list[str], output: str, repo_id: str | None, overwrite: bool) -> None:
    """Write the model card of the finished run in `run_folder` into the folder `output`, as a push
    would (`write_card`), with the evaluations of `eval_files` (`medrecipes eval` outputs made
    after training) in its table. The recipe is the run's record of it (run.json), parsed again."""
    from transformers import TrainerState

    from medrecipes.outputs.claims import claim_output
    from medrecipes.outputs.writes import staged

    for path in (run_folder, *eval_files):
        if not os.path.exists(path):
            raise UserError(f"{path}: {absent(path)}; pass a run's output_dir and eval --output files")
    if not os.path.isdir(run_folder) or trainer_state_path(run_folder) is None:
        raise UserError(
            f"{run_folder}: no trainer_state.json in it or in a checkpoint; pass a training run's output_dir"
        )
    where = f"{run_folder}/run.json"
    run = read_run(run_folder, Path(run_folder).name)
    record = run.record
    if not record.get("finished") or not isinstance(record.get("recipe"), dict):
        raise UserError(f"{where}: no finished run recorded there; pass the output_dir of a run that wrote final/")
    method, script, command, hardware = recorded_facts(record)
    reports = evaluation_reports(eval_files)
    for path in eval_files:
        _check_scored_model(path, os.path.join(run_folder, FINAL))
    claim_output(output, "card", "card --output", [run_folder, *eval_files], overwrite, folder=True)
    with staged(output, folder=True, kind="card") as folder:
        recipe_file = Path(folder, "recipe.yaml")
        recipe_file.write_text(yaml.safe_dump(record["recipe"], sort_keys=False))
        try:
            recipe, args, model_args = parse_recipe(method, [str(recipe_file)], to_train=False)
        except (UserError, KeyError) as err:
            raise UserError(
                f"{where}: the run's recipe does not parse here ({err}); run this where the run ran"
            ) from None
        state = TrainerState.load_from_json(trainer_state_path(run_folder))
        eval_file = Path(run_folder, "eval_results.json")
        metrics = json.loads(eval_file.read_text()) if eval_file.is_file() else {}
        write_card(folder, run_folder, repo_id or Path(run_folder).absolute().name, method, recipe, model_args,
                   args, training_summary(state), metrics, hardware, command, script, reports)  # fmt: skip
