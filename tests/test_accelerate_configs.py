"""Every accelerate config loads as accelerate reads it and says in its first line when to use it."""

from pathlib import Path

import pytest
from accelerate.commands.config.config_args import load_config_from_file
from conftest import ROOT

CONFIGS = sorted((ROOT / "accelerate_configs").glob("*.yaml"))
EXPECTED = {
    "ddp": ("MULTI_GPU", None),
    "zero2": ("DEEPSPEED", 2),
    "zero3": ("DEEPSPEED", 3),
    "zero3_offload": ("DEEPSPEED", 3),
    "fsdp": ("FSDP", None),
}


def test_the_five_strategies_are_there():
    assert sorted(p.stem for p in CONFIGS) == sorted(EXPECTED)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_loads_and_is_documented(path: Path):
    first = path.read_text().splitlines()[0]
    assert first.startswith("# ") and len(first) > 30
    config = load_config_from_file(str(path))
    distributed_type, zero_stage = EXPECTED[path.stem]
    assert str(config.distributed_type).endswith(distributed_type)
    if zero_stage is not None:
        assert config.deepspeed_config["zero_stage"] == zero_stage
    if path.stem == "zero3_offload":
        assert config.deepspeed_config["offload_optimizer_device"] == "cpu"
    if path.stem == "fsdp":
        assert config.fsdp_config["fsdp_version"] == 2
