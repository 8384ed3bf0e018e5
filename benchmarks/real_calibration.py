"""How far real models' confidence can be trusted: calibration of SmolLM2-135M-Instruct and of
Gemma 3 270M at every stage of its real check, on MedQA, MedMCQA, PubMedQA and MMLU medical;
temperature scaling fitted on MedMCQA questions no stage trained on; and GRPO with an abstention
reward from the Gemma SFT model.

Usage:

    make real-check-calibration       # the Gemma check and its DPO stage first (finished stages skipped)
    python benchmarks/real_calibration.py [--questions 300]

Stages (each skipped when its result is there), under outputs/real-check-gemma3-270m/calibration:

  eval          every model x task in loglik mode: MedQA (the check's 300 questions), PubMedQA (its
                150 dev questions), MedMCQA (the first --questions of the dev file) and MMLU medical
                (--questions / 6 per subject); each report carries its calibration
  calibrate     `medrecipes calibrate` on a copy of the Gemma SFT model: a temperature fitted on
                MedMCQA dev questions after the first --questions, measured on the first ones
  grpo-abstain  recipes/gemma3_270m_grpo_abstain_pubmedqa.yaml, then PubMedQA dev in generate
                mode, the SFT model and the abstention model both asked with its system prompt

The report (benchmarks/results/real_calibration.json and .md) gives every calibration figure with
its 95% interval, the temperature's before and after, and the abstention rate with the SFT
model's accuracy on the questions abstained on against those answered.
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

from checks.stages import DATA, MEDQA, evaluated, medrecipes, read_jsonl, run, stage_runner, write_jsonl, write_results
from real_check import gguf_path
from real_check_gemma import DEFAULT_OUT, GEMMA
from real_preference_gemma import main as dpo_check

from medrecipes.evaluation.statistics import wilson_interval
from medrecipes.evaluation.tables import calibration_table

ABSTAIN_RECIPE = "recipes/gemma3_270m_grpo_abstain_pubmedqa.yaml"
SYSTEM_PROMPT = "Answer with the letter of the best option. If you do not know, answer: I don't know."
MEDMCQA = DATA / "medmcqa" / "medmcqa_dev_single_2816.jsonl"
MMLU = DATA / "mmlu_medical"
TASKS = ("medqa_4opt", "medmcqa", "pubmedqa", "mmlu_medical")


def models(out: Path) -> dict[str, Path]:
    return {
        "smollm2-135m-instruct": gguf_path(),
        "gemma3-270m base": GEMMA,
        "gemma3-270m cpt": out / "cpt" / "final",
        "gemma3-270m sft": out / "sft-merged",
        "gemma3-270m grpo": out / "grpo" / "final",
        "gemma3-270m dpo": out / "dpo-merged",
    }


def task_data(out: Path, questions: int) -> dict[str, list[str]]:
    """The --data (or --data-dir) and --limit arguments of each task: the same questions for every model."""
    folder = out / "calibration" / "data"
    if not (folder / "medmcqa_eval.jsonl").exists():
        rows = read_jsonl(MEDMCQA)
        write_jsonl(folder / "medmcqa_eval.jsonl", rows[:questions])
        write_jsonl(folder / "medmcqa_fit.jsonl", rows[questions : 3 * questions])
    return {
        "medqa_4opt": ["--data", f"medqa_4opt={out / 'data' / 'medqa_300.jsonl'}"],
        "medmcqa": ["--data", f"medmcqa={folder / 'medmcqa_eval.jsonl'}"],
        "pubmedqa": ["--data", f"pubmedqa={out / 'data' / 'pubmedqa_dev.json'}"],
        "mmlu_medical": ["--data_dir", str(DATA), "--limit", str(max(1, questions // 6))],
    }


def evaluate_all(out: Path, questions: int) -> None:
    arguments = task_data(out, questions)
    results = out / "calibration" / "eval"
    for name, model in models(out).items():
        for task in TASKS:
            evaluated(results / f"{name.replace(' ', '-')}-{task}.json", model, "--tasks", task, *arguments[task],
                      "--mode", "loglik", "--batch_size", "4")  # fmt: skip


def calibrate(out: Path) -> None:
    """Temperature scaling of a copy of the SFT model (the check's own folder stays as it was)."""
    copy = out / "calibration" / "sft-calibrated"
    if not copy.exists():
        shutil.copytree(out / "sft-merged", copy, ignore=shutil.ignore_patterns(".medrecipes*"))
    data = out / "calibration" / "data"
    medrecipes("calibrate", "--model", str(copy), "--task", "medmcqa", "--dev", str(data / "medmcqa_fit.jsonl"),
               "--held-out", str(data / "medmcqa_eval.jsonl"), "--batch-size", "4", "--overwrite")  # fmt: skip


def abstain(out: Path) -> None:
    run(sys.executable, "recipes/grpo.py", ABSTAIN_RECIPE)
    for name, model in (("sft", out / "sft-merged"), ("grpo-abstain", out / "grpo-abstain" / "final")):
        evaluated(out / "calibration" / "eval" / f"abstain-{name}-pubmedqa-generate.json", model, "--tasks",
                  "pubmedqa", "--data", f"pubmedqa={out / 'data' / 'pubmedqa_dev.json'}", "--mode", "generate",
                  "--system_prompt", SYSTEM_PROMPT, "--batch_size", "8")  # fmt: skip


def task_report(path: Path) -> dict:
    return next(iter(json.loads(path.read_text())["tasks"].values()))


def abstention_figures(out: Path) -> dict | None:
    """The abstention model's abstention rate on PubMedQA dev, and the SFT model's accuracy (same
    prompt) on the questions abstained on against those answered, with Wilson intervals."""
    folder = out / "calibration" / "eval"
    paths = {n: folder / f"abstain-{n}-pubmedqa-generate.json" for n in ("sft", "grpo-abstain")}
    if not all(p.exists() for p in paths.values()):
        return None
    sft, trained = (task_report(p) for p in paths.values())
    right = {p["id"]: p["predicted"] == p["answer"] for p in sft["predictions"]}
    abstained = [p["id"] for p in trained["predictions"] if p.get("abstained")]
    answered = [p["id"] for p in trained["predictions"] if not p.get("abstained")]

    def accuracy(ids: list[str]) -> dict:
        hits = sum(right[i] for i in ids)
        return {
            "n": len(ids),
            "accuracy": hits / len(ids) if ids else None,
            "ci95": list(wilson_interval(hits, len(ids))),
        }

    n = len(trained["predictions"])
    return {
        "abstained": {
            "n": len(abstained),
            "rate": len(abstained) / n,
            "ci95": list(wilson_interval(len(abstained), n)),
        },
        "sft_accuracy_where_abstained": accuracy(abstained),
        "sft_accuracy_where_answered": accuracy(answered),
        "sft": {k: sft[k] for k in ("accuracy", "ci95", "abstained", "unparseable")},
        "grpo_abstain": {k: trained[k] for k in ("accuracy", "ci95", "abstained", "unparseable")},
    }


def markdown(report: dict) -> str:
    lines = ["# Calibration of real models (make real-check-calibration)", ""]
    rows = [(f"{model} / {task}", variant, found) for model, tasks in report["models"].items()
            for task, variants in tasks.items() for variant, found in variants.items()]  # fmt: skip
    lines += [calibration_table(rows), ""]
    t = report.get("temperature")
    if t:
        held = t["held_out"]
        lines += [
            f"Temperature scaling of the Gemma SFT model: T = {t['temperature']:.3f}, fitted on {t['fitted_on']['questions']} "
            f"MedMCQA dev questions (NLL {t['fitted_on']['nll_before']:.3f} -> {t['fitted_on']['nll_after']:.3f}); "
            f"on {held['questions']} held-out MedMCQA questions ECE {held['before']['ece']:.3f} -> {held['after']['ece']:.3f}, "
            f"NLL {held['before']['nll']:.3f} -> {held['after']['nll']:.3f}, Brier {held['before']['brier']:.3f} -> "
            f"{held['after']['brier']:.3f}.",
            "",
        ]
    a = report.get("abstention")
    if a:
        ab, where, answered = a["abstained"], a["sft_accuracy_where_abstained"], a["sft_accuracy_where_answered"]

        def acc(x: dict) -> str:
            return (
                "none"
                if x["accuracy"] is None
                else f"{x['accuracy']:.1%} ({x['ci95'][0]:.1%}-{x['ci95'][1]:.1%}, n={x['n']})"
            )

        lines += [
            f'GRPO with the abstention reward (0.25 for "I don\'t know"): abstained on {ab["n"]} of the PubMedQA dev '
            f"questions ({ab['rate']:.1%}, {ab['ci95'][0]:.1%}-{ab['ci95'][1]:.1%}); its accuracy "
            f"{a['grpo_abstain']['accuracy']:.1%}, the SFT model's {a['sft']['accuracy']:.1%} with the same prompt "
            f"(SFT abstained on {a['sft']['abstained']:.1%}). The SFT model's accuracy on the questions abstained on: "
            f"{acc(where)}; on those answered: {acc(answered)}.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=300, help="MedMCQA and MMLU medical questions evaluated")
    args = parser.parse_args(argv)
    dpo_check([])  # the Gemma check and its DPO stage, each finished stage skipped
    out = Path(DEFAULT_OUT)
    for path in (MEDMCQA, MMLU, MEDQA):
        if not path.exists():
            sys.exit(f"real check: {path} is missing; it needs ../shared/data (see its README)")
    stage, _ = stage_runner(out)
    stage("calibration-eval", out / "calibration" / "eval" / "done", lambda: (
        evaluate_all(out, args.questions), (out / "calibration" / "eval" / "done").touch()))  # fmt: skip
    stage("calibrate", out / "calibration" / "sft-calibrated" / "calibration.json", lambda: calibrate(out))
    stage("grpo-abstain", out / "calibration" / "eval" / "abstain-grpo-abstain-pubmedqa-generate.json",
          lambda: abstain(out))  # fmt: skip
    reports = {
        name: {
            task: task_report(out / "calibration" / "eval" / f"{name.replace(' ', '-')}-{task}.json") for task in TASKS
        }
        for name in models(out)
    }
    temperature = out / "calibration" / "sft-calibrated" / "calibration.json"
    report = {
        "models": {m: {t: {"acc": r["calibration"]["acc"]} for t, r in tasks.items()} for m, tasks in reports.items()},
        "accuracy": {
            m: {t: {k: r[k] for k in ("accuracy", "ci95", "n")} for t, r in tasks.items()}
            for m, tasks in reports.items()
        },
        "temperature": json.loads(temperature.read_text()) if temperature.exists() else None,
        "abstention": abstention_figures(out),
    }
    write_results("real_calibration", report, markdown(report))
    return report


if __name__ == "__main__":
    main()
