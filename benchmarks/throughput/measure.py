"""Measuring one run of a case, whichever arm: marks on the device's timeline for the step split,
tokens and windows, host reads and callback calls, the profile and the operator census, MFU; and
a run stopped early (the case's time limit) told apart from a finished one."""

import resource
import signal
import time

from .op_census import OperatorCensus


class TimedOut(Exception):
    """A SIGTERM, the `timeout` that bounds a case, stopped a run: the case ends as a timeout."""


_received: list[str] = []  # the signals that came, read again after each run


def raise_timed_out(signum, frame):
    _received.append(f"{signal.Signals(signum).name} received (the case's time limit)")
    raise TimedOut(_received[-1])


def check_timed_out() -> None:
    """Python drops an exception raised by a signal handler that ran inside a callback whose
    exceptions it ignores (a weakref's, a __del__, at garbage collection): the run then goes on to
    its end. The signal is recorded too, and a run it came during ends as the timeout it is."""
    if _received:
        raise TimedOut(_received[0])


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


def window_callback(trainer, warmup: int, window_steps: int, *counters, profiler=None):
    """Marks each step's end; synchronises and reads the wall clock after the warm-up steps and
    then every `window_steps` steps and after the last, the only waits it adds; the `counters`
    (host reads and callback calls, the operator census) count the steps after the warm-up, and
    the `profiler` (`profiled`) is stepped at each step's end."""
    from transformers import TrainerCallback

    class Window(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            trainer.measured_steps[-1]["end"] = trainer.clock.mark()
            step = state.global_step
            for counter in counters:
                counter.active = warmup <= step < state.max_steps
            if step >= warmup and ((step - warmup) % window_steps == 0 or step == state.max_steps):
                trainer.window_marks.append((step, trainer.clock.wall()))
            if profiler is not None:
                profiler.step()

    return Window()


PROFILED_STEPS = 2  # the measured steps a profile records: enough for a per-step average


def profiled(cuda: bool, warmup: int, max_steps: int):
    """torch.profiler over the first measured steps alone (at most PROFILED_STEPS, after the
    warm-up): it slows every operator, so a profiled run's timings are not compared with others;
    and a trace of every step of a 4B model took longer to read than the run itself (an H200,
    2026-11-28: the profiled plain trainer's 10 steps took 32 s, their `key_averages` over 100 s).
    The window callback steps it at each step's end."""
    from torch.profiler import ProfilerActivity, profile, schedule

    active = max(1, min(PROFILED_STEPS, max_steps - warmup))
    # the last warm-up step is the profiler's own warm-up (traced and dropped), then `active` steps
    plan = schedule(wait=max(warmup - 1, 0), warmup=min(warmup, 1), active=active, repeat=1)
    profiler = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []), schedule=plan)
    profiler.profiled_steps = active
    return profiler


def top_operators(profiler, count: int = 80) -> list[dict]:
    """The operators that took the most time of their own, per profiled step: on a GPU the
    device's time, on a CPU the host's."""
    events = profiler.key_averages()
    steps = profiler.profiled_steps
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
    profiler = profiled(trainer.clock.cuda, warmup, trainer.args.max_steps) if profile else None
    counters = [counter] + ([operators] if census else [])
    trainer.add_callback(window_callback(trainer, warmup, window_steps, *counters, profiler=profiler))
    if trainer.clock.cuda:
        torch.cuda.reset_peak_memory_stats()
    with counter, profiler or contextlib.nullcontext(), operators or contextlib.nullcontext():
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
        record["profile"] = top_operators(profiler)
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
