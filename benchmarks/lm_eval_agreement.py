"""Compare a `medrecipes eval --output` file with an lm-eval run on the same questions.

Usage (see docs/evaluation.md for the two runs that produce the inputs):

    python benchmarks/lm_eval_agreement.py smollm2.json lm_eval_smollm2/

For each task both harnesses scored (medqa_4opt against medqa_4options_local, each
mmlu_medical subject against mmlu_<subject>_local) it prints the two accuracies, the number of
questions with the same prediction and the largest difference between per-answer
log-likelihoods, then each run's own timing.
"""

import argparse
import json
from pathlib import Path

from medrecipes.evaluation.loglik import lm_eval_agreement


def lm_eval_files(folder: Path) -> tuple[dict, dict[str, list[dict]]]:
    """lm-eval's results file and {task: logged samples} from its --output_path folder."""
    results = json.loads(sorted(folder.rglob("results_*.json"))[-1].read_text())
    samples = {}
    for path in sorted(folder.rglob("samples_*.jsonl")):
        task = path.name.removeprefix("samples_").rsplit("_", 1)[0]
        samples[task] = [json.loads(line) for line in path.read_text().splitlines()]
    return results, samples


def comparisons(ours: dict) -> list[tuple[str, dict, list[str]]]:
    """(label, our report or a part of it, the lm-eval tasks whose samples cover the same questions)."""
    found = []
    if "medqa_4opt" in ours:
        found.append(("medqa_4opt", ours["medqa_4opt"], ["medqa_4options_local"]))
    if "mmlu_medical" in ours:
        report = ours["mmlu_medical"]
        found.append(("mmlu_medical", report, [f"mmlu_{s}_local" for s in report["subjects"]]))
        for subject in report["subjects"]:
            part = {"predictions": [p for p in report["predictions"] if p["subject"] == subject]}
            found.append((f"mmlu_medical / {subject}", part, [f"mmlu_{subject}_local"]))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ours", type=Path, help="the JSON file of medrecipes eval --output")
    parser.add_argument("lm_eval", type=Path, help="the --output_path folder of lm_eval --log_samples")
    args = parser.parse_args()
    ours = json.loads(args.ours.read_text())
    results, samples = lm_eval_files(args.lm_eval)
    print("| task | n | accuracy, medrecipes | accuracy, lm-eval | identical predictions | max loglik difference |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, report, tasks in comparisons(ours["tasks"]):
        if not all(task in samples for task in tasks):
            continue
        # Subjects one by one: lm-eval numbers each subject task's samples from 0.
        parts = [
            {"predictions": [p for p in report["predictions"] if f"mmlu_{p['subject']}_local" == task]}
            for task in tasks
        ]
        parts = parts if len(tasks) > 1 else [report]
        agreements = [lm_eval_agreement(part, samples[task]) for part, task in zip(parts, tasks, strict=True)]
        n = sum(a["n"] for a in agreements)
        same = sum(a["identical_predictions"] for a in agreements)
        largest = max(a["max_loglik_difference"] for a in agreements)
        ours_acc = sum(p["predicted"] == p["answer"] for p in report["predictions"]) / n
        theirs_acc = sum(a["lm_eval_acc"] * a["n"] for a in agreements) / n
        print(f"| {label} | {n} | {ours_acc:.2%} | {theirs_acc:.2%} | {same} | {largest:.1e} |")
    print(f"\nmedrecipes eval: {ours['wall_time_s']:.0f} s (tasks, model and scoring, {ours['settings']['device']})")
    print(f"lm_eval: {float(results['total_evaluation_time_seconds']):.0f} s (its total_evaluation_time_seconds)")


if __name__ == "__main__":
    main()
