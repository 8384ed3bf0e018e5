"""The comparison a reader of `medrecipes report` comes for: each evaluation's accuracy with its
interval, the runs of one stage on one row (their seeds as its points and their mean), the base
model's evaluations and always giving the most common answer as lines across the panel."""

import fnmatch
from collections import Counter

from medrecipes.report.drawing import error_bars, pyplot, row_legend, stage_of
from medrecipes.report.runs import Evaluation, Run

# Names drawn as baselines (a line across each panel), not as rows: the starting model's evaluation.
BASELINES = ("base", "base-*", "base_*", "*/base-*", "*/base_*", "*-base", "*-base-*")


def comparison_points(runs: list[Run], evaluations: list[Evaluation]) -> list[tuple[str, str, dict]]:
    """(name, task, report) of every evaluation file and of each run's last evaluation."""
    found = [(e.name, task, report) for e in evaluations for task, report in e.tasks.items()]
    for run in runs:
        if run.reports:
            found += [(run.name, task, report) for task, report in run.reports[max(run.reports)].items()]
    return [(name, task, report) for name, task, report in found if report.get("accuracy") is not None]


def majority_share(reports: list[dict]) -> tuple[str, float] | None:
    """The most common gold answer of a task's questions and its share: the accuracy of always
    giving it, read from an evaluation that kept its predictions."""
    for report in reports:
        golds = [p.get("answer") for p in report.get("predictions") or [] if p.get("answer")]
        if golds:
            answer, count = Counter(golds).most_common(1)[0]
            return answer, count / len(golds)
    return None


def comparison_figure(runs: list[Run], evaluations: list[Evaluation], baselines=BASELINES):
    """Per task, a row per stage (runs and evaluations whose names differ only by a seed), each
    seed a point with its 95% interval and the stage's mean a diamond; the base model's
    evaluations and always giving the most common answer are lines across the panel. Its
    height grows with the rows, so 50 runs stay as readable as 1."""
    plt = pyplot()
    points = comparison_points(runs, evaluations)
    if not points:
        return None
    # Per task: each stage's reports (its seeds), in the order first seen, and the baselines' lines.
    rows: dict[str, dict[str, list[dict]]] = {}
    lines: dict[str, list[tuple[str, dict]]] = {}
    for name, task, report in points:
        rows.setdefault(task, {})
        if any(fnmatch.fnmatch(name, pattern) for pattern in baselines):
            lines.setdefault(task, []).append((name, report))
        else:
            rows[task].setdefault(stage_of(name), []).append(report)
    heights = [0.9 + 0.32 * max(1, len(stages)) for stages in rows.values()]
    fig, axes = plt.subplots(len(rows), 1, figsize=(9, sum(heights) + 0.6), squeeze=False,
                             gridspec_kw={"height_ratios": heights})  # fmt: skip
    for ax, (task, stages) in zip(axes[:, 0], rows.items(), strict=True):
        for y, seeds in enumerate(stages.values()):
            for report in seeds:
                low, high = error_bars([report["accuracy"]], [report.get("ci95")])
                ax.errorbar([report["accuracy"]], [y], xerr=[low, high], fmt="o", ms=4, capsize=2, color="C0",
                            alpha=0.8, label="one run or seed: accuracy, 95% interval")  # fmt: skip
            if len(seeds) > 1:
                mean = sum(r["accuracy"] for r in seeds) / len(seeds)
                ax.plot([mean], [y], "D", ms=7, color="black", label="mean of its seeds")
        for k, (name, report) in enumerate(lines.get(task, [])):
            ax.axvline(report["accuracy"], ls="--", color=f"C{k + 1}", label=f"{name}: {report['accuracy']:.1%}")
        majority = majority_share([r for _, t, r in points if t == task])
        if majority:
            ax.axvline(majority[1], ls=":", color="grey", label=f"always {majority[0]}: {majority[1]:.1%}")
        ax.set_yticks(range(len(stages)), [f"{s} ({len(r)})" if len(r) > 1 else s for s, r in stages.items()])
        ax.set_ylim(len(stages) - 0.5, -0.5)
        ax.set_xlim(0, 1)
        ax.set_xlabel("accuracy")
        ax.set_title(f"{task}: accuracy by run (95% intervals)", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
        row_legend([ax])  # one entry per kind, not per point
    fig.tight_layout()
    return fig
