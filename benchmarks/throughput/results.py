"""Running the arms of a case and what its results file holds: each run's record or the error that
stopped it, the ratios of ours to the plain trainer and the plain loop (whole runs, windows,
repeats), the versions and the memory plan."""

import gc
import json
import platform
import re
import shlex
import statistics
import sys
import time
from pathlib import Path

from .arms import Bench, device_name
from .cases import ROOT
from .measure import TimedOut, add_mfu, check_timed_out, profile_gap, train_measured
from .op_census import census_gap
from .plain_loop import PlainLoop

REFERENCE_GPU = "h100-80gb"  # the card `plan` estimates memory for when the run is not on a listed GPU


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
    check_timed_out()
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
