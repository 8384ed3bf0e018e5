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
size = 24 * 2**20  # an activation-sized block, under glibc's largest mmap threshold
block = libc.malloc(size)
ctypes.memset(block, 1, size)  # touch every page
held = resident_mib()
libc.free(block)
print(kept, held - resident_mib())
"""


def returned_mib(mode: str) -> tuple[bool, float]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True).stdout
    kept, returned = out.split()
    return kept == "True", float(returned)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's")
def test_freed_memory_stays_for_the_next_step():
    kept, returned = returned_mib("kept")
    assert kept and returned < 2, returned  # the freed 24 MiB stay resident, ready for reuse
    _, returned = returned_mib("default")
    assert returned > 20, returned  # the C library's default gives them back to the system
