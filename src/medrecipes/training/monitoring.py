"""How a run is doing, in every training log: throughput, MFU, memory, time and cost left.

Added to the logs of the logging steps, so that TensorBoard, wandb and trackio (whichever
`report_to` names) record them through the trainer's own integrations, and printed as one line.
Nothing here touches the GPU between logging steps: tokens are counted from tensor shapes
(host metadata) by `RecipeTrainerMixin`, times are taken at logging steps, where the trainer
already waits for the device to read the loss, and the peak memory is the CUDA allocator's
host-side counter.

    tokens_per_second   tokens of all processes / training seconds (evaluation and saving excluded)
    mfu                 model FLOPs / seconds / (peak FLOP/s per device x devices), FLOPs from
                        `plan.shape.flops_per_token` (6N + 12 L d S) and the peak from `plan.hardware.GPUS`
    peak_memory_gib     torch.cuda.max_memory_allocated on this process
    eta_hours           steps left x seconds per step of the last logging window
    elapsed_hours       wall time of the run so far, carried over resumptions
    cost_so_far, cost_remaining   hours x devices x gpu_hour_price, when the recipe sets it
"""

import datetime
import logging
import time

import torch
from transformers import TrainerCallback

from medrecipes.plan.hardware import GIB, GPUS, gpu_type
from medrecipes.plan.shape import flops_per_token, model_shape

logger = logging.getLogger(__name__)


class ThroughputMonitor(TrainerCallback):
    """Computes the monitoring metrics of each training log and prints them as one line."""

    def __init__(self, gpu_hour_price: float | None = None, peak_tflops: float | None = None):
        self.gpu_hour_price = gpu_hour_price
        self.peak_tflops = peak_tflops
        self.shape = None
        self.trains_base = True
        self.devices = 1
        self.cuda = False
        self.tokens = self.positions = 0  # counted since the last log, all processes
        self.paused = 0.0  # seconds of evaluation and saving since the last log

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.devices = args.world_size
        self.cuda = args.device.type == "cuda"
        if self.peak_tflops is None and self.cuda:
            name = torch.cuda.get_device_name(args.device)
            gpu = gpu_type(name)
            self.peak_tflops = GPUS[gpu][1] if gpu else None
            if gpu is None:
                logger.info("MFU not logged: %s is not in plan.hardware.GPUS; set peak_tflops in the recipe", name)
        try:  # the live model: building another one would go through DeepSpeed ZeRO-3's partitioning
            self.shape = model_shape(model.config, model)
        except AttributeError as err:  # no input embeddings or attention heads to count
            logger.info("MFU not logged: cannot count the FLOPs of this model (%s)", err)
        self.trains_base = not hasattr(model, "peft_config")
        previous = [e["elapsed_hours"] for e in state.log_history if "elapsed_hours" in e]
        self.hours_before = previous[-1] if previous else 0.0
        self.session_start = self.window_start = time.perf_counter()
        self.window_step = state.global_step
        self.window_tokens = state.num_input_tokens_seen
        self.tokens = self.positions = 0
        self.paused = 0.0

    def count(self, tokens: int, positions: int) -> None:
        """Tokens trained on, and the sum over them of their sequence's length (for the attention FLOPs)."""
        self.tokens += tokens
        self.positions += positions

    def pause(self, seconds: float) -> None:
        self.paused += seconds

    def training_metrics(self, state) -> dict[str, float]:
        """The metrics of the window since the previous training log; starts the next window."""
        now = time.perf_counter()
        seconds = max(now - self.window_start - self.paused, 1e-9)
        steps = state.global_step - self.window_step
        tokens = state.num_input_tokens_seen - self.window_tokens
        elapsed = self.hours_before + (now - self.session_start) / 3600
        metrics = {"elapsed_hours": elapsed}
        if tokens > 0:
            metrics["tokens_per_second"] = tokens / seconds
        if self.shape is not None and self.peak_tflops and tokens > 0:
            # Mean sequence length over tokens: exact, since FLOPs are linear in it.
            seq_len = self.positions / self.tokens if self.tokens else 0.0
            flops = tokens * flops_per_token(self.shape, seq_len, self.trains_base)
            metrics["mfu"] = flops / seconds / (self.peak_tflops * 1e12 * self.devices)
        if self.cuda:
            metrics["peak_memory_gib"] = torch.cuda.max_memory_allocated() / GIB
        if steps > 0 and state.max_steps > 0:
            metrics["eta_hours"] = (state.max_steps - state.global_step) * seconds / steps / 3600
        if self.gpu_hour_price is not None:
            metrics["cost_so_far"] = elapsed * self.devices * self.gpu_hour_price
            if "eta_hours" in metrics:
                metrics["cost_remaining"] = metrics["eta_hours"] * self.devices * self.gpu_hour_price
        self.window_start, self.window_step, self.window_tokens = now, state.global_step, state.num_input_tokens_seen
        self.tokens = self.positions = 0
        self.paused = 0.0
        return metrics

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs and "elapsed_hours" in logs:
            logger.info(format_line(state, logs))


def format_line(state, logs: dict) -> str:
    """One console line: step, loss, grad norm, lr, tokens/s, MFU, memory, tokens seen, ETA, cost."""
    parts = [f"step {state.global_step}/{state.max_steps}"]
    formats = [
        ("loss", "loss {:.4f}"),
        ("grad_norm", "grad norm {:.3g}"),
        ("learning_rate", "lr {:.3g}"),
        ("tokens_per_second", "{:,.0f} tok/s"),
        ("mfu", "MFU {:.1%}"),
        ("peak_memory_gib", "peak mem {:.1f} GiB"),
        ("num_input_tokens_seen", "{:,} tokens"),
        ("cost_remaining", "cost left {:,.2f}"),
    ]
    parts += [text.format(logs[key]) for key, text in formats if key in logs]
    if "eta_hours" in logs:
        parts.append(f"ETA {datetime.timedelta(seconds=round(logs['eta_hours'] * 3600))}")
    return " | ".join(parts)
