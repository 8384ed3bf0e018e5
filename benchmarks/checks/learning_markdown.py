"""The learning check's report as Markdown (benchmarks/results/real_learning_gemma3_270m.md): each
stage's figures seed by seed with their intervals, the claims' paired differences, the targets."""

from checks.learning_recipes import LABELS


def cell(figure: dict) -> str:
    lo, hi = figure["ci95"]
    return f"{figure['accuracy']:.1%} ({lo:.1%}-{hi:.1%}), macro-F1 {figure['macro_f1']:.3f}"


def summary(stage: dict) -> str:
    runs = len(stage["seeds"])
    return (
        f"mean {stage['accuracy']:.1%}, worst {stage['worst']:.1%}, spread {stage['spread']:.1%}, "
        f"mean macro-F1 {stage['macro_f1']:.3f} ({runs} seed{'s' if runs != 1 else ''})"
    )


def seed_label(seed: int | None) -> str:
    return "" if seed is None else f"s{seed}: "


def pooled_words(pool: dict) -> str:
    return f"{pool['mean']:+.1%} ({pool['ci95'][0]:+.1%} to {pool['ci95'][1]:+.1%}, {pool['seeds']} seeds)"


def run_words(entry: dict) -> str:
    """A seed's learning facts, as the table shows them: the questions its filter kept, its steps with a signal."""
    words = f", {entry['questions']} of {entry['questions_measured']} questions kept" if "questions" in entry else ""
    if "signal_steps" in entry:
        words += f", signal in {entry['signal_steps'][0]} of {entry['signal_steps'][1]} steps"
    return words


def differences(claim: dict) -> str:
    each = "; ".join(
        f"{seed_label(p['seed'])}{p['difference']:+.1%} ({p['ci95'][0]:+.1%} to {p['ci95'][1]:+.1%})"
        for p in claim["seeds"]
    )
    holds = "holds in every seed" if claim["holds"] else "not in every seed"
    return f"mean {claim['difference']:+.1%}; {each}; {holds}"


def markdown(report: dict) -> str:
    n = report["stages"]["always yes"]["n"]
    lines = [
        "# Gemma 3 270M learns PubMedQA (make real-check-learning)",
        "",
        f"PubMedQA dev, {n} questions (seed 42 split of the 500 outside the test split), generate mode (greedy) "
        f"unless marked loglik, trained on {report.get('device', 'cpu')}, seeds {report['seeds']}; each run keeps "
        "the checkpoint with the best accuracy on the validation questions (50 of the training 350, never dev). "
        "Reasoning-free figures give the model the abstract's conclusion and are not PubMedQA's standard "
        "(reasoning-required) score.",
        "",
        "| setting | stage | each seed: accuracy (95% CI), macro-F1, said yes/no/maybe/none | mean | worst | spread "
        "| mean macro-F1 |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for name, figure in report["stages"].items():
        each = "<br>".join(
            seed_label(e["seed"]) + cell(e)
            + (f" [step {e['selected_checkpoint']['step']}]" if e.get("selected_checkpoint") else "")
            + ", said " + "/".join(str(e["predicted"][label]) for label in [*LABELS.values(), "none"])
            + run_words(e)
            for e in figure["seeds"]
        )  # fmt: skip
        if "pooled_paired" in figure:
            each += f"<br>from {figure['from']}, pooled: {pooled_words(figure['pooled_paired'])}"
        lines.append(
            f"| {figure.get('setting') or 'both'} | {name} | {each} | {figure['accuracy']:.1%} | {figure['worst']:.1%} "
            f"| {figure['spread']:.1%} | {figure['macro_f1']:.3f} |"
        )
    lines += ["", "| claim | paired accuracy difference, each seed (95% CI) |", "|---|---|"]
    lines += [f"| {name} | {differences(c)} |" for name, c in report["claims"].items()]
    lines += ["", "| target | met | measured |", "|---|---|---|"]
    lines += [f"| {t['target']} | {'met' if t['met'] else 'not met'} | {t['figure']} |" for t in report["targets"]]
    if report.get("questions_per_stage"):
        lines += ["", "| seed | SFT's training questions | GRPO's (its part, before the pass rate) | both |",
                  "|---|---:|---:|---:|"]  # fmt: skip
        lines += [
            f"| {s} | {n['sft']} | {n['grpo']} | {n['shared']} |" for s, n in report["questions_per_stage"].items()
        ]
    lines += ["", "| stage | wall time |", "|---|---:|"]
    lines += [f"| {name} | {seconds / 60:.1f} min |" for name, seconds in report["seconds"].items()]
    return "\n".join(lines) + "\n"
