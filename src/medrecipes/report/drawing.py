"""What the plots of `medrecipes report` share: matplotlib's Agg backend (files, no display), a
figure as PNG bytes, a colour per run, the runs of one stage (names that differ only by a seed)
drawn as one, 95% intervals as error bars, and legends beside the axes, never on them."""

import io
import re
from collections import Counter

from medrecipes.report.runs import Run


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    return plt


def png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    pyplot().close(fig)
    return buffer.getvalue()


def palette(count: int) -> list:
    cycle = pyplot().rcParams["axes.prop_cycle"].by_key()["color"]
    return [cycle[i % len(cycle)] for i in range(count)]


def by_stage(runs: list[Run]) -> list[tuple[Run, str, str]]:
    """Each run with its stage's colour and its label, the runs of one stage (names that differ
    only by a seed) sharing both: "sft (3 seeds)"; the label is "_" after a stage's first run,
    which matplotlib leaves out of a legend, so a legend has an entry a stage."""
    stages = Counter(stage_of(r.name) for r in runs)
    colours = dict(zip(stages, palette(len(stages)), strict=True))
    found, seen = [], set()
    for run in runs:
        stage = stage_of(run.name)
        label = run.name if stages[stage] == 1 else f"{stage} ({stages[stage]} seeds)"
        found.append((run, colours[stage], "_" if stage in seen else label))
        seen.add(stage)
    return found


def run_label(label: str, what: str) -> str:
    return label if label == "_" else f"{label}: {what}"


def error_bars(accuracy: list[float], intervals: list) -> tuple[list[float], list[float]]:
    """matplotlib's error bars (the distance below and above each value) of 95% intervals; a
    bound that rounding put a hair past its value (1.0 against 0.9999999) counts as 0."""
    low = [max(0.0, a - ci[0]) if ci else 0.0 for a, ci in zip(accuracy, intervals, strict=True)]
    high = [max(0.0, ci[1] - a) if ci else 0.0 for a, ci in zip(accuracy, intervals, strict=True)]
    return low, high


def legend_beside(ax) -> None:
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


def title_steps(*panels) -> None:
    """Each (axes, title) panel of a row: its title, steps along x, a grid; then the row's one
    legend beside its last panel."""
    for ax, title in panels:
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    row_legend([ax for ax, _ in panels])


def row_legend(axes) -> None:
    """One legend for panels side by side, beside the last (a legend beside each would lie on
    its neighbour): every label once."""
    unique = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            unique.setdefault(label, handle)
    if unique:
        axes[-1].legend(unique.values(), unique.keys(), loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7,
                        ncol=1 + (len(unique) - 1) // 24, borderaxespad=0.0, frameon=False)  # fmt: skip
