"""benchmarks/fused_head.py on a tiny Gemma 3: both ways of scoring run on every shape, give the
same loss and write their figures. No speed is asserted."""

import json

import pytest
from conftest import PYTHON, ROOT, run_ok

pytestmark = pytest.mark.long  # a benchmark's own check: make test-long


def test_fused_head_benchmark_runs_both_ways(tmp_path):
    out = tmp_path / "fused_head.json"
    architecture = ROOT / "benchmarks" / "configs" / "architectures" / "tiny-gemma3-text.json"
    run_ok(PYTHON, "benchmarks/fused_head.py", "--architecture", architecture, "--repeats", "2", "--out", out)
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["repeats"] == 2
    assert set(report["shapes"]) == {"sft-free", "sft-long", "cpt"}
    for figures in report["shapes"].values():
        assert set(figures["seconds a step"]) == {"every position", "labelled only"}
        assert all(seconds > 0 for seconds in figures["seconds a step"].values())
        assert len(figures["speed-up (median, range)"]) == 3
