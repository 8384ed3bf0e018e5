"""CPU training keeps freed memory in the process (medrecipes.allocator): a large buffer freed
and taken again does not go back to the system in between."""

import platform
import subprocess
import sys

import pytest

PROBE = """
import ctypes, sys
from medrecipes.allocator import keep_freed_memory

def resident_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20

kept = keep_freed_memory() if sys.argv[1] == "kept" else False
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
returned = []
for size in (24 * 2**20, 200 * 2**20):  # an activation's size, and an embedding gradient's
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)  # touch every page
    held = resident_mib()
    libc.free(block)
    returned.append(held - resident_mib())
print(kept, max(returned), min(returned))
"""


def returned_mib(mode: str) -> tuple[bool, float, float]:
    """Whether the setting took, and the most and least MiB given back of the blocks freed."""
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True).stdout
    kept, most, least = out.split()
    return kept == "True", float(most), float(least)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's")
def test_freed_memory_stays_for_the_next_step():
    kept, most, _ = returned_mib("kept")
    assert kept and most < 2, most  # the freed blocks stay resident, ready for reuse
    _, _, least = returned_mib("default")
    assert least > 20, least  # the C library's default gives each back to the system
