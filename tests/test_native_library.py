"""models.kernels.native.library's process-wide allocator option (retain_freed_memory)."""

import platform
import subprocess
import sys

import pytest

CHECK = """
import torch
from models.kernels.native.library import retain_freed_memory

def rss_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

retain = {retain}
if retain:
    assert retain_freed_memory() is True
before = rss_mib()
x = torch.ones(200 * 2**20 // 4)  # 200 MiB, touched
del x
print(rss_mib() - before)
"""


@pytest.mark.skipif(platform.system() != "Linux" or not platform.libc_ver()[0] == "glibc", reason="glibc only")
def test_retain_freed_memory_keeps_a_freed_block_resident():
    """By default a freed 200 MiB tensor goes back to the system (a fresh mapping: its pages are
    zeroed again on the next first touch); after retain_freed_memory() it stays resident for reuse."""
    grown = []
    for retain in (False, True):
        out = subprocess.run([sys.executable, "-c", CHECK.format(retain=retain)], capture_output=True, text=True,
                             check=True)
        grown.append(float(out.stdout.strip().splitlines()[-1]))
    assert grown[0] < 50 and grown[1] > 150, grown
