"""The plots of `medrecipes report`, drawn with matplotlib (its Agg backend: files, no display),
one colour per run; each is drawn only where some run has what it shows. The first, the
comparison, is what a reader comes for: each evaluation's accuracy with its interval, the runs
of one stage on one row (their seeds as its points), the baselines as lines. Legends sit
outside the axes, so that no number of runs covers a plot."""

from medrecipes.evaluation.calibration import headline
from medrecipes.report.comparison import comparison_figure
from medrecipes.report.drawing import (
    by_stage,
    error_bars,
    legend_beside,
    palette,
    png,
    pyplot,
    row_legend,
    run_label,
    title_steps,
)
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


def loss_figure(runs: list[Run]):
    plt = pyplot()
    if not any(training_logs(r) or eval_loss_series(r) for r in runs):
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    token_axes = [tokens_at(r) for r in runs]
    by_tokens = all(at is not None for r, at in zip(runs, token_axes, strict=True) if training_logs(r))
    styles = ["--", ":", "-."]
    for (run, colour, label), at in zip(by_stage(runs), token_axes, strict=True):
        x = at if by_tokens and at is not None else (lambda step: step)
        train = [(x(e["step"]), e["loss"]) for e in training_logs(run)]
        if train:
            ax.plot(*zip(*train, strict=True), color=colour, label=run_label(label, "train"))
        for i, (name, points) in enumerate(eval_loss_series(run).items()):
            xs, ys = zip(*[(x(s), v) for s, v in points], strict=True)
            ax.plot(
                xs, ys, styles[i % len(styles)], marker="o", ms=3, color=colour, label=run_label(label, f"eval {name}")
            )
    ax.set_xlabel("tokens seen" if by_tokens else "step")
    ax.set_ylabel("loss")
    ax.set_title("Training and evaluation loss")
    ax.grid(alpha=0.3)
    legend_beside(ax)
    return fig


def accuracy_figure(runs: list[Run]):
    plt = pyplot()
    if not any(accuracy_series(r) for r in runs):
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    markers = "osD^v<>"
    for run, colour, label in by_stage(runs):
        for i, (name, points) in enumerate(accuracy_series(run).items()):
            steps = [p[0] for p in points]
            ax.plot(
                steps,
                [p[1] for p in points],
                marker=markers[i % len(markers)],
                color=colour,
                label=run_label(label, name),
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
    legend_beside(ax)
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

    plt = pyplot()
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
    colours = palette(len(bars))
    for ax, task in zip(axes[:, 0], tasks, strict=True):
        group = [b for b in bars if b[1] == task]
        width = 0.8 / len(group)
        y = np.arange(len(subjects[task]))
        for i, (run, _, label, report) in enumerate(group):
            values = [report["subjects"].get(s, {}) for s in subjects[task]]
            acc = [v.get("accuracy", np.nan) for v in values]
            low, high = error_bars(acc, [v.get("ci95") for v in values])
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
        legend_beside(ax)
    fig.tight_layout()
    return fig


def grpo_figure(runs: list[Run]):
    """GRPO's panels that its runs logged (a run without rewards logged draws no empty one): the
    mean reward per function, the groups with no signal, the KL, the completion length."""
    plt = pyplot()
    grpo = [r for r in runs if reward_names(r) or step_series(r, "kl")]
    if not grpo:
        return None

    def no_signal(run: Run) -> str:
        # The groups whose answers the correctness reward scored alike, so their advantages are zero
        # and they teach nothing (NO_SIGNAL; TRL's frac_reward_zero_std for runs that lack it).
        return NO_SIGNAL if step_series(run, NO_SIGNAL) else "frac_reward_zero_std"

    # Each panel: the series a run logged for it, (key, what it is where a panel holds several), and its title.
    panels = [
        (lambda run: [(f"rewards/{name}/mean", name) for name in reward_names(run)], "mean reward per function"),
        (lambda run: [(no_signal(run), None)], "groups whose answers all scored alike (no signal)"),
        (lambda run: [("kl", None)], "KL to the reference"),
        (lambda run: [("completions/mean_length", None)], "completion length (tokens)"),
    ]
    panels = [
        (series, title) for series, title in panels if any(step_series(r, k) for r in grpo for k, _ in series(r))
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.25 * len(panels), 4), squeeze=False)
    styles = ["-", "--", ":", "-."]
    for run, colour, label in by_stage(grpo):
        for ax, (series, _) in zip(axes[0], panels, strict=True):
            for i, (key, what) in enumerate(series(run)):
                if points := step_series(run, key):
                    ax.plot(*zip(*points, strict=True), styles[i % len(styles)], color=colour,
                            label=run_label(label, what) if what else label)  # fmt: skip
    title_steps(*((ax, title) for ax, (_, title) in zip(axes[0], panels, strict=True)))
    fig.tight_layout()
    return fig


def preference_figure(runs: list[Run]):
    """DPO and KTO: TRL's chosen (desirable) and rejected (undesirable) rewards, their margin and
    (DPO) the share of pairs ranked right, on the training data (solid) and the held-out data at
    each evaluation (dashed)."""
    plt = pyplot()
    dpo = [r for r in runs if any("rewards/margins" in e or "eval_rewards/margins" in e for e in r.log_history)]
    if not dpo:
        return None
    fig, (rewards, margins, accuracy) = plt.subplots(1, 3, figsize=(14, 4))
    for run, colour in zip(runs, palette(len(runs)), strict=True):
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
    title_steps(
        (rewards, "rewards of chosen and rejected answers"),
        (margins, "reward margin (chosen - rejected)"),
        (accuracy, "pairs ranked right (reward accuracy)"),
    )
    fig.tight_layout()
    return fig


THROUGHPUT = (("tokens_per_second", "tokens/s"), ("mfu", "MFU"), ("peak_memory_gib", "peak memory (GiB)"))


def throughput_figure(runs: list[Run]):
    plt = pyplot()
    shown = [(key, title) for key, title in THROUGHPUT if any(step_series(r, key) for r in runs)]
    if not shown:
        return None
    fig, axes = plt.subplots(1, len(shown), figsize=(4.5 * len(shown), 3.6), squeeze=False)
    for ax, (key, _) in zip(axes[0], shown, strict=True):
        for run, colour, label in by_stage(runs):
            points = step_series(run, key)
            if points:
                ax.plot(*zip(*points, strict=True), color=colour, label=label)
    title_steps(*((ax, title) for ax, (_, title) in zip(axes[0], shown, strict=True)))
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
    plt = pyplot()
    reports = calibration_reports(runs, evaluations)
    tasks = list(dict.fromkeys(task for _, task, _ in reports))
    if not tasks:
        return None
    labels = list(dict.fromkeys(label for label, _, _ in reports))
    colours = dict(zip(labels, palette(len(labels)), strict=True))
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
        row_legend([reliability, coverage])
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
            png(fig),
        )
    for name, title, draw in FIGURES:
        fig = draw(runs) if runs else None
        if fig is not None:
            found[name] = (title, png(fig))
    fig = calibration_figure(runs, evaluations)
    if fig is not None:
        found["calibration"] = ("Calibration: reliability and selective accuracy", png(fig))
    return found
