"""Keep freed host memory inside the process, as CUDA's caching allocator keeps freed GPU memory.

PyTorch allocates CPU tensors with the C library's malloc. glibc serves blocks above its mmap
threshold (at most 32 MiB on 64-bit Linux, adjusted at run time) with fresh ``mmap`` pages and
returns them on ``free``, so every large tensor a training step creates (logits, their gradient,
an output head's GEMM result) faults its pages in again: on the 2-core VM this project is tested
on that costs ~0.8 ms per MB, a 32 MB tensor ~26 ms, more than the kernel that fills it. A GPU
training step never pays this (the caching allocator reuses blocks), so neither should the CPU
runtime that stands in for it, nor the profiler that calibrates the cost model for it.

``keep_freed_memory()`` raises glibc's mmap and trim thresholds (``mallopt``) so that large blocks
come from the heap and stay there after ``free``; it does nothing (and says so) elsewhere. The
PyTorch CPU performance guide recommends a caching allocator (jemalloc, tcmalloc) for the same
reason: https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""glibc's mallopt parameters (malloc.h)."""
MMAP_THRESHOLD = 1 << 30
"""Blocks up to 1 GiB come from the heap."""
TRIM_THRESHOLD = 2 ** 31 - 1
"""Free memory at the top of the heap goes back to the kernel only beyond 2 GiB (the largest
value mallopt takes)."""

def keep_freed_memory() -> bool:
    """Make this process keep freed blocks for reuse; True where it took effect (glibc). Call
    before the first large allocation; calling again sets the same thresholds (two mallopt
    calls)."""
    return _set_thresholds()


def _mallopt():
    """glibc's mallopt, or None (not Linux, not glibc: musl has none)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return mallopt


def _set_thresholds() -> bool:
    mallopt = _mallopt()
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))

