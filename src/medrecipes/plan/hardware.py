"""The GPUs a plan is made for: memory and dense bf16 peak by type (vendor data sheets), the type
of the device a run is on, and the hardware a run records about itself (`hardware`)."""

import os

GIB = 2**30


# Usable memory per device (GiB) and dense bf16 peak (TFLOP/s) by GPU type (vendor data sheets,
# without sparsity; SXM parts where there is a choice).
GPUS = {
    "b200-180gb": (180, 2250),
    "h100-80gb": (80, 989),
    "h200-141gb": (141, 989),
    "a100-80gb": (80, 312),
    "a100-40gb": (40, 312),
    "l40s-48gb": (48, 362),
    "a6000-48gb": (48, 155),
    "a10g-24gb": (24, 70),
    "rtx4090-24gb": (24, 165),
}


# How `torch.cuda.get_device_name()` spells each GPU type of the table, most specific first.
DEVICE_NAMES = (
    ("B200", "b200-180gb"),
    ("H200", "h200-141gb"),
    ("H100", "h100-80gb"),
    ("A100-SXM4-40GB", "a100-40gb"),
    ("A100-PCIE-40GB", "a100-40gb"),
    ("A100", "a100-80gb"),
    ("L40S", "l40s-48gb"),
    ("A6000", "a6000-48gb"),
    ("A10G", "a10g-24gb"),
    ("4090", "rtx4090-24gb"),
)


def gpu_type(device_name: str) -> str | None:
    """The GPUS key of a CUDA device name such as 'NVIDIA H100 80GB HBM3', or None if not listed."""
    for fragment, key in DEVICE_NAMES:
        if fragment.lower() in device_name.lower():
            return key
    return None


DISTRIBUTION = {"NO": "one process", "MULTI_GPU": "DDP", "MULTI_CPU": "DDP", "FSDP": "FSDP"}


def hardware(trainer) -> str:
    """'8 x NVIDIA H100 80GB HBM3, 1 node, DeepSpeed ZeRO-3' for the run's accelerator: what the
    run records in run.json and its model card shows (below training and publishing, both read it)."""
    import torch

    processes = trainer.accelerator.num_processes
    nodes = max(1, processes // int(os.environ.get("LOCAL_WORLD_SIZE", processes)))
    device = torch.cuda.get_device_name() if trainer.args.device.type == "cuda" else "CPU"
    kind = trainer.accelerator.distributed_type.value
    plugin = trainer.accelerator.state.deepspeed_plugin
    distribution = f"DeepSpeed ZeRO-{plugin.zero_stage}" if plugin is not None else DISTRIBUTION.get(kind, kind)
    return f"{processes} x {device}, {nodes} node{'s' if nodes > 1 else ''}, {distribution}"
