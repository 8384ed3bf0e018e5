"""The plots of `medrecipes report`, drawn with matplotlib (its Agg backend: files, no display),
one colour per run; each is drawn only where some run has what it shows. The first, the
comparison, is what a reader comes for: each evaluation's accuracy with its interval, the runs
of one stage on one row (their seeds as its points), the baselines as lines. Legends sit
outside the axes, so that no number of runs covers a plot."""

import fnmatch
import io
import re
from collections import Counter

from medrecipes.evaluation.calibration import headline
from medrecipes.report.runs import (
    Evaluation,
    Run,
    accuracy_series,
    eval_loss_series,
    reward_names,
    step_series,
    tokens_at,
    training_logs,
)
from medrecipes.rewards import NO_SIGNAL


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    _pyplot().close(fig)
    return buffer.getvalue()


def _colours(count: int) -> list:
    cycle = _pyplot().rcParams["axes.prop_cycle"].by_key()["color"]
    return [cycle[i % len(cycle)] for i in range(count)]


def _by_stage(runs: list[Run]) -> list[tuple[Run, str, str]]:
    """Each run with its stage's colour and its label, the runs of one stage (names that differ
    only by a seed) sharing both: "sft (3 seeds)"; the label is "_" after a stage's first run,
    which matplotlib leaves out of a legend, so a legend has an entry a stage."""
    stages = Counter(stage_of(r.name) for r in runs)
    colours = dict(zip(stages, _colours(len(stages)), strict=True))
    found, seen = [], set()
    for run in runs:
        stage = stage_of(run.name)
        label = run.name if stages[stage] == 1 else f"{stage} ({stages[stage]} seeds)"
        found.append((run, colours[stage], "_" if stage in seen else label))
        seen.add(stage)
    return found


def _label(label: str, what: str) -> str:
    return label if label == "_" else f"{label}: {what}"


def _error_bars(accuracy: list[float], intervals: list) -> tuple[list[float], list[float]]:
    """matplotlib's error bars (the distance below and above each value) of 95% intervals; a
    bound that rounding put a hair past its value (1.0 against 0.9999999) counts as 0."""
    low = [max(0.0, a - ci[0]) if ci else 0.0 for a, ci in zip(accuracy, intervals, strict=True)]
    high = [max(0.0, ci[1] - a) if ci else 0.0 for a, ci in zip(accuracy, intervals, strict=True)]
    return low, high


def _legend(ax) -> None:
    """The legend beside the axes, not on them, in as many columns as keep it about as tall as
    the plot (24 entries a column)."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, ncol=1 + (len(handles) - 1) // 24,
                  borderaxespad=0.0, frameon=False)  # fmt: skip


# A seed in a run's or an evaluation's name ("sft-free-s2", "grpo_seed3-pubmedqa"): a token of its own.
SEED = re.compile(r"(?:^|(?<=[-_]))(?:s|seed)\d+(?=$|[-_])")


def stage_of(name: str) -> str:
    """The name without its seed: the row the comparison puts that run or evaluation on."""
    return re.sub(r"([-_])[-_]+", r"\1", SEED.sub("", name)).strip("-_") or name


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
    plt = _pyplot()
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
                low, high = _error_bars([report["accuracy"]], [report.get("ci95")])
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
        _row_legend([ax])  # one entry per kind, not per point
    fig.tight_layout()
    return fig


def loss_figure(runs: list[Run]):
    plt = _pyplot()
    if not any(training_logs(r) or eval_loss_series(r) for r in runs):
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    token_axes = [tokens_at(r) for r in runs]
    by_tokens = all(at is not None for r, at in zip(runs, token_axes, strict=True) if training_logs(r))
    styles = ["--", ":", "-."]
    for (run, colour, label), at in zip(_by_stage(runs), token_axes, strict=True):
        x = at if by_tokens and at is not None else (lambda step: step)
        train = [(x(e["step"]), e["loss"]) for e in training_logs(run)]
        if train:
            ax.plot(*zip(*train, strict=True), color=colour, label=_label(label, "train"))
        for i, (name, points) in enumerate(eval_loss_series(run).items()):
            xs, ys = zip(*[(x(s), v) for s, v in points], strict=True)
            ax.plot(
                xs, ys, styles[i % len(styles)], marker="o", ms=3, color=colour, label=_label(label, f"eval {name}")
            )
    ax.set_xlabel("tokens seen" if by_tokens else "step")
    ax.set_ylabel("loss")
    ax.set_title("Training and evaluation loss")
    ax.grid(alpha=0.3)
    _legend(ax)
    return fig


def accuracy_figure(runs: list[Run]):
    plt = _pyplot()
    if not any(accuracy_series(r) for r in runs):
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    markers = "osD^v<>"
    for run, colour, label in _by_stage(runs):
        for i, (name, points) in enumerate(accuracy_series(run).items()):
            steps = [p[0] for p in points]
            ax.plot(
                steps,
                [p[1] for p in points],
                marker=markers[i % len(markers)],
                color=colour,
                label=_label(label, name),
            )
            banded = [p for p in points if p[2] is not None]
            if banded:
                ax.fill_between(
                    [p[0] for p in banded],
                    [p[2][0] for p in banded],
                    [p[2][1] for p in banded],
                    color=colour,
                    alpha=0.12,
                )
    ax.set_xlabel("step")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    ax.set_title("Multiple-choice accuracy (bands: 95% interval)")
    ax.grid(alpha=0.3)
    _legend(ax)
    return fig


def subject_points(run: Run) -> dict[str, dict[str, dict]]:
    """{task: {"best (step N)": report, "last (step N)": report}} for the tasks with several
    subjects ("best and last (step N)" where they are the same evaluation). "Best" is the trainer's
    best checkpoint (`metric_for_best_model`), decided by the trainer alone; a run without one, or
    whose best step has no report of the task, shows its highest-accuracy evaluation under that name."""
    if not run.reports:
        return {}
    last = max(run.reports)
    found: dict[str, dict[str, dict]] = {}
    for name in run.reports[last]:
        steps = [s for s in run.reports if name in run.reports[s]]
        report = run.reports[last][name]
        if len(report.get("subjects", {})) <= 1:
            continue
        if run.best_step in steps:
            chosen, label = run.best_step, "best"
        else:
            chosen = max(steps, key=lambda s: run.reports[s][name]["accuracy"])
            label = "highest accuracy"
        if chosen == last:
            found[name] = {f"{label} and last (step {last})": report}
        else:
            found[name] = {f"{label} (step {chosen})": run.reports[chosen][name], f"last (step {last})": report}
    return found


def subjects_figure(runs: list[Run]):
    import numpy as np

    plt = _pyplot()
    bars = [
        (run, task, label, report)
        for run in runs
        for task, points in subject_points(run).items()
        for label, report in points.items()
    ]
    if not bars:
        return None
    tasks = list(dict.fromkeys(task for _, task, _, _ in bars))
    subjects = {t: sorted({s for _, task, _, r in bars if task == t for s in r["subjects"]}) for t in tasks}
    height = sum(len(s) for s in subjects.values())
    fig, axes = plt.subplots(
        len(tasks), 1, figsize=(8, 1.2 + 0.45 * height * max(1, len(bars) / len(tasks)) / 2), squeeze=False
    )
    colours = _colours(len(bars))
    for ax, task in zip(axes[:, 0], tasks, strict=True):
        group = [b for b in bars if b[1] == task]
        width = 0.8 / len(group)
        y = np.arange(len(subjects[task]))
        for i, (run, _, label, report) in enumerate(group):
            values = [report["subjects"].get(s, {}) for s in subjects[task]]
            acc = [v.get("accuracy", np.nan) for v in values]
            low, high = _error_bars(acc, [v.get("ci95") for v in values])
            ax.barh(
                y + i * width,
                acc,
                width,
                xerr=[low, high],
                color=colours[bars.index(group[i])],
                label=f"{run.name}: {label}",
                error_kw={"elinewidth": 0.8, "alpha": 0.6},
            )
        ax.set_yticks(y + width * (len(group) - 1) / 2, subjects[task])
        ax.set_xlim(0, 1)
        ax.set_title(f"{task}: accuracy by subject (bars: 95% interval)")
        ax.grid(axis="x", alpha=0.3)
        _legend(ax)
    fig.tight_layout()
    return fig


def _title_steps(*panels) -> None:
    """Each (axes, title) panel of a row: its title, steps along x, a grid; then the row's one
    legend beside its last panel."""
    for ax, title in panels:
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    _row_legend([ax for ax, _ in panels])


def _row_legend(axes) -> None:
    """One legend for panels side by side, beside the last (a legend beside each would lie on
    its neighbour): every label once."""
    unique = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            unique.setdefault(label, handle)
    if unique:
        axes[-1].legend(unique.values(), unique.keys(), loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7,
                        ncol=1 + (len(unique) - 1) // 24, borderaxespad=0.0, frameon=False)  # fmt: skip


def grpo_figure(runs: list[Run]):
    plt = _pyplot()
    grpo = [r for r in runs if reward_names(r) or step_series(r, "kl")]
    if not grpo:
        return None
    fig, (rewards, flat, kl, length) = plt.subplots(1, 4, figsize=(17, 4))
    styles = ["-", "--", ":", "-."]
    for run, colour, label in _by_stage(grpo):
        for i, name in enumerate(reward_names(run)):
            points = step_series(run, f"rewards/{name}/mean")
            rewards.plot(*zip(*points, strict=True), styles[i % len(styles)], color=colour, label=_label(label, name))
        # The groups whose answers the correctness reward scored alike, so their advantages are zero
        # and they teach nothing (NO_SIGNAL; TRL's frac_reward_zero_std for runs that lack it).
        flat_key = NO_SIGNAL if step_series(run, NO_SIGNAL) else "frac_reward_zero_std"
        for ax, key in ((flat, flat_key), (kl, "kl"), (length, "completions/mean_length")):
            points = step_series(run, key)
            if points:
                ax.plot(*zip(*points, strict=True), color=colour, label=label)
    _title_steps(
        (rewards, "mean reward per function"),
        (flat, "groups whose answers all scored alike (no signal)"),
        (kl, "KL to the reference"),
        (length, "completion length (tokens)"),
    )
    fig.tight_layout()
    return fig


def preference_figure(runs: list[Run]):
    """DPO and KTO: TRL's chosen (desirable) and rejected (undesirable) rewards, their margin and
    (DPO) the share of pairs ranked right, on the training data (solid) and the held-out data at
    each evaluation (dashed)."""
    plt = _pyplot()
    dpo = [r for r in runs if any("rewards/margins" in e or "eval_rewards/margins" in e for e in r.log_history)]
    if not dpo:
        return None
    fig, (rewards, margins, accuracy) = plt.subplots(1, 3, figsize=(14, 4))
    for run, colour in zip(runs, _colours(len(runs)), strict=True):
        if run not in dpo:
            continue
        for prefix, style, where in (("", "-", "train"), ("eval_", "--", "held-out")):
            series = {
                key: [(e["step"], e[prefix + key]) for e in run.log_history if prefix + key in e and "step" in e]
                for key in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies")
            }
            for ax, key, label in (
                (rewards, "rewards/chosen", "chosen"),
                (rewards, "rewards/rejected", "rejected"),
                (margins, "rewards/margins", "margin"),
                (accuracy, "rewards/accuracies", "accuracy"),
            ):
                if series[key]:
                    dashes = {"-": ":", "--": "-."}[style] if key == "rewards/rejected" else style
                    ax.plot(
                        *zip(*series[key], strict=True), dashes, color=colour, label=f"{run.name}: {label}, {where}"
                    )
    _title_steps(
        (rewards, "rewards of chosen and rejected answers"),
        (margins, "reward margin (chosen - rejected)"),
        (accuracy, "pairs ranked right (reward accuracy)"),
    )
    fig.tight_layout()
    return fig


THROUGHPUT = (("tokens_per_second", "tokens/s"), ("mfu", "MFU"), ("peak_memory_gib", "peak memory (GiB)"))


def throughput_figure(runs: list[Run]):
    plt = _pyplot()
    shown = [(key, title) for key, title in THROUGHPUT if any(step_series(r, key) for r in runs)]
    if not shown:
        return None
    fig, axes = plt.subplots(1, len(shown), figsize=(4.5 * len(shown), 3.6), squeeze=False)
    for ax, (key, _) in zip(axes[0], shown, strict=True):
        for run, colour, label in _by_stage(runs):
            points = step_series(run, key)
            if points:
                ax.plot(*zip(*points, strict=True), color=colour, label=label)
    _title_steps(*((ax, title) for ax, (_, title) in zip(axes[0], shown, strict=True)))
    fig.tight_layout()
    return fig


def calibration_reports(runs: list[Run], evaluations: list[Evaluation]) -> list[tuple[str, str, dict]]:
    """(label, task, calibration report) of each evaluation file and of each run's last
    evaluation: the report of the acc ranking (loglik) or of sampled answers' votes."""
    found = []
    sources = [(e.name, e.tasks) for e in evaluations]
    sources += [(f"{r.name} (step {max(r.reports)})", r.reports[max(r.reports)]) for r in runs if r.reports]
    for label, tasks in sources:
        for task, report in tasks.items():
            chosen = headline(report.get("calibration") or {})
            if chosen.get("n"):
                found.append((label, task, chosen))
    return found


def calibration_figure(runs: list[Run], evaluations: list[Evaluation]):
    """Per task: the reliability diagram (accuracy against confidence in 15 bins; the diagonal is
    a calibrated model) and the accuracy of the most confident answers against the share kept;
    every run and evaluation overlaid."""
    plt = _pyplot()
    reports = calibration_reports(runs, evaluations)
    tasks = list(dict.fromkeys(task for _, task, _ in reports))
    if not tasks:
        return None
    labels = list(dict.fromkeys(label for label, _, _ in reports))
    colours = dict(zip(labels, _colours(len(labels)), strict=True))
    fig, axes = plt.subplots(len(tasks), 2, figsize=(11, 4 * len(tasks)), squeeze=False)
    for (reliability, coverage), task in zip(axes, tasks, strict=True):
        reliability.plot([0, 1], [0, 1], ":", color="grey", label="calibrated")
        for label, name, found in reports:
            if name != task:
                continue
            filled = [b for b in found["bins"] if b["n"]]
            ece = f"ECE {found['ece']:.3f}"
            area = f"area {found['aurc_accuracy']:.3f}"
            reliability.plot([b["confidence"] for b in filled], [b["accuracy"] for b in filled], "o-",
                             color=colours[label], label=f"{label}: {ece}, {area}")  # fmt: skip
            coverage.plot(*zip(*found["coverage_curve"], strict=True), color=colours[label])
        reliability.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", ylabel="accuracy")
        reliability.set_title(f"{task}: reliability (15 bins)")
        coverage.set(xlim=(0, 1), ylim=(0, 1), xlabel="share of questions answered (most confident first)",
                     ylabel="accuracy")  # fmt: skip
        coverage.set_title(f"{task}: accuracy against coverage")
        for ax in (reliability, coverage):
            ax.grid(alpha=0.3)
        _row_legend([reliability, coverage])
    fig.tight_layout()
    return fig


FIGURES = (
    ("loss", "Loss", loss_figure),
    ("accuracy", "Multiple-choice accuracy", accuracy_figure),
    ("subjects", "Accuracy by subject, best and last evaluation", subjects_figure),
    ("grpo", "GRPO: rewards, KL, completion length", grpo_figure),
    ("preference", "DPO and KTO: rewards, margins and reward accuracy, training and held-out data", preference_figure),
    ("throughput", "Throughput and memory", throughput_figure),
)


def figures(runs: list[Run], evaluations: list[Evaluation]) -> dict[str, tuple[str, bytes]]:
    """{name: (title, PNG)} of every plot that the runs and evaluations have data for, the
    comparison first."""
    found = {}
    fig = comparison_figure(runs, evaluations)
    if fig is not None:
        found["comparison"] = (
            "Accuracy by run: seeds as points, the base model and the most common answer as lines",
            _png(fig),
        )
    for name, title, draw in FIGURES:
        fig = draw(runs) if runs else None
        if fig is not None:
            found[name] = (title, _png(fig))
    fig = calibration_figure(runs, evaluations)
    if fig is not None:
        found["calibration"] = ("Calibration: reliability and selective accuracy", _png(fig))
    return found
