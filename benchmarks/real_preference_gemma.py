"""DPO against GRPO from the same start, in about the same wall time: Gemma 3 270M's SFT model of
the real check (PubMedQA), trained with DPO on pairs of its own answers, evaluated on the same
PubMedQA dev questions as every stage of the check.

Usage:

    make real-check-dpo                   # the real check first (each finished stage skipped)
    python benchmarks/real_preference_gemma.py [--train-questions 100] [--samples 4]

Stages (in the real check's folder; each skipped when its result is there):

  pairs-train  `medrecipes pairs --model sft-merged`: 4 sampled answers to each of the first
               --train-questions training questions (the split is already shuffled), a right one
               chosen against a wrong one; questions always right or always wrong left out
  pairs-dev    the same for every dev question: the held-out pairs, cut to a multiple of the eval
               batch so that TRL's mean over batches is the share over pairs
  dpo          recipes/dpo.py recipes/gemma3_270m_dpo_pubmedqa.yaml (LoRA; the reference is the
               SFT model, adapter off), evaluated once at the end on the held-out pairs
  eval-dpo     merged, then evaluated as the check's stages are (PubMedQA dev generate and loglik,
               MedQA loglik, held-out abstract perplexity)

The report (benchmarks/results/real_preference_gemma3_270m.json and .md) gives the held-out reward
accuracy with its Wilson interval, dev accuracy and macro-F1 of SFT, GRPO and DPO with theirs, and
each method's wall time (DPO's pair sampling counted, as GRPO's generation is).
"""

import argparse
import json
import sys
from pathlib import Path

from checks.stages import medrecipes, read_jsonl, run, stage_runner, write_jsonl, write_results
from real_check_gemma import DEFAULT_OUT, cell, evaluate, result
from real_check_gemma import main as real_check

from medrecipes.evaluation.statistics import wilson_interval

RECIPE = "recipes/gemma3_270m_dpo_pubmedqa.yaml"
EVAL_BATCH = 8  # the recipe's per_device_eval_batch_size


def sample_pairs(out: Path, questions: Path, pairs: Path, samples: int, seed: int) -> None:
    medrecipes("pairs", "--mcq", str(questions), "--model", str(out / "sft-merged"), "--samples", str(samples),
               "--seed", str(seed), "--out", str(pairs))  # fmt: skip


def stage_pairs_train(out: Path, count: int, samples: int, seed: int) -> None:
    rows = json.loads((out / "data" / "pubmedqa_train.json").read_text(encoding="utf-8"))
    subset = out / "preference" / "train_questions.json"
    subset.parent.mkdir(exist_ok=True)
    subset.write_text(json.dumps(dict(list(rows.items())[:count])), encoding="utf-8")
    sample_pairs(out, subset, out / "preference" / "pairs_train.jsonl", samples, seed)


def stage_pairs_dev(out: Path, samples: int, seed: int) -> None:
    every = out / "preference" / "pairs_dev_all.jsonl"
    sample_pairs(out, out / "data" / "pubmedqa_dev.json", every, samples, seed)
    pairs = read_jsonl(every)
    write_jsonl(out / "preference" / "pairs_dev.jsonl", pairs[: len(pairs) // EVAL_BATCH * EVAL_BATCH])


def pair_rewards(out: Path, beta: float = 0.1) -> list[float]:
    """DPO's implicit reward margin of each held-out pair, beta * ((log pi(chosen) - log ref(chosen))
    - (log pi(rejected) - log ref(rejected))), with the merged DPO model as pi and the SFT model as
    the reference; each answer scored after its prompt as the chat template renders them. TRL logs
    only a mean over batches, from which the pairs ranked right cannot be counted."""
    from medrecipes.evaluation.commands import load_for_evaluation
    from medrecipes.evaluation.loglik import continuation_logliks

    pairs = read_jsonl(out / "preference" / "pairs_dev.jsonl")
    logps = {}
    for name, folder in (("policy", out / "dpo-merged"), ("reference", out / "sft-merged")):
        model, tokenizer = load_for_evaluation(str(folder))
        requests = []
        for pair in pairs:
            context = tokenizer.apply_chat_template(pair["prompt"], add_generation_prompt=True, tokenize=False)
            for key in ("chosen", "rejected"):
                whole = tokenizer.apply_chat_template(pair["prompt"] + pair[key], tokenize=False)
                requests.append((context, whole[len(context) :]))
        logps[name] = [loglik for loglik, _ in continuation_logliks(model, tokenizer, requests, batch_size=4)]
    gain = [p - r for p, r in zip(logps["policy"], logps["reference"], strict=True)]
    return [beta * (gain[2 * i] - gain[2 * i + 1]) for i in range(len(pairs))]


def held_out_reward_accuracy(out: Path) -> dict:
    """The share of held-out pairs whose implicit reward ranks the chosen answer first, with its
    Wilson interval, beside TRL's own logged figures of the evaluation after training."""
    cache = out / "preference" / "pair_rewards.json"
    if not cache.exists():
        cache.write_text(json.dumps(pair_rewards(out)))
    margins = json.loads(cache.read_text())
    hits, n = sum(m > 0 for m in margins), len(margins)
    trl = json.loads((out / "dpo" / "eval_results.json").read_text())  # the evaluation after training
    return {
        "accuracy": hits / n,
        "n": n,
        "ci95": list(wilson_interval(hits, n)),
        "margin": sum(margins) / n,
        "trl_accuracy": trl["eval_rewards/accuracies"],
        "trl_margin": trl["eval_rewards/margins"],
    }


def pair_counts(out: Path) -> dict:
    """How many questions gave pairs, and how many were left out, from the files' records."""
    counts = {}
    for name in ("pairs_train.jsonl", "pairs_dev_all.jsonl"):
        record = out / "preference" / f".{name}.medrecipes.json"
        counts[name] = {
            "pairs": len(read_jsonl(out / "preference" / name)),
            "how": json.loads(record.read_text()).get("about") if record.exists() else None,
        }
    return counts


def markdown(report: dict) -> str:
    reward = report["reward_accuracy"]
    lines = [
        "# Gemma 3 270M: DPO on its own answers against GRPO, from the same SFT model (make real-check-dpo)",
        "",
        f"Held-out reward accuracy (DPO's implicit reward ranks the right answer first) on {reward['n']} dev "
        f"pairs: {cell(reward)}; mean margin {reward['margin']:.3f} (TRL's logged mean over batches: accuracy "
        f"{reward['trl_accuracy']:.1%}, margin {reward['trl_margin']:.3f}). Target: at least 65%, the interval "
        "clear of 50%: "
        f"{'met' if reward['accuracy'] >= 0.65 and reward['ci95'][0] > 0.5 else 'not met'}.",
        "",
        "| model | PubMedQA dev generate acc | macro-F1 | unparseable | PubMedQA dev loglik acc | MedQA 300 loglik acc | wall time |",
        "|---|---|---|---|---|---|---:|",
    ]
    for stage, figures in report["stages"].items():
        generated = figures.get("pubmedqa-generate")
        seconds = report["seconds"].get(stage)
        lines.append(
            f"| {stage} | {cell(generated)} | {cell(generated, 'macro_f1', False)} "
            f"| {generated['unparseable']:.1%} | {cell(figures.get('pubmedqa-loglik'))} "
            f"| {cell(figures.get('medqa_4opt-loglik'))} | {f'{seconds / 60:.1f} min' if seconds else ''} |"
        )
    lines += ["", "Pairs:", ""]
    lines += [f"- {name}: {c['pairs']} pairs; {c['how']}" for name, c in report["pairs"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-questions", type=int, default=100, help="training questions sampled for pairs")
    parser.add_argument("--samples", type=int, default=4, help="answers sampled per question")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    real_check([])  # the check's stages, each skipped when done: data, the SFT model, GRPO and their evaluations
    out = Path(DEFAULT_OUT)
    stage, seconds = stage_runner(out)
    preference = out / "preference"
    stage("pairs-dev", preference / "pairs_dev.jsonl", lambda: stage_pairs_dev(out, args.samples, args.seed))
    stage("pairs-train", preference / "pairs_train.jsonl",
          lambda: stage_pairs_train(out, args.train_questions, args.samples, args.seed))  # fmt: skip
    stage("dpo", out / "dpo" / "final", lambda: run(sys.executable, "recipes/dpo.py", RECIPE), ("dpo", RECIPE))
    stage("eval-dpo", out / "perplexity" / "dpo.json", lambda: (
        medrecipes("merge-lora", str(out / "dpo" / "final"), str(out / "dpo-merged")),
        evaluate(out, out / "dpo-merged", "dpo"),
    ))  # fmt: skip
    stages = {}
    for name in ("sft", "grpo", "dpo"):
        stages[name] = {
            key: {k: v for k, v in (result(out, name, key) or {}).items() if k != "predictions"}
            for key in ("pubmedqa-generate", "pubmedqa-loglik", "medqa_4opt-loglik")
        }
    report = {
        "reward_accuracy": held_out_reward_accuracy(out),
        "stages": stages,
        "pairs": pair_counts(out),
        # DPO's time is its pair sampling and its training; the dpo stage's wall time also holds the
        # evaluation of the held-out pairs after training, which GRPO's stage has no counterpart of.
        "seconds": {
            "sft": seconds.get("sft"),
            "grpo": seconds.get("grpo"),
            "dpo": seconds["pairs-train"]
            + json.loads((out / "dpo" / "train_results.json").read_text())["train_runtime"],
        },
        "seconds_by_stage": {k: seconds[k] for k in ("pairs-train", "pairs-dev", "dpo", "eval-dpo") if k in seconds},
    }
    write_results("real_preference_gemma3_270m", report, markdown(report))
    return report


if __name__ == "__main__":
    main()
