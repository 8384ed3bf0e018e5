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
no fused loss, no Liger. The plain loop (benchmarks/plain_loop.py) is the honest yardstick: the
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
import gc
import importlib.util
import json
import math
import os
import platform
import re
import resource
import shlex
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # plain_loop, beside this script

from op_census import OperatorCensus, census_gap  # noqa: E402
from plain_loop import PlainLoop  # noqa: E402

CONFIGS = ROOT / "benchmarks" / "configs"
RESULTS = ROOT / "benchmarks" / "results"
# The card `plan` estimates memory for when the run is not on a listed GPU.
REFERENCE_GPU = "h100-80gb"
# Recipe keys set for every measured run: no evaluation, saving or logging inside the window.
PLUMBING = {
    "eval_strategy": "no",
    "eval_tasks": "",
    "eval_on_start": "false",
    "save_strategy": "no",
    "load_best_model_at_end": "false",
    "push_to_hub": "false",
    "report_to": "none",
}


# ---------------------------------------------------------------------------
# Cases, tokenizer, data


def load_case(name: str) -> dict:
    path = Path(name) if name.endswith(".json") else CONFIGS / f"{name}.json"
    if not path.is_file():
        known = sorted(p.stem for p in CONFIGS.glob("*.json"))
        raise SystemExit(f"error: no case '{name}' ({path}); cases: {', '.join(known)}")
    case = json.loads(path.read_text())
    case["name"] = path.stem
    return case


def vocabulary_tokenizer(size: int):
    """A word-level tokenizer with exactly `size` tokens, so that the recipe's model code builds the
    architecture's own vocabulary: each whitespace-separated word is one token (unknown ones
    <unk>). The data are token ids; text (GRPO prompts) gets realistic lengths, not meanings."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<bos>", "<eos>", "<unk>", "<end_of_turn>"]  # the last: the Gemma recipes' eos_token
    vocab = {token: i for i, token in enumerate(specials + [f"t{i}" for i in range(size - len(specials))])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )


def token_blocks(count: int, length: int, vocab: int, seed: int = 0):
    """CPT data: `count` blocks of `length` random token ids, as the recipe's packing produces."""
    import numpy as np
    from datasets import Dataset

    rng = np.random.default_rng(seed)
    return Dataset.from_dict({"input_ids": rng.integers(4, vocab, size=(count, length), dtype=np.int32)})


def example_lengths(spec: dict, count: int, seed: int = 0):
    """Prompt and answer lengths of `count` SFT examples: log-normal prompts (`median`, `sigma`) plus
    the chat template's tokens, a fixed answer, cut to [min, max]."""
    import numpy as np

    rng = np.random.default_rng(seed)
    prompts = np.rint(spec["median"] * np.exp(spec["sigma"] * rng.standard_normal(count))) + spec["template"]
    prompts = np.clip(prompts, spec["min"], spec["max"] - spec["answer"]).astype(int)
    return prompts, spec["answer"]


def sft_examples(spec: dict, count: int, vocab: int, seed: int = 0):
    """Pre-tokenised SFT examples (`input_ids`, `completion_mask`), the answer tokens alone trained."""
    import numpy as np
    from datasets import Dataset

    prompts, answer = example_lengths(spec, count, seed)
    rng = np.random.default_rng(seed + 1)
    rows = {"input_ids": [], "completion_mask": []}
    for n in prompts:
        rows["input_ids"].append(rng.integers(4, vocab, size=n + answer).tolist())
        rows["completion_mask"].append([0] * n + [1] * answer)
    return Dataset.from_dict(rows)


def grpo_prompts(recipe, prompt_format: str, source: str):
    """The recipe's own GRPO data path on a bundled MCQ file instead of the recipe's Hub sources."""
    from medrecipes.data.grpo import grpo_data
    from medrecipes.data_config import SourceConfig

    recipe.mixture.sources = [SourceConfig(path=source, format="usmle")]
    recipe.eval_sources = {}
    train, _, _ = grpo_data(recipe, prompt_format)
    return train


# ---------------------------------------------------------------------------
# Measuring


class TimedOut(Exception):
    """A SIGTERM, the `timeout` that bounds a case, stopped a run: the case ends as a timeout."""


def raise_timed_out(signum, frame):
    raise TimedOut(f"{signal.Signals(signum).name} received (the case's time limit)")


def stopped_early(trainer) -> None:
    """A run that one of the recipe's callbacks stopped before its last step is no measurement:
    the preemption handler turns the case's SIGTERM into a checkpoint and a clean stop, which
    must read as the timeout it is."""
    from medrecipes.training.callbacks import PreemptionHandler, StopsRun

    handler = getattr(trainer, "callback_handler", None)
    for callback in handler.callbacks if handler else []:
        if isinstance(callback, StopsRun) and callback.stop_reason:
            kind = TimedOut if isinstance(callback, PreemptionHandler) else RuntimeError
            raise kind(f"stopped by {type(callback).__name__}: {callback.stop_reason}")


class Clock:
    """Marks on the device's timeline: CUDA events on a GPU (recorded, never waited on until the
    end), perf_counter on a CPU."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def mark(self):
        import torch

        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start, end) -> float:
        return start.elapsed_time(end) / 1000 if self.cuda else end - start

    def wall(self) -> float:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


def sequence_stats(inputs):
    """(real tokens, sum of squared sequence lengths) of a training batch, on its device, unread."""
    import torch

    if "completion_mask" in inputs and "prompt_mask" in inputs:  # GRPO
        lengths = inputs["prompt_mask"].sum(-1) + inputs["completion_mask"].sum(-1)
    elif "cu_seq_lens_q" in inputs:  # padding-free: the examples of the flattened row
        lengths = inputs["cu_seq_lens_q"].diff()
    elif inputs.get("attention_mask") is not None:
        lengths = inputs["attention_mask"].sum(-1)
    else:
        ids = inputs["input_ids"]
        lengths = torch.full(ids.shape[:1], ids.shape[-1], device=ids.device)
    lengths = lengths.to(torch.int64)
    return torch.stack([lengths.sum(), (lengths * lengths).sum()])


class MeasuredTrainerMixin:
    """Marks each optimizer step's parts (see the module docstring) and counts its tokens."""

    clock: Clock = None

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        step = {"start": self.clock.mark(), "fwd_bwd": [], "tokens": [], "generation": [], "scoring": []}
        step["generated"] = 0
        self.measured_steps.append(step)
        batches = super().get_batch_samples(epoch_iterator, num_batches, device)
        step["data_end"] = self.clock.mark()
        return batches

    def training_step(self, model, inputs, *args, **kwargs):
        begin = self.clock.mark()
        loss = super().training_step(model, inputs, *args, **kwargs)
        self.measured_steps[-1]["fwd_bwd"].append((begin, self.clock.mark()))
        return loss

    def compute_loss(self, model, inputs, *args, **kwargs):
        if model.training:
            self.measured_steps[-1]["tokens"].append(sequence_stats(inputs))
        return super().compute_loss(model, inputs, *args, **kwargs)


class MeasuredGRPOMixin(MeasuredTrainerMixin):
    """Also marks generation and scoring, which GRPO runs inside the first micro-batch's step."""

    def _generate_and_score_completions(self, *args, **kwargs):
        begin = self.clock.mark()
        batch = super()._generate_and_score_completions(*args, **kwargs)
        self.measured_steps[-1]["scoring"].append((begin, self.clock.mark()))
        return batch

    def _generate_single_turn(self, *args, **kwargs):
        begin = self.clock.mark()
        completion_ids, logprobs = super()._generate_single_turn(*args, **kwargs)
        self.measured_steps[-1]["generation"].append((begin, self.clock.mark()))
        self.measured_steps[-1]["generated"] += sum(len(ids) for ids in completion_ids)
        return completion_ids, logprobs


def measured(trainer_class, clock: Clock):
    mixin = MeasuredGRPOMixin if hasattr(trainer_class, "_generate_single_turn") else MeasuredTrainerMixin
    return type(f"Measured{trainer_class.__name__}", (mixin, trainer_class), {"clock": clock})


class HostCounter:
    """Counts, while `active`, the host's reads of tensor values (`.item()`, `.tolist()`,
    `bool()`, `float()`, `int()`, `.numpy()`, `.cpu()`: each waits for the device on a GPU) and
    the calls of callback methods a callback class defines itself (the library's no-op defaults
    are not counted). Counts, not timings: stable on a shared machine."""

    READS = ("item", "tolist", "__bool__", "__float__", "__int__", "numpy", "cpu")

    def __init__(self):
        self.active, self.reads, self.callbacks = False, 0, 0
        self._saved = {}

    def __enter__(self):
        import torch
        from transformers import TrainerCallback
        from transformers.trainer_callback import CallbackHandler

        def counted_read(original):
            def read(tensor, *args, **kwargs):
                self.reads += self.active
                return original(tensor, *args, **kwargs)

            return read

        for name in self.READS:
            self._saved[(torch.Tensor, name)] = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, counted_read(getattr(torch.Tensor, name)))
        call_event = CallbackHandler.call_event

        def counted_event(handler, event, *args, **kwargs):
            if self.active:
                default = getattr(TrainerCallback, event, None)
                self.callbacks += sum(getattr(type(cb), event, default) is not default for cb in handler.callbacks)
            return call_event(handler, event, *args, **kwargs)

        self._saved[(CallbackHandler, "call_event")] = call_event
        CallbackHandler.call_event = counted_event
        return self

    def __exit__(self, *exc):
        for (owner, name), original in self._saved.items():
            setattr(owner, name, original)


def window_callback(trainer, warmup: int, window_steps: int, *counters):
    """Marks each step's end; synchronises and reads the wall clock after the warm-up steps and
    then every `window_steps` steps and after the last, the only waits it adds; the `counters`
    (host reads and callback calls, the operator census) count the steps after the warm-up."""
    from transformers import TrainerCallback

    class Window(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            trainer.measured_steps[-1]["end"] = trainer.clock.mark()
            step = state.global_step
            for counter in counters:
                counter.active = warmup <= step < state.max_steps
            if step >= warmup and ((step - warmup) % window_steps == 0 or step == state.max_steps):
                trainer.window_marks.append((step, trainer.clock.wall()))

    return Window()


def profiled(cuda: bool):
    """torch.profiler over a whole run (it slows every operator: timings of a profiled run are
    not compared with others)."""
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []))


def top_operators(profiler, steps: int, count: int = 80) -> list[dict]:
    """The operators that took the most time of their own, per step of the run (warm-up
    included): on a GPU the device's time, on a CPU the host's."""
    events = profiler.key_averages()
    cuda = any(getattr(e, "self_device_time_total", 0) for e in events)
    own = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    return [
        {"operator": e.key, "self_ms_per_step": own(e) / 1000 / steps, "calls_per_step": e.count / steps}
        for e in sorted(events, key=own, reverse=True)[:count]
    ]


def profile_gap(ours: dict, other: dict, count: int = 25) -> list[dict] | None:
    """Operator by operator, what ours does per step beyond the other arm (the plain loop): the
    operators of either profile by the difference of their own time, with both arms' calls per
    step, so that work one arm does and the other does not (a metric, a mask, a copy) shows."""
    if not ours.get("profile") or not other.get("profile"):
        return None
    mine = {row["operator"]: row for row in ours["profile"]}
    theirs = {row["operator"]: row for row in other["profile"]}
    none = {"self_ms_per_step": 0.0, "calls_per_step": 0.0}
    rows = [
        {
            "operator": name,
            "ours_ms": mine.get(name, none)["self_ms_per_step"],
            "other_ms": theirs.get(name, none)["self_ms_per_step"],
            "ours_calls": mine.get(name, none)["calls_per_step"],
            "other_calls": theirs.get(name, none)["calls_per_step"],
        }
        for name in mine.keys() | theirs.keys()
    ]
    for row in rows:
        row["extra_ms"] = row["ours_ms"] - row["other_ms"]
    return sorted(rows, key=lambda row: abs(row["extra_ms"]), reverse=True)[:count]


def train_measured(
    trainer, warmup: int, window_steps: int | None = None, profile: bool = False, census: bool = False
) -> dict:
    """Train, then read every mark: the figures of the steps after the warm-up, as a whole and
    in windows of `window_steps` steps (one window when None); with `profile`, the run's top
    operators too."""
    import contextlib

    import torch

    trainer.measured_steps, trainer.window_marks = [], []
    counter = HostCounter()
    window_steps = window_steps or trainer.args.max_steps
    operators = OperatorCensus() if census else None
    trainer.add_callback(window_callback(trainer, warmup, window_steps, counter, *([operators] if census else [])))
    if trainer.clock.cuda:
        torch.cuda.reset_peak_memory_stats()
    profiler = profiled(trainer.clock.cuda) if profile else contextlib.nullcontext()
    with counter, profiler, operators or contextlib.nullcontext():
        trainer.train()
    stopped_early(trainer)
    clock, steps = trainer.clock, trainer.measured_steps[warmup:]
    marks = trainer.window_marks
    if len(marks) < 2:
        raise RuntimeError(f"{len(trainer.measured_steps)} steps ran: none measured after the {warmup} warm-up steps")
    wall = marks[-1][1] - marks[0][1]
    step_tokens = [torch.stack(s["tokens"]).sum(0)[0].item() for s in trainer.measured_steps]
    windows = [
        {"steps": b - a, "tokens_per_s": sum(step_tokens[a:b]) / (end - start)}
        for (a, start), (b, end) in zip(marks, marks[1:], strict=False)
    ]
    counts = torch.stack([t for s in steps for t in s["tokens"]]).sum(0).tolist()
    per_step = len(steps)

    def mean(values):
        return sum(values) / per_step

    fwd_bwd = [sum(clock.seconds(a, b) for a, b in s["fwd_bwd"]) for s in steps]
    record = {
        "measured_steps": per_step,
        "wall_s": wall,
        "tokens": counts[0],
        "tokens_per_s": counts[0] / wall,
        "windows": windows,
        "mean_sequence_length": counts[1] / counts[0],
        "step_s": wall / per_step,
        "split_s": {
            "data": mean([clock.seconds(s["start"], s["data_end"]) for s in steps]),
            "forward_backward": mean(fwd_bwd),
            "optimizer": mean([clock.seconds(s["fwd_bwd"][-1][1], s["end"]) for s in steps]),
        },
        # the window counts the on_step_end of each measured step (the first one after its
        # opening step's), so the counts per step are over the same steps as the timings
        "host_reads_per_step": counter.reads / per_step,
        "callback_calls_per_step": counter.callbacks / per_step,
        "peak_mem_gb": (
            torch.cuda.max_memory_allocated() / 2**30
            if clock.cuda
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
        ),
    }
    record["split_s"]["between_steps"] = record["step_s"] - sum(record["split_s"].values())
    if profile:
        record["profile"] = top_operators(profiler, trainer.args.max_steps)
    if census:
        record["census"] = operators.table(per_step)
    if any(s["generation"] for s in steps):
        generation = [sum(clock.seconds(a, b) for a, b in s["generation"]) for s in steps]
        scoring = [sum(clock.seconds(a, b) for a, b in s["scoring"]) for s in steps]
        training = [f - sc for f, sc in zip(fwd_bwd, scoring, strict=True)]
        record["grpo"] = {
            "generation_s": mean(generation),
            "scoring_s": mean(scoring) - mean(generation),  # rewards, reference and old log-probs
            "training_s": mean(training) + record["split_s"]["optimizer"],
            "generated_tokens": sum(s["generated"] for s in steps),
            "generation_tokens_per_s": sum(s["generated"] for s in steps) / sum(generation),
        }
        record["grpo"]["training_tokens_per_s"] = counts[0] / (record["grpo"]["training_s"] * per_step)
    return record


def add_mfu(record: dict, shape, trains_base: bool, peak_tflops: float | None) -> None:
    """MFU and achieved TFLOP/s from plan.shape.flops_per_token, over the whole step and, for GRPO, training alone."""
    from medrecipes.plan.shape import flops_per_token

    flops = record["tokens"] * flops_per_token(shape, record["mean_sequence_length"], trains_base)
    record["model_tflops_per_s"] = flops / record["wall_s"] / 1e12
    record["mfu"] = record["model_tflops_per_s"] / peak_tflops if peak_tflops else None
    if "grpo" in record:
        seconds = record["grpo"]["training_s"] * record["measured_steps"]
        record["grpo"]["training_mfu"] = flops / seconds / 1e12 / peak_tflops if peak_tflops else None


# ---------------------------------------------------------------------------
# Building ours and the baseline


def cli_value(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def parse_case(case: dict, changes: dict, device: str, output_dir: str):
    """The recipe's dataclasses with the case's keys, `changes`, and the benchmark's plumbing."""
    from medrecipes.config import parse_recipe

    keys = {**case.get("overrides", {}), **changes, **PLUMBING, "output_dir": output_dir}
    if device == "cpu":
        keys["use_cpu"] = "true"
    argv = [case["recipe"]] + [item for key, value in keys.items() for item in (f"--{key}", cli_value(value))]
    recipe, args, model_args = parse_recipe(case["method"], argv)
    recipe.init_from_scratch, recipe.architecture = True, case["architecture"]
    args.max_steps = case["steps"]  # after any token budget the recipe derives its steps from
    args.logging_steps = case["steps"]  # the one log (a host sync) comes after the window
    return recipe, args, model_args


class Bench:
    """One case: its data, tokenizer and model config, shared by every run in the process."""

    def __init__(self, case: dict, device: str, workdir: str, profile: bool = False, census: bool = False):
        from medrecipes.models.scratch import scratch_config
        from medrecipes.plan.hardware import GPUS, gpu_type

        self.case, self.device, self.workdir = case, device, workdir
        self.profile = profile  # --profile: each run under torch.profiler
        self.census = census  # --census: each run's operators counted (op_census.py)
        self.clock = Clock(device == "cuda")
        vocab = scratch_config(case["architecture"]).vocab_size
        self.tokenizer = vocabulary_tokenizer(vocab)
        self.method = case["method"]
        recipe, args, model_args = self.parse({})
        self.base_args = args
        if self.method == "grpo":
            self.data = grpo_prompts(recipe, args.prompt_format, case["data"]["source"])
        elif self.method == "sft":
            spec = case["data"]["lengths"]
            rows = args.per_device_train_batch_size * args.gradient_accumulation_steps * case["steps"]
            prompts, answer = example_lengths(spec, 1000)
            self.mean_length = float(prompts.mean()) + answer
            count = math.ceil(1.3 * rows * args.max_length / self.mean_length) + 8
            self.data = sft_examples(spec, count, vocab)
        else:
            count = args.per_device_train_batch_size * args.gradient_accumulation_steps * case["steps"]
            self.data = token_blocks(count, args.max_length, vocab)
        self.saved_model = None
        self.shape, self.trains_base = self.model_shape(model_args), not model_args.use_peft
        self.gpu = gpu_type(device_name(device)) if device == "cuda" else None
        self.peak_tflops = GPUS[self.gpu][1] if self.gpu else None

    def model_shape(self, model_args):
        """plan.shape.model_shape of the architecture, counted on the meta device."""
        import torch
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            meta = AutoModelForCausalLM.from_config(self.model_config(model_args))
        return model_shape(meta.config, meta)

    def uses_liger(self, changes: dict) -> bool:
        value = changes.get("use_liger_kernel", getattr(self.base_args, "use_liger_kernel", False))
        return str(value).lower() == "true"

    def parse(self, changes: dict):
        run_dir = tempfile.mkdtemp(dir=self.workdir)
        return parse_case(self.case, changes, self.device, run_dir)

    def settled(self, changes: dict):
        """The recipe as its script runs it: parsed, then activation checkpointing decided by the
        memory plan where the recipe leaves it to the plan (SFT), before the model loads."""
        from medrecipes.plan.summary import settle_checkpointing

        recipe, args, model_args = self.parse(changes)
        if self.method == "sft":
            settle_checkpointing(recipe, args, model_args)
        return recipe, args, model_args

    def padded_batch(self, args) -> int:
        """Examples per padded micro-batch that carry about the tokens of the packed one's rows."""
        return max(1, round(self.base_args.per_device_train_batch_size * args.max_length / self.mean_length))

    def model_config(self, model_args):
        from medrecipes.models.scratch import scratch_config

        tok = self.tokenizer
        ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
        return scratch_config(self.case["architecture"], vocab_size=len(tok), **ids)

    def grpo_model_dir(self, recipe, model_args) -> str:
        """GRPO starts from a checkpoint (its reference model is loaded from the same path): the
        random model is saved once and both runs load it."""
        import torch

        from medrecipes.models.loading import load_model

        if self.saved_model is None:
            self.saved_model = os.path.join(self.workdir, "model")
            torch.manual_seed(0)
            model = load_model(model_args, recipe, self.tokenizer)
            model.save_pretrained(self.saved_model)
            self.tokenizer.save_pretrained(self.saved_model)
            del model
        return self.saved_model

    def ours(self, changes: dict):
        """The recipe's trainer, as its script builds it (with `changes` to the recipe's keys)."""
        import torch
        from trl import get_peft_config

        from medrecipes.models.loading import load_model
        from medrecipes.rewards import reward_functions
        from medrecipes.training.callbacks import recipe_callbacks

        recipe, args, model_args = self.settled(changes)
        if self.method == "sft" and not args.packing:
            args.per_device_train_batch_size = self.padded_batch(args)
        if self.method == "grpo":
            model_args.model_name_or_path = self.grpo_model_dir(recipe, model_args)
            recipe.init_from_scratch = False
        torch.manual_seed(0)
        # A scratch model is initialised where it trains (seconds for 4B parameters on a GPU, minutes on a CPU).
        with torch.device(self.device if recipe.init_from_scratch else "cpu"):
            model = load_model(model_args, recipe, self.tokenizer, args.activation_checkpointing)
        common = {
            "model": model,
            "args": args,
            "train_dataset": self.data,
            "processing_class": self.tokenizer,
            "callbacks": recipe_callbacks(recipe, args),
        }
        if self.method == "cpt":
            from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

            from medrecipes.training.trainers import CausalLMTrainer

            collator = DataCollatorForLanguageModeling(pad_token_id=self.tokenizer.pad_token_id)
            return measured(CausalLMTrainer, self.clock)(data_collator=collator, **common)
        if self.method == "sft":
            from medrecipes.training.trainers import MedSFTTrainer as trainer_class

            return measured(trainer_class, self.clock)(peft_config=get_peft_config(model_args), **common)
        from medrecipes.training.trainers import MedGRPOTrainer as trainer_class

        reward_funcs, _ = reward_functions(args.rewards)
        return measured(trainer_class, self.clock)(
            reward_funcs=reward_funcs, peft_config=get_peft_config(model_args), **common
        )

    def plain_loop(self, changes: dict):
        """The loop a user writes without a trainer (benchmarks/plain_loop.py), with the `--set` keys."""
        return PlainLoop(self, changes)

    def baseline(self):
        """The plain trainer with its defaults on the same model, data, precision and batch shape."""
        import torch
        from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

        from medrecipes.models.loading import resolve_dtype

        recipe, ours, model_args = self.parse({})
        dtype = resolve_dtype(model_args.dtype)
        shape = {
            "output_dir": ours.output_dir,
            "max_steps": ours.max_steps,
            "logging_steps": ours.logging_steps,
            "per_device_train_batch_size": ours.per_device_train_batch_size,
            "gradient_accumulation_steps": ours.gradient_accumulation_steps,
            "bf16": ours.bf16,
            "use_cpu": self.device == "cpu",
            "report_to": "none",
            "save_strategy": "no",
            **self.case.get("baseline", {}),
        }
        torch.manual_seed(0)
        if self.method == "grpo":
            path = self.grpo_model_dir(recipe, model_args)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
            model.to(self.device)
        else:
            with torch.device(self.device):
                model = AutoModelForCausalLM.from_config(
                    self.model_config(model_args),
                    dtype=torch.float32 if dtype == "auto" else dtype,
                    attn_implementation="sdpa",
                )
        if self.method == "cpt":
            from transformers import DataCollatorForLanguageModeling

            args = TrainingArguments(**shape)
            collator = DataCollatorForLanguageModeling(self.tokenizer, mlm=False)
            return measured(Trainer, self.clock)(
                model=model, args=args, train_dataset=self.data, data_collator=collator
            )
        if self.method == "sft":
            from trl import SFTConfig, SFTTrainer, get_peft_config

            shape["per_device_train_batch_size"] = self.padded_batch(ours)
            args = SFTConfig(max_length=ours.max_length, packing=False, completion_only_loss=True, **shape)
            return measured(SFTTrainer, self.clock)(
                model=model,
                args=args,
                train_dataset=self.data,
                processing_class=self.tokenizer,
                peft_config=get_peft_config(model_args),
            )
        from trl import GRPOConfig, GRPOTrainer

        from medrecipes.rewards import reward_functions

        reward_funcs, weights = reward_functions(ours.rewards)
        args = GRPOConfig(
            num_generations=ours.num_generations,
            max_completion_length=ours.max_completion_length,
            temperature=ours.temperature,
            top_k=ours.top_k,
            beta=ours.beta,
            reward_weights=weights,
            # The recipe's algorithm, TRL's own options (enhanced GRPO): the same in both runs.
            sync_ref_model=ours.sync_ref_model,
            ref_model_sync_steps=ours.ref_model_sync_steps,
            ref_model_mixup_alpha=ours.ref_model_mixup_alpha,
            off_policy_mask_threshold=ours.off_policy_mask_threshold,
            use_bias_correction_kl=ours.use_bias_correction_kl,
            **shape,
        )
        return measured(GRPOTrainer, self.clock)(
            model=model, reward_funcs=reward_funcs, args=args, train_dataset=self.data, processing_class=self.tokenizer
        )

    def settings(self, trainer) -> dict:
        """The speed settings a run trained with, as its trainer resolved them."""
        args, model = trainer.args, trainer.model
        keys = ("bf16", "tf32", "optim", "torch_compile", "use_liger_kernel", "logging_nan_inf_filter")
        found = {key: getattr(args, key, None) for key in keys}
        found["optim"] = str(getattr(args.optim, "value", args.optim))
        found["activation_checkpointing"] = bool(
            getattr(args, "activation_checkpointing", False) or getattr(args, "gradient_checkpointing", False)
        )
        found["attention"] = model.config._attn_implementation
        # as the CPT trainer resolved it; TRL's SFT and GRPO trainers always use the chunked head
        found["fused_lm_head"] = getattr(trainer, "fused_lm_head", self.method != "cpt")
        if self.method == "sft":
            found["packing"] = args.packing
        if hasattr(model, "peft_config"):
            found["lora_dropout"] = model.peft_config["default"].lora_dropout
        found["per_device_train_batch_size"] = args.per_device_train_batch_size
        found["gradient_accumulation_steps"] = args.gradient_accumulation_steps
        return found

    def knobs(self) -> list[dict]:
        """One change per speed setting, each switching it from what ours uses."""
        from medrecipes.models.loading import resolve_attention

        recipe, args, model_args = self.settled({})
        cuda = self.device == "cuda"
        changes = []
        if self.method == "cpt":  # its default (None) is on where a GPU trains
            fused = cuda if args.fused_lm_head is None else args.fused_lm_head
            changes.append({"fused_lm_head": not fused})
        if self.method == "sft":
            changes.append({"packing": not args.packing})
        if model_args.use_peft and model_args.lora_dropout:
            # LoRA's dropout draws a mask over each adapted layer's input, in every layer (a CPU
            # profile of sft_lora_tiny has it second among the operators): the step without it
            changes.append({"lora_dropout": 0.0})
        if cuda and importlib.util.find_spec("liger_kernel") is not None:
            changes.append({"use_liger_kernel": not args.use_liger_kernel})
        if cuda and self.method != "grpo":
            changes.append({"torch_compile": not args.torch_compile})
        changes.append({"activation_checkpointing": not args.activation_checkpointing})
        changes.append({"logging_nan_inf_filter": not args.logging_nan_inf_filter})
        optim = str(getattr(args.optim, "value", args.optim))
        other = {"adamw_torch_fused": "adamw_torch", "adamw_torch": "adamw_torch_fused"}.get(optim)
        if other:
            changes.append({"optim": other})
        if cuda and resolve_attention(model_args.attn_implementation) != "sdpa":
            changes.append({"attn_implementation": "sdpa"})
        return changes


# ---------------------------------------------------------------------------
# Running a case


def release(trainer) -> None:
    """Drop everything a finished run holds on the device before the next run of the process.

    The trainer's model, optimizer, reference model and buffered generations are referenced
    from several of its attributes (the callback handler, the accelerator, ...): all of them go."""
    import torch

    if trainer is not None:
        if hasattr(trainer, "accelerator"):
            trainer.accelerator.free_memory()
        trainer.__dict__.clear()
    gc.collect()
    torch._dynamo.reset()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_one(build, bench: Bench, label: str) -> dict:
    """Build a trainer, train it measured, and return its record, or the error that stopped it
    (out of memory, a setting this device lacks): the other runs of the case still go ahead."""
    import traceback

    import torch

    trainer = None
    try:
        started = time.perf_counter()
        trainer = build()
        built = time.perf_counter() - started
        steps = bench.case["warmup_steps"], bench.case.get("window_steps")
        record = train_measured(trainer, *steps, profile=bench.profile, census=bench.census)
        record["settings"] = trainer.settings() if isinstance(trainer, PlainLoop) else bench.settings(trainer)
        record["build_s"], record["run_s"] = built, time.perf_counter() - started
        add_mfu(record, bench.shape, bench.trains_base, bench.peak_tflops)
    except TimedOut as err:
        print(f"[{bench.case['name']}] {label}: timed out: {err}", flush=True)
        raise
    except Exception as err:  # one failed run must not lose the figures of the others
        traceback.print_exc()
        kind = "out of memory" if isinstance(err, torch.cuda.OutOfMemoryError) else type(err).__name__
        record = {"error": f"{kind}: {str(err).splitlines()[0] if str(err) else ''}"}
    finally:
        release(trainer)
        trainer = None
    print(f"[{bench.case['name']}] {label}: {summary_line(record)}", flush=True)
    return record


def _per_window(ours: dict, baseline: dict) -> list[float]:
    """Ours over the baseline window by window: the same steps of the same data in each run."""
    pairs = zip(ours.get("windows", []), baseline.get("windows", []), strict=False)
    return [a["tokens_per_s"] / b["tokens_per_s"] for a, b in pairs]


def window_ratios(ours: dict, baseline: dict) -> dict | None:
    """The window-by-window ratios of one pair of runs (a window's ratio pairs like with like):
    their median and range."""
    ratios = _per_window(ours, baseline)
    if not ratios:
        return None
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "windows": len(ratios)}


def repeat_ratios(pairs: list[tuple[dict, dict]]) -> dict | None:
    """Ours over the reference arm (the plain trainer or the plain loop, "baseline" below) of each
    (reference, ours) pair run in one round, whole runs and window by window across all pairs:
    each ratio's median and range."""
    whole, windows = [], []
    for baseline, ours in pairs:
        if "tokens_per_s" not in ours or "tokens_per_s" not in baseline:
            return None
        whole.append(ours["tokens_per_s"] / baseline["tokens_per_s"])
        windows += _per_window(ours, baseline)
    return {
        "pairs": [
            {"baseline_tokens_per_s": b["tokens_per_s"], "ours_tokens_per_s": o["tokens_per_s"], "ratio": r}
            for (b, o), r in zip(pairs, whole, strict=True)
        ],
        "median": statistics.median(whole),
        "min": min(whole),
        "max": max(whole),
        "window_median": statistics.median(windows),
        "window_min": min(windows),
        "window_max": max(windows),
    }


def summary_line(record: dict) -> str:
    if "error" in record:
        return record["error"]
    split = ", ".join(f"{k} {v * 1000:.1f}" for k, v in record["split_s"].items())
    mfu = f", MFU {record['mfu']:.1%}" if record.get("mfu") is not None else ""
    line = (
        f"{record['tokens_per_s']:,.0f} tokens/s{mfu}, {record['model_tflops_per_s']:.3g} TFLOP/s, "
        f"peak {record['peak_mem_gb']:.2f} GB, step {record['step_s'] * 1000:.1f} ms ({split} ms)"
    )
    if "grpo" in record:
        g = record["grpo"]
        line += (
            f"; generation {g['generation_s']:.2f} s ({g['generation_tokens_per_s']:,.0f} tokens/s), "
            f"scoring {g['scoring_s']:.2f} s, training {g['training_s']:.2f} s"
        )
    return line


def model_shape(config, model):
    from medrecipes.plan.shape import model_shape as count

    return count(config, model)


def device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name() if device == "cuda" else "cpu"


def versions() -> dict:
    import torch

    found = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    for name in ("transformers", "trl", "accelerate", "peft", "datasets", "liger_kernel", "flash_attn"):
        try:
            module = __import__(name)
            found[name] = getattr(module, "__version__", "installed")
        except ImportError:
            found[name] = None
    return found


def memory_plan(bench: Bench, gpu: str) -> dict:
    """`medrecipes plan`'s estimate for ours on one device, beside the measured peak."""
    from medrecipes.plan.summary import plan

    recipe, args, model_args = bench.parse({})
    estimate = plan(recipe, args, model_args, bench.case["recipe"], num_gpus=1, gpu=gpu)
    return {"gpu": gpu, **{k: estimate[k] for k in ("method", "fused_loss", "activation_checkpointing")}} | {
        "ddp_gb": estimate["memory_breakdown_gb"]["ddp"]
    }


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


def write_result(state: dict, options, complete: bool = False) -> dict:
    """The case's results file as it stands: written after every run, `complete` after the last."""
    case, bench, records = state["case"], state["bench"], state["records"]
    ours, baseline, plain = (records.get(arm, {}) for arm in ("ours", "baseline", "plain_loop"))
    rounds = [{"baseline": baseline, "plain_loop": plain, "ours": ours}, *state["repeats"]]
    result = {
        "case": case["name"],
        "device": device_name(bench.device),
        "complete": complete,
        "timed_out": state.get("timed_out"),
        "tokens_per_s": ours.get("tokens_per_s"),
        "mfu": ours.get("mfu"),
        "peak_mem_gb": ours.get("peak_mem_gb"),
        "baseline_tokens_per_s": baseline.get("tokens_per_s"),
        "plain_loop_tokens_per_s": plain.get("tokens_per_s"),
        "ratio": _ratio(ours, baseline),
        "ratio_to_plain_loop": _ratio(ours, plain),
        "window_ratios": window_ratios(ours, baseline),
        "window_ratios_to_plain_loop": window_ratios(ours, plain),
        "repeats": repeat_ratios([(r.get("baseline", {}), r.get("ours", {})) for r in rounds]) if baseline else None,
        "repeats_to_plain_loop": (
            repeat_ratios([(r.get("plain_loop", {}), r.get("ours", {})) for r in rounds]) if plain else None
        ),
        "command": shlex.join(["python", *sys.argv]),
        "versions": versions(),
        "peak_tflops": bench.peak_tflops,
        "peak_mem_kind": "torch.cuda.max_memory_allocated"
        if bench.device == "cuda"
        else "process peak RSS (ru_maxrss)",
        "recipe": case["recipe"],
        "architecture": case["architecture"],
        "set": state["changes"],
        "allocator": options.allocator if bench.device == "cpu" else None,
        "ours": ours or None,
        "baseline": baseline or None,
        "plain_loop": plain or None,
        "ablation": [
            {**record, "ratio_to_ours": _ratio(record, ours)}
            for label, record in records.items()
            if label not in ("ours", "baseline", "plain_loop")
        ],
        "profile_gap_to_plain_loop": profile_gap(ours, plain),
        "census_gap_to_plain_loop": census_gap(ours, plain),
        "plan_memory": state.get("plan_memory"),
        "date": time.strftime("%Y-%m-%d"),
    }
    if "grpo" in ours:
        result["grpo"] = ours["grpo"]
    if "grpo" in plain:
        result["plain_loop_grpo"] = plain["grpo"]
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{case['name']}-{re.sub(r'[^a-z0-9]+', '-', result['device'].lower()).strip('-')}.json"
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(result, indent=2) + "\n")
    partial.replace(path)  # a kill while writing leaves the previous version whole
    if complete or "timed_out" in state:
        print(
            f"[{case['name']}] {ratio_line(result)}; wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}"
        )
    return result


def ratio_line(result: dict) -> str:
    parts = []
    for key, arm, windows, repeats in (
        ("ratio", "the plain trainer", "window_ratios", "repeats"),
        ("ratio_to_plain_loop", "the plain loop", "window_ratios_to_plain_loop", "repeats_to_plain_loop"),
    ):
        if not result[key]:
            continue
        line = f"ours {result[key]:.2f}x {arm}"
        if result[windows] and result[windows]["windows"] > 1:
            w = result[windows]
            line += f" (median of {w['windows']} windows {w['median']:.2f}x, {w['min']:.2f}-{w['max']:.2f})"
        if result[repeats] and len(result[repeats]["pairs"]) > 1:
            r = result[repeats]
            line += (
                f"; {len(r['pairs'])} pairs: median {r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f}), "
                f"windows of all pairs {r['window_median']:.2f}x ({r['window_min']:.2f}-{r['window_max']:.2f})"
            )
        parts.append(line)
    if result["timed_out"]:
        parts.append(f"TIMED OUT: {result['timed_out']}")
    return "; ".join(parts) or "no ratio"


def _ratio(record: dict, other: dict):
    """record's tokens/s over other's, where both ran."""
    if "tokens_per_s" in record and "tokens_per_s" in other:
        return record["tokens_per_s"] / other["tokens_per_s"]
    return None


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
