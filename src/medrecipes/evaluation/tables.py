"""Reports as a trainer logs them and as a person reads them: the scalars of each task and the
Markdown tables of accuracy and calibration."""

from medrecipes.evaluation import calibration as cal
from medrecipes.names import CALIBRATION_METRICS, REPORT_METRICS


def task_metrics(reports: dict[str, dict], prefix: str = "eval") -> dict[str, float]:
    """The scalars a trainer logs for each task: <prefix>_<task>_acc, _macro_f1, and _acc_norm or
    _unparseable, _abstained and _stopped (the share of replies that ended at a stop token); and the
    calibration of the acc ranking (or of sampled answers' votes): _ece, _brier, _nll, _auroc."""
    metrics = {}
    for name, report in reports.items():
        metrics[f"{prefix}_{name}_acc"] = report["accuracy"]
        for key in REPORT_METRICS:
            if key in report:
                metrics[f"{prefix}_{name}_{key}"] = report[key]
        found = cal.headline(report.get("calibration", {}))
        for key in CALIBRATION_METRICS:
            if found.get(key) is not None:
                metrics[f"{prefix}_{name}_{key}"] = found[key]
    return metrics


def format_report(name: str, report: dict) -> str:
    lo, hi = report["ci95"]
    extra = f", {report['unparseable']:.1%} unparseable" if "unparseable" in report else ""
    extra += f", {report['abstained']:.1%} abstained" if report.get("abstained") else ""
    extra += f", {report['stopped']:.1%} ended at a stop token" if "stopped" in report else ""
    extra += f", acc_norm {report['acc_norm']:.1%}" if "acc_norm" in report else ""
    extra += f", macro-F1 {report['macro_f1']:.3f}" if "macro_f1" in report else ""
    lines = [f"{name}: accuracy {report['accuracy']:.1%} (95% CI {lo:.1%}-{hi:.1%}) on {report['n']} questions{extra}"]
    for variant, found in report.get("calibration", {}).items():
        lines.append(f"  calibration ({variant}): {format_calibration(found)}")
    for subject, result in report["subjects"].items():
        lines.append(f"  {subject:<24} {result['accuracy']:6.1%}  n={result['n']}")
    return "\n".join(lines)


def format_calibration(found: dict) -> str:
    """One line: ECE, Brier, NLL, AUROC and selective accuracy, each with its 95% interval."""
    selective = ", ".join(
        f"{c:.0%}: {cal.with_interval(found, f'selective_accuracy@{c:g}', '.1%')}" for c in cal.COVERAGES
    )
    return (
        f"ECE {cal.with_interval(found, 'ece', '.3f')}, Brier {cal.with_interval(found, 'brier', '.3f')}, NLL {cal.with_interval(found, 'nll', '.3f')}, "
        f"AUROC {cal.with_interval(found, 'auroc', '.3f')}; accuracy of the most confident (coverage {selective}), "
        f"area under the accuracy-coverage curve {cal.with_interval(found, 'aurc_accuracy', '.3f')}"
    )


def format_table(reports: dict[str, dict]) -> str:
    """A markdown table: one line per task, then one per subject when a task has several."""
    lines = [
        "| task | mode | n | accuracy | 95% CI | macro-F1 (95% CI) | acc_norm | unparseable | stopped |",
        "|---|---|---:|---:|---|---|---:|---:|---:|",
    ]

    def line(name: str, mode: str, result: dict) -> str:
        lo, hi = result["ci95"]
        norm = f"{result['acc_norm']:.1%}" if "acc_norm" in result else ""
        unparseable = f"{result['unparseable']:.1%}" if "unparseable" in result else ""
        f1 = (
            f"{result['macro_f1']:.3f} ({result['macro_f1_ci95'][0]:.3f}-{result['macro_f1_ci95'][1]:.3f})"
            if "macro_f1" in result
            else ""
        )
        stopped = f"{result['stopped']:.1%}" if "stopped" in result else ""
        return f"| {name} | {mode} | {result['n']} | {result['accuracy']:.1%} | {lo:.1%}-{hi:.1%} | {f1} | {norm} | {unparseable} | {stopped} |"

    for name, report in reports.items():
        lines.append(line(name, report["mode"], report))
        if len(report["subjects"]) > 1:
            lines += [line(f"  {name} / {s}", report["mode"], r) for s, r in report["subjects"].items()]
    calibrated = [(name, v, found) for name, r in reports.items() for v, found in r.get("calibration", {}).items()]
    if calibrated:
        lines += ["", calibration_table(calibrated)]
    return "\n".join(lines)


def calibration_table(rows: list[tuple[str, str, dict]]) -> str:
    """A markdown table of calibration reports, one per (task, confidence variant, report)."""
    head = (
        "| task | confidence from | mean confidence | ECE | Brier | NLL | AUROC | acc @50% | acc @80% | acc @90% "
        "| area acc-coverage |\n|---|---|---:|---|---|---|---|---|---|---|---|"
    )
    return "\n".join([head, *(_calibration_row(*row) for row in rows)])


def _calibration_row(name: str, variant: str, found: dict) -> str:
    """A row of `calibration_table`: each figure with its 95% interval."""
    cells = [cal.with_interval(found, key, ".3f") for key in ("ece", "brier", "nll", "auroc")]
    cells += [cal.with_interval(found, f"selective_accuracy@{c:g}", ".1%") for c in cal.COVERAGES]
    cells.append(cal.with_interval(found, "aurc_accuracy", ".3f"))
    return (
        f"| {name} | {VARIANTS.get(variant, variant)} | {found['mean_confidence']:.3f} | " + " | ".join(cells) + " |"
    )


# What each calibration report's confidence is, in the tables.
VARIANTS = {
    "acc": "option log-likelihoods (softmax)",
    "acc_norm": "per-character log-likelihoods",
    "acc_temperature_scaled": "log-likelihoods / fitted temperature",
    "votes": "agreement of sampled answers",
}
