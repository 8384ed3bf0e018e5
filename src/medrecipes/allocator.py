"""The C library's memory allocator, set for training on a CPU.

A training step on a CPU allocates and frees the same large buffers every step (activations,
their gradients, attention scores). glibc's malloc hands freed memory at the top of its heap
back to the system once more than its trim threshold is free, and serves large blocks from
mappings of their own, unmapped when freed; the next step then asks the system again, and the kernel zeroes every page on
its first touch. On a CPU run of SmolLM2-135M's size that is a large share of the step, and
more for a run that keeps more activations (docs/benchmarks.md: the allocator ablation).

`keep_freed_memory` keeps freed memory in the process for the next step: the process's peak
memory is the same, it is only not returned between steps. The recipes call it when they train
on a CPU; on a GPU host memory is not what a step waits for, and the setting is left alone.
"""

import ctypes
import logging
import platform

logger = logging.getLogger(__name__)

# mallopt parameters (glibc's malloc.h) and the values set: every block from the heap (glibc
# would give a large block a mapping of its own and unmap it when freed), and the heap's free
# top never given back.
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4
SETTINGS = (
    (M_MMAP_MAX, 0, "mmap max"),
    (M_TRIM_THRESHOLD, 2**31 - 1, "trim threshold"),
    (M_TOP_PAD, 64 * 2**20, "top pad"),  # grow the heap 64 MiB beyond each request: fewer system calls
)


def keep_freed_memory() -> bool:
    """Set glibc's malloc to keep freed memory for reuse (mallopt, this process, once is enough);
    True where it took the settings, False where the C library is not glibc (musl, macOS,
    Windows), which keeps its own behaviour."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    refused = [name for parameter, value, name in SETTINGS if mallopt(parameter, value) != 1]
    if refused:
        logger.warning("glibc refused the allocator's %s; CPU training keeps its default", ", ".join(refused))
    return not refused
