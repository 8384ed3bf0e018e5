"""What a training step does, counted rather than timed: every operator the step dispatches, by name
and by the dtype it computes in, with the elements it writes, and the kernels a GPU would launch
for it (every operator that is not a view). `train_throughput.py --census` runs each arm of a case
under it; `census_gap` then lists what ours does per step that the plain loop does not (or does
less, or in another dtype).

Counts are the same on any machine and at any load, so a CPU run at a small size shows the work a
GPU run would do: a metric over the vocabulary, a mask, a copy to fp32 in a bf16 run, a
recomputation. They say nothing of time; `--profile` does, on the device that matters.
"""

import os
import traceback
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def _first_dtype(args) -> str:
    for arg in args:
        if isinstance(arg, torch.Tensor):
            return str(arg.dtype).removeprefix("torch.")
        if isinstance(arg, list | tuple):
            found = _first_dtype(arg)
            if found != "-":
                return found
    return "-"


def _elements(out) -> int:
    if isinstance(out, torch.Tensor):
        return out.numel()
    if isinstance(out, list | tuple):
        return sum(_elements(o) for o in out)
    return 0


TORCH = os.path.dirname(torch.__file__)


def _caller() -> str:
    """The innermost frame of the Python stack outside torch and this file: who asked."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        counter = frame.filename.endswith("measure.py") and frame.name == "read"  # HostCounter's wrapper
        if not frame.filename.startswith(TORCH) and frame.filename != __file__ and not counter:
            parts = frame.filename.split(os.sep)
            where = os.sep.join(parts[parts.index("site-packages") + 1 :] if "site-packages" in parts else parts[-2:])
            return f"{where}:{frame.lineno} ({frame.name})"
    return "?"


class OperatorCensus(TorchDispatchMode):
    """Counts, while `active`, each dispatched operator by (name, dtype of its first tensor
    argument): calls and the elements of its outputs. Views (no kernel) are counted apart. Each
    read of a value by the host (`_local_scalar_dense`: `.item()`, `bool()`, ... from Python or
    from C++; a wait for the device on a GPU) is also counted by the Python line that asked."""

    def __init__(self):
        super().__init__()
        self.active = False
        self.calls, self.elements, self.reads = Counter(), Counter(), Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.active:
            key = (str(func.overloadpacket.__name__), _first_dtype(args), bool(func.is_view))
            self.calls[key] += 1
            self.elements[key] += _elements(out)
            if key[0] == "_local_scalar_dense":
                self.reads[_caller()] += 1
        return out

    def table(self, steps: int) -> dict:
        """Per step: kernels (non-view operators), the elements they write by dtype, and each
        operator's calls and elements."""
        rows = [
            {"operator": name, "dtype": dtype, "view": view, "calls_per_step": calls / steps,
             "elements_per_step": self.elements[(name, dtype, view)] / steps}
            for (name, dtype, view), calls in self.calls.items()
        ]  # fmt: skip
        by_dtype = Counter()
        for row in rows:
            if not row["view"]:
                by_dtype[row["dtype"]] += row["elements_per_step"]
        return {
            "kernels_per_step": sum(r["calls_per_step"] for r in rows if not r["view"]),
            "host_reads_per_step": {site: n / steps for site, n in self.reads.most_common()},
            "elements_per_step_by_dtype": dict(by_dtype),
            "operators": sorted(rows, key=lambda r: r["elements_per_step"], reverse=True),
        }


def census_gap(ours: dict, other: dict, count: int = 30) -> list[dict] | None:
    """The (operator, dtype) pairs whose calls or elements per step differ between ours and the
    other arm, by the elements' difference: work one arm does and the other does not."""
    if not ours.get("census") or not other.get("census"):
        return None

    def keyed(census):
        return {(r["operator"], r["dtype"]): r for r in census["operators"] if not r["view"]}

    mine, theirs = keyed(ours["census"]), keyed(other["census"])
    none = {"calls_per_step": 0.0, "elements_per_step": 0.0}
    rows = []
    for key in mine.keys() | theirs.keys():
        a, b = mine.get(key, none), theirs.get(key, none)
        if a["calls_per_step"] != b["calls_per_step"] or a["elements_per_step"] != b["elements_per_step"]:
            rows.append({
                "operator": key[0], "dtype": key[1],
                "ours_calls": a["calls_per_step"], "other_calls": b["calls_per_step"],
                "ours_elements": a["elements_per_step"], "other_elements": b["elements_per_step"],
                "extra_elements": a["elements_per_step"] - b["elements_per_step"],
            })  # fmt: skip
    return sorted(rows, key=lambda r: abs(r["extra_elements"]), reverse=True)[:count]
