"""Does the GRPO loop learn? Held-out accuracy on a generated task, before and after GRPO.

Usage:

    python benchmarks/learn_check.py            # make learn-check; CPU, a few minutes
    python benchmarks/learn_check.py --small --out /tmp/lc --json   # the quicker variant the tests run

The task is generated here, small enough for a 2-layer model to learn on a CPU: each question
names a finding ("presents with jaundice") that points at one of four organs by a fixed rule
(jaundice -> liver), sixteen findings in all, and the options are the four organs. The SFT
warm-up (recipes/learn_check_sft.yaml) teaches the rule for half of the findings; the other
half appear in it with every letter equally often, so the warmed-up model answers them in the
right form but picks each letter about a quarter of the time. GRPO learns only from groups of
samples whose rewards differ: a model that is always wrong, or always right, gives it nothing,
and a random model never answers in form at all. GRPO (recipes/learn_check_grpo.yaml) then
trains on questions about all sixteen findings, told only whether each sampled letter was
right. Both models answer the same 200 held-out questions greedily; the script prints the
accuracy overall and for each half of the findings.

Both recipes read their data and models under outputs/learn-check; with --out the script
runs copies of them that point at that folder instead.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = "outputs/learn-check"
RECIPES = ("recipes/learn_check_sft.yaml", "recipes/learn_check_grpo.yaml")
SMALL_GRPO_STEPS = 30

# The rule: a finding points at one organ.
FINDINGS = {
    "jaundice": "liver",
    "ascites": "liver",
    "spider naevi": "liver",
    "an enlarged liver edge": "liver",
    "haematuria": "kidney",
    "oliguria": "kidney",
    "frothy urine": "kidney",
    "flank pain": "kidney",
    "a productive cough": "lung",
    "haemoptysis": "lung",
    "wheeze": "lung",
    "pleuritic pain": "lung",
    "chest pain on exertion": "heart",
    "a new murmur": "heart",
    "palpitations": "heart",
    "ankle oedema": "heart",
}
ORGANS = sorted(set(FINDINGS.values()))
ADULTS, CHILDREN = ["man", "woman"], ["boy", "girl"]


# The warm-up teaches the rule for half of the findings. The other half appear in it too,
# as often with each letter: the model learns to answer them in form but gives each letter a
# quarter of its samples, so GRPO's groups on them get different rewards to learn from.
WARMUP_FINDINGS = [f for i, f in enumerate(FINDINGS) if i % 4 < 2]


def make_questions(n: int, seed: int, prefix: str, warmup: bool = False) -> list[dict]:
    """`n` questions in the project's MCQ layout, each organ equally often; with `warmup`,
    a quarter are on findings outside WARMUP_FINDINGS and carry the letters in turn."""
    rng = random.Random(seed)
    new_findings = [f for f in FINDINGS if f not in WARMUP_FINDINGS]
    rows = []
    for i in range(n):
        organ = ORGANS[i % 4]
        new = (i // 4) % 4 == 3 if warmup else rng.random() < 0.5
        finding = rng.choice([f for f in FINDINGS if FINDINGS[f] == organ and (f in WARMUP_FINDINGS) != new])
        answer = "ABCD"[ORGANS.index(organ)]
        if warmup and new:  # every new finding with every letter in turn
            k = (i // 16) * 4 + i % 4
            finding, answer = new_findings[k % len(new_findings)], "ABCD"[(k // len(new_findings)) % 4]
        adult = rng.random() < 0.7
        age = rng.randint(18, 85) if adult else rng.randint(4, 17)
        patient = rng.choice(ADULTS if adult else CHILDREN)
        rows.append(
            {
                "id": f"{prefix}-{i:04d}",
                "question": f"A {age}-year-old {patient} presents with {finding}. Which organ is most likely affected?",
                "options": dict(zip("ABCD", ORGANS, strict=True)),
                "answer": answer,
                "subject": "new finding" if new else "warm-up finding",
            }
        )
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def recipe_for(recipe: str, out: str) -> str:
    """The shipped recipe, or a copy of it whose outputs/learn-check paths point at `out`."""
    if out == DEFAULT_OUT:
        return recipe
    copy = Path(out) / "recipes" / Path(recipe).name
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text((ROOT / recipe).read_text().replace(DEFAULT_OUT, out))
    return str(copy)


def run(*args: str) -> float:
    """Run a recipe script as a user would; returns its wall time in seconds."""
    start = time.perf_counter()
    result = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"learn check: {' '.join(args)} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    return time.perf_counter() - start


def held_out(model_dir: Path, rows: list[dict]) -> dict:
    """Greedy accuracy on `rows`, overall and for the warm-up's findings and the new ones."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from medrecipes.evaluation.generate import evaluate_mcq

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    report = evaluate_mcq(model, AutoTokenizer.from_pretrained(model_dir), rows, max_new_tokens=8)
    return {"all": report["accuracy"], **{s: r["accuracy"] for s, r in report["subjects"].items()}}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="folder for the data, models and recipe copies")
    parser.add_argument("--small", action="store_true", help=f"{SMALL_GRPO_STEPS} GRPO steps (the tests' variant)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = parser.parse_args(argv)
    os.chdir(ROOT)

    from medrecipes.models.tiny import build_tiny_model
    from medrecipes.usmle import load_mcq

    out = Path(args.out)
    write_jsonl(out / "data" / "warmup.jsonl", make_questions(256, seed=1, prefix="warmup", warmup=True))
    write_jsonl(out / "data" / "train.jsonl", make_questions(512, seed=2, prefix="train"))
    write_jsonl(out / "data" / "test.jsonl", make_questions(200, seed=3, prefix="test"))
    build_tiny_model(str(out / "tiny-model"), ["data/medical_text/train.jsonl"], hidden_size=128)

    sft_recipe, grpo_recipe = (recipe_for(r, args.out) for r in RECIPES)
    seconds = {"sft": run("recipes/sft.py", sft_recipe)}
    seconds["grpo"] = run(
        "recipes/grpo.py", grpo_recipe, *(["--max_steps", str(SMALL_GRPO_STEPS)] if args.small else [])
    )

    rows = list(load_mcq(out / "data" / "test.jsonl"))
    before, after = held_out(out / "sft" / "final", rows), held_out(out / "grpo" / "final", rows)
    result = {"questions": len(rows), "before_grpo": before, "after_grpo": after, "seconds": seconds}
    if args.json:
        print(json.dumps(result))
        return result
    print(f"held-out accuracy on {len(rows)} generated questions (chance 25%), greedy answers:")
    for group in before:
        gain = (after[group] - before[group]) * 100
        print(
            f"  {group:<16} after SFT warm-up {before[group]:6.1%}   after GRPO {after[group]:6.1%}   ({gain:+.1f} points)"
        )
    print(f"wall time: SFT warm-up {seconds['sft']:.0f} s, GRPO {seconds['grpo']:.0f} s")
    return result


if __name__ == "__main__":
    main()
