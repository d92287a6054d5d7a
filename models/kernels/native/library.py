"""Building and loading the native CPU kernels' C library (kernels.c and its *_body.h files).

Build: compiled once per machine with the system C compiler ($CC, else cc, gcc or clang;
-O3 -fopenmp-simd -fno-trapping-math, no -ffast-math, no -march; libm and POSIX threads linked) into a cache directory
($INTERP_SEQ_CACHE, else $XDG_CACHE_HOME/interp-seq, else ~/.cache/interp-seq), the file name
keyed by a hash of the sources, flags and machine type; built under a temporary name and renamed
into place atomically, so parallel processes do not race. On x86-64 with glibc every kernel is
also compiled for x86-64-v4 (AVX-512) and x86-64-v3 (AVX2 and FMA) and the clone is picked at load
time by the dynamic loader (ifunc; CLONES and CONTRACT in kernels.c). Loaded with ctypes;
`function(name, argtypes)` returns one of its entry points, called on contiguous CPU tensors
through `ptr(tensor)` (their data_ptr()). `available()` says whether it built;
`unavailable_reason()` says why not (diag_scan's impl="auto" then falls back to chunked, and
impl="native" raises).

Large outputs are advised as transparent huge pages (`empty`): on the shared VM this was measured
on, first-touch page faults of fresh gradient tensors cost about as much as the backward itself.
threads_for(nbytes) how many threads a kernel that can share its work (threads.h) may use.

Memory model of the checkpointed backwards (diag.py, selective.py, complex.py, rwkv7.py: there one
head of one batch row is a row, B H of them, with w = 1). With S the bytes
of one step's state (one batch row), w the states a backward keeps per recomputed step (its span
factor: 2 for all three, the states and adjoints of the diagonal scan (its buffer holds a third
row for grad c), the states and exp(dt A) of the selective scan, the complex states and
transitions of the complex kernels) and k the steps between checkpoints, a forward that a
gradient can flow through keeps B ceil(T / k) S bytes of checkpoints until the backward, and the
backward adds one span buffer of about w k S bytes per thread. `span_spacing` picks

    k = max(min(chunk, SPAN_BYTES // (w S)),  ceil(sqrt(B T / (w threads))))   (at most T)

the first term the cache-sized span (SPAN_BYTES, L2-sized: what makes the small-state kernels
fast), the second the k that minimises the sum B T S / k + threads w k S. So for any state
size the checkpoints stay within (sqrt(B T w threads) + B) S bytes, and the span buffers within
threads (w k + 1) S, which is at most the larger of about threads SPAN_BYTES and
(sqrt(B T w threads) + threads (w + 1)) S: O(sqrt(B T)) states, never all T of them (the old
cache-only rule gave k = 1, every state kept, for a state over SPAN_BYTES / w). The recomputation
is the same for any k (each step is recomputed once), and the results are bit-equal for any k.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import platform
import shutil
import subprocess
from pathlib import Path

import torch

from models.storage.writer import write_file

HERE = Path(__file__).resolve().parent
SOURCES = (HERE / "kernels.c", HERE / "threads.h", HERE / "diag_body.h", HERE / "delta_body.h", HERE / "selective_body.h",
           HERE / "complex_body.h", HERE / "lstm_body.h", HERE / "softmax_body.h", HERE / "rwkv7_body.h")
# -fno-trapping-math lets selects (exp_f32's clamps) vectorise; it changes no value. -std=c99 turns
# contraction into fused multiply-adds off (kernels.c turns it on for the kernels that gain: CONTRACT)
FLAGS = ["-O3", "-std=c99", "-fPIC", "-shared", "-fopenmp-simd", "-fno-trapping-math"]
LIBS = ["-lm", "-pthread"]
SUFFIX = {torch.float32: "f32", torch.float64: "f64", torch.complex64: "c64", torch.complex128: "c128"}
SPAN_BYTES = 256 * 1024  # a backward's span of states and adjoints stays within this (L2-sized)
THREAD_MIN_BYTES = 4 << 20  # a kernel's thread gets at least this much traffic (threads_for)

P, I, D = ctypes.c_void_p, ctypes.c_int64, ctypes.c_double  # the C arguments: pointer, int64_t, double


def _cache_dir() -> Path:
    if os.environ.get("INTERP_SEQ_CACHE"):
        return Path(os.environ["INTERP_SEQ_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "interp-seq"


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


class _BuildFailed(Exception):
    """The compiler failed or timed out (its message says which)."""


def _build(compiler: str, target: Path) -> str:
    """Compile into a temporary file next to target and rename it into place (models.storage.writer:
    atomic, so a concurrent build of the same source wins either way). Returns "" or what went
    wrong."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        write_file(target, lambda tmp: _compile(compiler, tmp))
    except _BuildFailed as failed:
        return str(failed)
    return ""


def _compile(compiler: str, out: str) -> None:
    cmd = [compiler, *FLAGS, str(SOURCES[0]), "-o", out, *LIBS]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        raise _BuildFailed(f"compiling {SOURCES[0].name} with {compiler} took over 300 s") from None
    if done.returncode != 0:
        raise _BuildFailed(f"compiling {SOURCES[0].name} with {compiler} failed: {done.stderr.strip()[-2000:]}")


@functools.lru_cache(maxsize=None)
def _load() -> tuple[ctypes.CDLL | None, str]:
    """(the library, "") or (None, why it is not available). Built at most once per source hash."""
    compiler = _compiler()
    if compiler is None:
        return None, "no C compiler found ($CC, cc, gcc, clang)"
    try:
        key = hashlib.sha256()
        for path in SOURCES:
            key.update(path.read_bytes())
        key.update(" ".join(FLAGS + LIBS + [platform.machine(), platform.system()]).encode())
        target = _cache_dir() / f"interp_seq_native-{key.hexdigest()[:16]}.so"
        if not target.exists():
            error = _build(compiler, target)
            if error:
                return None, error
        return ctypes.CDLL(str(target)), ""
    except OSError as err:
        return None, f"building or loading the native kernels failed: {err}"


def available() -> bool:
    return _load()[0] is not None


def unavailable_reason() -> str:
    return _load()[1]


def function(name: str, argtypes: list) -> ctypes._CFuncPtr:
    """The library's entry point `name` with its argument types set (callers check available())."""
    lib, why = _load()
    if lib is None:
        raise ValueError(f"the native kernels are not available here: {why}")
    fn = getattr(lib, name)  # ctypes caches it on the library: argtypes are set once
    if fn.argtypes is None:
        fn.argtypes = argtypes
    return fn


def span_spacing(chunk: int, step_bytes: int, span_factor: int, batch: int, length: int,
                 threads: int = 1) -> int:
    """Steps between a checkpointed backward's checkpoints (the module docstring's memory model):
    the cache-sized span min(chunk, SPAN_BYTES // (span_factor step_bytes)) or, where more
    checkpoints than that would be kept, ceil(sqrt(batch length / (span_factor threads))), the
    spacing that minimises checkpoints plus span buffers; at least 1, at most max(length, 1)
    beyond the cache-sized span. step_bytes: one step's state (one batch row); span_factor: the
    states the backward keeps per recomputed step; threads: span buffers live at once."""
    for name, value, least in (("chunk", chunk, 1), ("step_bytes", step_bytes, 1), ("span_factor", span_factor, 1),
                               ("batch", batch, 0), ("length", length, 0), ("threads", threads, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"span_spacing: {name} must be an int >= {least}; got {value!r}")
    cache = max(1, min(chunk, SPAN_BYTES // (span_factor * step_bytes)))
    balanced = math.ceil(math.sqrt(batch * length / (span_factor * threads)))
    return max(cache, min(balanced, max(length, 1)))


def ptr(x: torch.Tensor | None) -> int | None:
    return None if x is None else x.data_ptr()


def threads_for(nbytes: int) -> int:
    """Threads for a kernel call that moves nbytes: torch.get_num_threads() (so a process set to
    one thread stays on one), fewer where a thread would get under THREAD_MIN_BYTES (starting and
    joining one cost about 80 microseconds here, what moving 2 MiB takes: with 2 MiB a thread the
    diagonal scan's forward ran slower on two threads than on one). The kernel uses at most as
    many as it has units."""
    return max(1, min(torch.get_num_threads(), nbytes // THREAD_MIN_BYTES))


HUGE = 2 << 20  # transparent huge page size on x86-64 / most arm64 Linux
_MADV_HUGEPAGE = 14


@functools.lru_cache(maxsize=None)
def _libc():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None


def empty(shape, like: torch.Tensor) -> torch.Tensor:
    """torch.empty for a large output the kernel is about to write: on Linux, the whole 2 MiB
    pages inside it are advised as huge pages (madvise; a no-op where THP is off), so writing a
    freshly mapped tensor takes one page fault per 2 MiB instead of per 4 KiB."""
    out = like.new_empty(shape)
    nbytes = out.numel() * out.element_size()
    libc = _libc() if platform.system() == "Linux" and nbytes >= 2 * HUGE else None
    if libc is not None:
        start = -(-out.data_ptr() // HUGE) * HUGE
        end = (out.data_ptr() + nbytes) // HUGE * HUGE
        if end > start:
            libc.madvise(start, end - start, _MADV_HUGEPAGE)  # advice only: failure changes nothing
    return out


def fresh(shape, like: torch.Tensor) -> torch.Tensor:
    """An uninitialised output tensor like `like`: `empty` (huge-page advised) on the CPU,
    new_empty elsewhere (for tensors that may live on another device)."""
    return empty(shape, like) if like.device.type == "cpu" else like.new_empty(shape)


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters


def retain_freed_memory(max_bytes: int = 1 << 30) -> bool:
    """Opt-in, process-wide: let glibc keep freed blocks up to max_bytes for reuse instead of
    returning them to the system (mallopt M_MMAP_THRESHOLD and M_TRIM_THRESHOLD). Fresh large
    tensors (gradients, cached patterns) then reuse pages already touched, where by default every
    block over 32 MiB is a fresh mapping whose pages the kernel zeroes on first touch: measured
    here, diag_scan forward+backward at 290 MiB 78-86 -> 59-68 ms and the Transformer's every-hook
    cache + backward 245-247 -> 211 ms (benchmarks/RESULTS.md). The price: the process's resident
    memory stays at its high-water mark. Returns whether the allocator took the settings (False
    off glibc)."""
    if platform.system() != "Linux":
        return False
    try:
        libc = ctypes.CDLL(None)
        ok = libc.mallopt(_M_MMAP_THRESHOLD, int(max_bytes)) == 1
        return ok and libc.mallopt(_M_TRIM_THRESHOLD, int(min(2 * max_bytes, 2**31 - 1))) == 1
    except (OSError, AttributeError):
        return False
