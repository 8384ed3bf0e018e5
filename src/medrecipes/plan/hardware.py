"""The GPUs a plan is made for: memory and dense bf16 peak by type (vendor data sheets), and the
type of the device a run is on."""

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
