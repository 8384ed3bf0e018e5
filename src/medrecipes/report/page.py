"""The HTML page of `medrecipes report`: self-contained (images inline, no script or style
from the network), and `write_report`, which writes it and the PNG files atomically."""

import base64
import html
import json
import os
from pathlib import Path

from medrecipes.errors import UserError, given_twice
from medrecipes.evaluation.calibration import headline, with_interval
from medrecipes.outputs.claims import claim_output
from medrecipes.outputs.writes import staged
from medrecipes.report.figures import figures
from medrecipes.report.runs import Evaluation, Run, read_inputs, run_state, training_logs
from medrecipes.runs.record import SettledRun

# Rows a table shows open; a longer one is folded under a line that says how many it holds.
OPEN_ROWS = 12


def _table(header: list[str], rows: list[list], fold: bool = True) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    if not fold or len(rows) <= OPEN_ROWS:
        return table
    return f"<details><summary>{len(rows)} rows</summary>{table}</details>"


def _number(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def run_rows(runs: list[Run]) -> list[list]:
    rows = []
    for run in runs:
        logs = training_logs(run)
        tokens = max((e.get("num_input_tokens_seen", 0) for e in logs), default=0)
        rows.append(
            [
                run.name,
                run.record.get("script", "not recorded"),
                settled_summary(run.record),
                run.record.get("model", "not recorded"),
                run_state(run),
                max((e.get("step", 0) for e in run.log_history), default=0),
                _number(tokens) if tokens else "not recorded",
                _number(logs[-1]["loss"]) if logs else "not logged",
                f"step {run.best_step}" if run.best_step is not None else "none",
            ]
        )
    return rows


def settled_summary(record: dict) -> str:
    """What the run settled at its start (run.json's `SettledRun`), in a few words."""
    run = SettledRun.from_record(record)
    if run is None:
        return "not recorded"
    parts = [f"activation checkpointing {'on' if run.activation_checkpointing else 'off'} ({run.checkpointing_by})"]
    if run.end_of_turn:
        parts.append(f"turns end at {run.end_of_turn}")
    if run.prompt_room is not None:
        parts.append(f"prompts up to {run.prompt_room:,} tokens")
    if run.rewards:
        parts.append("rewards " + ", ".join(f"{r['name']} x{r['weight']:g}" for r in run.rewards))
    if run.resume_from:
        parts.append(f"resumed from {os.path.basename(run.resume_from)}")
    return "; ".join(parts)


def settings_rows(runs: list[Run]) -> tuple[list[str], list[list]]:
    """The resolved recipe of each run (from its record): every key for one run; for several,
    the keys whose values differ first, then the others."""
    recipes = [run.record.get("recipe") or {} for run in runs]
    keys = list(dict.fromkeys(k for r in recipes for k in r))
    differ = [k for k in keys if len({json.dumps(r.get(k), sort_keys=True) for r in recipes}) > 1]
    ordered = differ + [k for k in keys if k not in differ]
    rows = [[k, *(json.dumps(r.get(k)) if k in r else "" for r in recipes)] for k in ordered]
    return ["key", *(run.name for run in runs)], rows


def mixture_rows(runs: list[Run]) -> list[list]:
    rows = []
    for run in runs:
        mixture = (run.record.get("recipe") or {}).get("dataset_mixture") or {}
        for source in mixture.get("sources", []):
            rows.append(
                [
                    run.name,
                    source.get("path"),
                    source.get("data_files") or "",
                    source.get("split", "train"),
                    source.get("format", "text"),
                    source.get("weight", 1.0),
                ]
            )
    return rows


def evaluation_rows(evaluations: list[Evaluation]) -> list[list]:
    rows = []
    for evaluation in evaluations:
        for task, report in evaluation.tasks.items():
            lo, hi = report["ci95"]
            rows.append(
                [
                    evaluation.name,
                    _scored_model(evaluation.settings),
                    task,
                    report.get("mode", evaluation.settings.get("mode", "")),
                    report["n"],
                    f"{report['accuracy']:.1%}",
                    f"{lo:.1%}-{hi:.1%}",
                    f"{report['unparseable']:.1%}" if "unparseable" in report else "",
                    *_calibration_cells(report),
                ]
            )
    return rows


def _scored_model(settings: dict) -> str:
    """The model an evaluation scored, with its weights' fingerprint where the file recorded one
    and the adapter's where the model is a merge-lora output."""
    model, fingerprint = settings.get("model", "not recorded"), settings.get("model_fingerprint")
    adapter = settings.get("merged_adapter_fingerprint")
    merged = f", merged from adapter {adapter}" if adapter else ""
    return f"{model} ({fingerprint}{merged})" if fingerprint else str(model)


def _calibration_cells(report: dict) -> list[str]:
    """ECE, Brier and AUROC with their intervals, of the acc ranking or of sampled answers' votes."""
    found = headline(report.get("calibration") or {})
    return [with_interval(found, key, ".3f") if found else "" for key in ("ece", "brier", "auroc")]


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } figure { margin: 1em 0; } figure img { max-width: 100%; }
figcaption { font-size: 0.9em; color: #555; } .broken { outline: 3px solid #c00; }
"""

# Marks each figure as loaded, or outlines it in red where its image did not decode, so that a
# reader (or a browser test) sees at once whether every plot is there.
CHECK_IMAGES = """
window.addEventListener("load", function () {
  var figures = document.querySelectorAll("figure");
  figures.forEach(function (f) {
    var img = f.querySelector("img");
    var ok = img !== null && img.complete && img.naturalWidth > 0;
    f.dataset.loaded = ok ? "yes" : "no";
    if (!ok) { f.classList.add("broken"); }
  });
  document.body.dataset.figures = String(figures.length);
});
"""


RUN_COLUMNS = [
    "run",
    "script",
    "settled",
    "model",
    "state",
    "steps",
    "tokens seen",
    "last training loss",
    "best checkpoint",
]
EVALUATION_COLUMNS = [
    "evaluation",
    "model",
    "task",
    "mode",
    "n",
    "accuracy",
    "95% interval",
    "unparseable",
    "ECE",
    "Brier",
    "AUROC",
]
MIXTURE_COLUMNS = ["run", "path", "data_files", "split", "format", "weight"]


def render_html(
    runs: list[Run], evaluations: list[Evaluation], plots: dict[str, tuple[str, bytes]], title: str
) -> str:
    parts = [f"<h1>{html.escape(title)}</h1>"]
    if runs:
        parts += ["<h2>Runs</h2>", _table(RUN_COLUMNS, run_rows(runs))]
    for name, (caption, png) in plots.items():
        data = base64.b64encode(png).decode()
        parts.append(
            f'<figure id="{name}"><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(caption)} ({name}.png)</figcaption></figure>"
        )
    if evaluations:
        parts += ["<h2>Evaluations</h2>", _table(EVALUATION_COLUMNS, evaluation_rows(evaluations))]
    if runs:
        mixture = mixture_rows(runs)
        missing = "<p>No {} recorded in the runs' run.json.</p>"
        parts += [
            "<h2>Data mixture</h2>",
            _table(MIXTURE_COLUMNS, mixture) if mixture else missing.format("dataset_mixture"),
        ]
        header, rows = settings_rows(runs)
        summary = f"{len(rows)} keys (those that differ between runs first)"
        settings = f"<details><summary>{summary}</summary>{_table(header, rows, fold=False)}</details>"
        parts += ["<h2>Recipe settings</h2>", settings if rows else missing.format("resolved recipe")]
    body = "\n".join(parts)
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{STYLE}</style></head>\n<body>\n{body}\n<script>{CHECK_IMAGES}</script>\n</body></html>\n"
    )


def images_folder(output: str) -> str:
    """Where the PNG files of the report `output` go: report_files/ beside report.html."""
    return os.path.splitext(output)[0] + "_files"


def write_report(paths: list[str], output: str, title: str | None = None, overwrite: bool = False) -> dict[str, str]:
    """Write the page to `output` and each plot as <name>.png into a folder beside it
    (`report_files/` for `report.html`); returns {name: PNG path}. Both are written atomically:
    a kill leaves the previous report or the new one."""
    if not paths:
        raise UserError("report: name at least one run folder or eval --output file")
    if repeat := given_twice(paths):  # a run named twice would be drawn twice, under one name
        raise UserError(f"report: {repeat}; name each run folder or eval file once")
    images = images_folder(output)
    claim_output(output, "report", "report: --output", paths, overwrite)
    claim_output(images, "report", "report: --output", paths, overwrite, folder=True)
    runs, evaluations = read_inputs(paths)
    plots = figures(runs, evaluations)
    named = ", ".join(r.name for r in runs) if len(runs) <= 5 else f"{len(runs)} runs"
    title = title or f"medrecipes report: {named or 'evaluations'}"
    page = render_html(runs, evaluations, plots, title)
    with staged(images, folder=True, kind="report") as folder:
        for name, (_, png) in plots.items():
            Path(folder, f"{name}.png").write_bytes(png)
    with staged(output, folder=False, kind="report") as path:
        Path(path).write_text(page, encoding="utf-8")
    return {name: os.path.join(images, f"{name}.png") for name in plots}
