"""Training throughput of the recipes against a plain baseline, measured in one process.

Usage:

    python benchmarks/train_throughput.py cpt_gemma3_4b pretrain_0p4b sft_lora_4b grpo_0p4b   # on a GPU
    python benchmarks/train_throughput.py cpt_tiny pretrain_tiny sft_lora_tiny grpo_tiny --device cpu
    python benchmarks/train_throughput.py pretrain_0p4b --ablate            # each speed setting switched in turn
    python benchmarks/train_throughput.py cpt_gemma3_4b --set torch_compile=false --no-baseline
    python benchmarks/train_throughput.py cpt_smollm2_cpu --device cpu --repeats 2   # paired runs
    python benchmarks/train_throughput.py cpt_smollm2_cpu --device cpu --profile     # top operators

A case is a JSON file in benchmarks/configs/ (facts, not code): the recipe whose settings are
measured, the architecture (a scratch preset, a config packaged in src/medrecipes/architectures
or a config.json path), the recipe keys the benchmark changes (shapes for one device), the
steps, and what the baseline needs beyond the trainer's defaults. Weights are random and the
data synthetic, so nothing is downloaded:

- cpt: random token blocks of `max_length`, as the CPT recipe packs them;
- sft: pre-tokenised examples of random tokens whose lengths follow the case's `data.lengths`
  (a log-normal fitted to MedQA questions), the answer tokens alone trained;
- grpo: the questions of data/usmle_sample, rendered by the recipe's own `grpo_data`.

Every case has three arms, run in one process: ours, the plain loop and the plain trainer.
"Ours" is the recipe's own path: `parse_recipe` of the recipe YAML (with the case's keys and
`--set`), `models.loading.load_model`, the recipe's trainer class (`CausalLMTrainer`, `MedSFTTrainer`,
`MedGRPOTrainer`, all in the package) with the recipe's collator, data path and
callbacks. The baseline is the same model, data, precision and batch shape given to the plain
trainer with its defaults: transformers' `Trainer` with its padding collator (CPT), TRL's
`SFTTrainer` on padded batches (SFT), TRL's `GRPOTrainer` (GRPO), sdpa attention, no compile,
no fused loss, no Liger. The plain loop (benchmarks/throughput/plain_loop.py) is the honest yardstick: the
loop a competent user writes without a trainer (the same model, dtype, LoRA, rows and trained
positions; `model(input_ids, labels=...)`, AdamW, clipping). Both run first: Liger patches model
classes for the whole process. `ratio` is ours over the plain trainer, `ratio_to_plain_loop` ours
over the plain loop.

What is reported, over the steps after the warm-up ones (compilation, allocator growth):

- windows: tokens/s over each `window_steps` steps of the measured ones (a case key; one
  window when absent), and ours over the baseline window by window (`window_ratios`: the
  median and range), since a shared machine's speed drifts within a run;
- repeats (`--repeats N`): N pairs of runs, baseline and ours back to back, the order turning
  each time; ours over the baseline pair by pair and window by window across the pairs
  (`repeats`: each ratio's median and range);
- with `--profile`, each run under torch.profiler and its top operators by their own time per
  step (`profile`): where two runs' time differs, operator by operator; a profiled run's
  timings are not compared with others;
- host reads and callback calls per step: how often the host reads a tensor's value (`.item()`,
  `.tolist()`, `bool()`, ...: on a GPU each waits for the device to catch up) and calls a
  callback method that does something; counts, so a test can hold ours to the baseline's;

- tokens/s: real tokens trained (padding not counted) / wall time of those steps, taken with
  `time.perf_counter` after a device synchronisation at the two ends of the window only;
- MFU: model FLOPs / wall time / the device's dense bf16 peak (`plan.hardware.GPUS`, e.g. 989 TFLOP/s for
  H100 and H200); FLOPs per token from `plan.shape.flops_per_token` (6N + 12 L d S, 4N for a frozen
  LoRA base) with S the tokens' own sequence lengths, so padding and cross-document attention
  count for nothing and ours and the baseline are credited the same work; none on a CPU;
- peak memory: `torch.cuda.max_memory_allocated` of the run (the process's peak RSS on a CPU);
- the step split: each optimizer step is marked where the trainer fetches its batches
  (`get_batch_samples`), around each `training_step` (forward and backward, H2D copy included)
  and at `on_step_end` (after clipping, the optimizer step, the scheduler and zero_grad). On a
  GPU the marks are CUDA events recorded on the stream, read once after the run: nothing waits
  on them, so the split is the device's timeline (data = time the device spent idle or copying
  while the host fetched batches; work the host hides under the device's costs nothing). On a
  CPU they are perf_counter readings. GRPO steps also mark `_generate_single_turn` (generation)
  and `_generate_and_score_completions` (generation, rewards, reference log-probs): training =
  forward/backward minus those, plus the optimizer.

Each case writes benchmarks/results/<case>-<device>.json (or under --out), again after each of its
runs (`complete` false until the last), so a case cut short keeps what it measured. A SIGTERM
(the `timeout` that bounds a case) stops the run in progress at its step's end, is written as
that run's error, and the case ends there with exit code 124: a timeout, never a finished run.
"""

import argparse
import json
import os
import signal
import tempfile

from throughput.arms import Bench
from throughput.cases import RESULTS, ROOT, load_case
from throughput.measure import TimedOut, raise_timed_out
from throughput.results import REFERENCE_GPU, memory_plan, run_one, write_result


def bench_case(name: str, options) -> dict:
    case = load_case(name)
    if case["steps"] <= case["warmup_steps"]:
        raise SystemExit(f"error: case {name}: steps must exceed warmup_steps")
    device = options.device
    changes = dict(item.split("=", 1) for item in options.set)
    with tempfile.TemporaryDirectory(prefix="bench-") as workdir:
        bench = Bench(case, device, workdir, options.profile, options.census)
        if options.plan_only:
            estimate = memory_plan(bench, bench.gpu or REFERENCE_GPU)
            print(f"[{case['name']}] {bench.shape.num_parameters:,} parameters; plan: {json.dumps(estimate)}")
            print(f"[{case['name']}] ablation changes: {bench.knobs()}")
            return {}
        runs = [({}, "ours")] + ([(knob, f"ours with {knob}") for knob in bench.knobs()] if options.ablate else [])
        runs = [({**changes, **c}, label) for c, label in runs]
        # Liger patches model classes for the whole process: the runs without it go first.
        runs.sort(key=lambda run: bench.uses_liger(run[0]))
        arms = {"baseline": bench.baseline, "plain_loop": lambda: bench.plain_loop(changes)}
        if options.no_baseline:
            del arms["baseline"]
        if options.no_plain_loop:
            del arms["plain_loop"]
        records, repeats = {}, []
        state = {"case": case, "bench": bench, "changes": changes, "records": records, "repeats": repeats}
        try:
            for label, build in arms.items():
                records[label] = run_one(build, bench, label)
                write_result(state, options)
            for run_changes, label in runs:
                records[label] = run_one(lambda c=run_changes: bench.ours(c), bench, label)
                records[label]["changes"] = {k: v for k, v in run_changes.items() if k not in changes}
                write_result(state, options)
            # More rounds of the arms back to back: a drift of the machine's speed over the minutes
            # of a case falls on every run of a round and cancels in its ratios. The order turns
            # each time, so that no arm gains from its place in the process (the first run of a
            # process has been the slower one here).
            order = [*arms.items(), ("ours", lambda: bench.ours(changes))]
            for repeat in range(2, options.repeats + 1 if arms else 2):
                turn = order[repeat - 1 :] + order[: repeat - 1]
                repeats.append({label: run_one(build, bench, f"{label}, repeat {repeat}") for label, build in turn})
                write_result(state, options)
            state["plan_memory"] = memory_plan(bench, bench.gpu or REFERENCE_GPU)
        except TimedOut as err:
            state["timed_out"] = str(err)
        result = write_result(state, options, complete="timed_out" not in state)
    if "timed_out" in state:
        raise SystemExit(124)
    return result


def main(argv=None):
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+", help="case names in benchmarks/configs (or JSON paths)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=str(RESULTS), help="folder for <case>-<device>.json")
    parser.add_argument("--ablate", action="store_true", help="also run ours with each speed setting switched")
    parser.add_argument("--no-baseline", action="store_true", help="skip the plain trainer's run (no ratio)")
    parser.add_argument(
        "--no-plain-loop", action="store_true", help="skip the plain loop's run (no ratio_to_plain_loop)"
    )
    parser.add_argument(
        "--plan-only", action="store_true", help="check the cases and print plan's memory; no training"
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="run baseline and ours this many times, in turn (paired ratios)"
    )
    parser.add_argument(
        "--profile", action="store_true", help="run under torch.profiler; record each run's top operators per step"
    )
    parser.add_argument(
        "--census", action="store_true", help="count each run's operators by dtype per step (op_census.py); no timing"
    )
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a recipe key for ours")
    parser.add_argument(
        "--allocator",
        choices=["kept", "default"],
        default="kept",
        help="CPU: glibc malloc as the recipes set it for CPU training (allocator.keep_freed_memory), for both "
        "runs of the process; or the C library's default (the ablation)",
    )
    options = parser.parse_args(argv)
    if options.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but no GPU is visible; use --device cpu with the *_tiny cases")
    for item in options.set:
        if "=" not in item:
            raise SystemExit(f"error: --set {item}: expected KEY=VALUE, e.g. --set torch_compile=false")
    os.chdir(ROOT)  # recipes name their templates and data relative to the project
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    if options.device == "cpu" and options.allocator == "kept":
        # A setting of the whole process, as in a recipe's: the baseline and ours run under the
        # same allocator, so the ratio is of what else differs between them.
        from medrecipes.allocator import keep_freed_memory

        options.allocator = "kept" if keep_freed_memory() else "default (not glibc)"
    signal.signal(signal.SIGTERM, raise_timed_out)  # the case's `timeout`: written as a timeout, exit 124
    for name in options.cases:
        bench_case(name, options)


if __name__ == "__main__":
    main()
