"""The native (plain C) diagonal scan against the naive loop, and the C library's build / fallback behaviour."""

import pytest
import torch

from models.kernels import diag_scan
from models.kernels.native import library
from tests.test_kernels_diag import CASES, make_problem, rel_err, run

needs_native = pytest.mark.skipif(
    not library.available(), reason=f"native scan unavailable: {library.unavailable_reason()}"
)


@needs_native
@pytest.mark.parametrize("kind,batch,length,state,readout,chunk", CASES)
def test_native_matches_naive(kind, batch, length, state, readout, chunk):
    a, b, c, h0 = make_problem(kind, batch, length, state, seed=length, readout=readout)
    export_at = [length - 1, 0, length // 2, length // 2, -1] + list(range(chunk - 1, length, chunk))
    ref_out, ref_grads = run("naive", a, b, c, h0, export_at)
    got_out, got_grads = run("native", a, b, c, h0, export_at, chunk=chunk)
    for got, ref in zip(got_out + got_grads, ref_out + ref_grads):
        assert got.shape == ref.shape and got.dtype == ref.dtype
        assert rel_err(got, ref) <= 1e-5


@needs_native
@pytest.mark.parametrize("kind,batch,length,state,readout", [
    ("decay", 2, 301, (4, 512), "shared"),  # 2048 entries a step: spans of 16 steps, 19 of them
    ("negative", 1, 257, (3, 7), "full"),   # rows of 21 floats: the streamed rows start unaligned
    ("complex", 2, 199, (2, 300), "full"),  # complex64, spans of 27 steps
    ("decay", 3, 129, (5, 33), None),       # every state out, T = 2 spans + 1
])
def test_native_long_odd_sequences_with_wide_states_match_naive(kind, batch, length, state, readout):
    """The backward's span walk (recompute, adjoints, streamed gradients, prefetch of the next span)
    over more spans than one, a last span shorter than the rest, and rows not 16-byte aligned.
    Against the loop in double precision: over 300 steps of decay near 1 the float32 loop itself
    drifts by 3e-5 in the gradients."""
    a, b, c, h0 = make_problem(kind, batch, length, state, seed=length, readout=readout)
    export_at = [length - 1, 0, length // 2, 17, 17]
    wide = {torch.float32: torch.float64, torch.complex64: torch.complex128}
    ref_out, ref_grads = run("naive", *(None if x is None else x.to(wide[x.dtype]) for x in (a, b, c, h0)), export_at)
    got_out, got_grads = run("native", a, b, c, h0, export_at, chunk=64)
    for got, ref in zip(got_out + got_grads, ref_out + ref_grads):
        assert got.shape == ref.shape and got.dtype == {v: k for k, v in wide.items()}[ref.dtype]
        assert rel_err(got.to(ref.dtype), ref) <= 1e-5


@needs_native
@pytest.mark.parametrize("readout", [None, "shared", "full"])
@pytest.mark.parametrize("kind", ["negative", "complex"])
def test_native_with_pins_matches_naive(kind, readout):
    a, b, c, h0 = make_problem(kind, 3, 19, (2, 3), seed=11, readout=readout)
    mask = torch.zeros(3, 19, dtype=torch.bool)
    mask[0, 0] = mask[2, 6] = mask[1, 6] = mask[0, 18] = True
    pins = (mask, torch.randn(3, 19, 2, 3, dtype=a.dtype))
    ref_out, ref_grads = run("naive", a, b, c, h0, "chunks", pins=pins)
    got_out, got_grads = run("native", a, b, c, h0, "chunks", pins=pins)
    for got, ref in zip(got_out + got_grads, ref_out + ref_grads):
        assert rel_err(got, ref) <= 1e-5


@needs_native
def test_native_steps_before_a_pin_keep_their_bits():
    """The loop's association order does not depend on where the sequence is split."""
    a, b, c, h0 = make_problem("decay", 2, 40, (3, 4), seed=12, readout="shared")
    clean = diag_scan(a, b, c, initial_state=h0, impl="native").output
    patched = diag_scan(a, b, c, initial_state=h0, patches={23: torch.randn(2, 3, 4)}, impl="native").output
    assert torch.equal(patched[:, :23], clean[:, :23])
    assert (patched[:, 23:] - clean[:, 23:]).abs().max() > 1e-3


@needs_native
@pytest.mark.parametrize("kind,readout,dtype", [
    ("negative", "shared", torch.float64), ("near_zero", None, torch.float64),
    ("complex", "shared", torch.complex128), ("unit", "full", torch.complex128),
])
def test_native_gradcheck_float64(kind, readout, dtype):
    a, b, c, h0 = make_problem(kind, 2, 7, (2, 2), seed=3, readout=readout, dtype=torch.float64)
    assert a.dtype == dtype
    c = None if c is None else c.to(dtype)
    mask = torch.zeros(2, 7, dtype=torch.bool)
    mask[1, 4] = True
    values = torch.randn(2, 7, 2, 2, dtype=dtype)
    inputs = [x.clone().requires_grad_() for x in (a, b, h0, values)] + ([] if c is None else [c.clone().requires_grad_()])

    def fn(a, b, h0, values, *c):
        res = diag_scan(a, b, c[0] if c else None, initial_state=h0, output_final_state=True,
                        export_at=[2, 6, 2, 0], pins=(mask, values), impl="native", chunk_size=2)
        return tuple(res)

    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-6)


@needs_native
def test_checkpoint_spacing_changes_no_bits():
    """chunk_size is only the backward's checkpoint spacing: the recomputed states are the
    forward's, so outputs and gradients are bit for bit the same for any spacing."""
    a, b, c, h0 = make_problem("negative", 2, 21, (2, 5), seed=13, readout="shared")
    out2, grads2 = run("native", a, b, c, h0, [3, 20], chunk=2)
    out64, grads64 = run("native", a, b, c, h0, [3, 20], chunk=64)
    for x, y in zip(out2 + grads2, out64 + grads64):
        assert torch.equal(x, y)
    with torch.no_grad():  # the forward without checkpoints (no gradient wanted) gives the same bits
        plain = diag_scan(a, b, c, initial_state=h0, output_final_state=True, export_at=[3, 20], impl="native")
    for x, y in zip(plain, out2):
        assert torch.equal(x, y)


@needs_native
@pytest.mark.parametrize("kind,batch,length,state,readout", [
    ("decay", 2, 301, (4, 512), "shared"),  # 2 rows for 3 / 5 threads: the forward splits channels
    ("negative", 1, 257, (3, 7), "full"),   # one row: blocks of 1-2 channels, unaligned streamed rows
    ("complex", 3, 199, (2, 300), "full"),  # 3 rows, 2 threads: 2 channel blocks a row
    ("decay", 5, 129, (5, 33), None),       # every state out, T = 2 spans + 1
    ("negative", 4, 37, (3, 4), "shared"),  # rows split evenly (2 threads), unevenly (3, 5)
])
@pytest.mark.parametrize("threads", [2, 3, 5])
def test_native_threads_give_the_single_thread_bits(monkeypatch, kind, batch, length, state, readout, threads):
    """Batch rows and blocks of channels shared among threads (threads.h) change no bit of any
    output or gradient, over several backward spans, odd lengths and more threads than rows."""
    a, b, c, h0 = make_problem(kind, batch, length, state, seed=length, readout=readout)
    export_at = [length - 1, 0, length // 2, 17, 17]
    monkeypatch.setattr(library, "THREAD_MIN_BYTES", 1)  # threads even for these small inputs
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        ref_out, ref_grads = run("native", a, b, c, h0, export_at, chunk=64)
        torch.set_num_threads(threads)
        assert library.threads_for(1 << 30) == threads
        got_out, got_grads = run("native", a, b, c, h0, export_at, chunk=64)
    finally:
        torch.set_num_threads(previous)
    for got, ref in zip(got_out + got_grads, ref_out + ref_grads):
        assert torch.equal(got, ref)


def test_threads_for_follows_torch_and_the_work_size(monkeypatch):
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert library.threads_for(64 * library.THREAD_MIN_BYTES) == 2
        assert library.threads_for(library.THREAD_MIN_BYTES + 1) == 1  # too little for a second
        assert library.threads_for(0) == 1
        torch.set_num_threads(1)
        assert library.threads_for(64 * library.THREAD_MIN_BYTES) == 1
    finally:
        torch.set_num_threads(previous)


@needs_native
def test_native_non_contiguous_inputs():
    a, b, c, h0 = make_problem("negative", 2, 9, (3, 4), seed=5, readout="full")
    permuted = lambda x: x.movedim(1, -1).contiguous().movedim(-1, 1)  # noqa: E731
    a, b, c = permuted(a), permuted(b), permuted(c)
    ref_out, ref_grads = run("naive", a, b, c, h0, [0, 4, 8])
    got_out, got_grads = run("native", a, b, c, h0, [0, 4, 8])
    for got, ref in zip(got_out + got_grads, ref_out + ref_grads):
        assert rel_err(got, ref) <= 1e-5


@needs_native
def test_auto_is_native_on_cpu_for_its_dtypes():
    a, b, c, _ = make_problem("decay", 2, 10, (3, 4), seed=8, readout="shared")
    assert torch.equal(diag_scan(a, b, c).output, diag_scan(a, b, c, impl="native").output)
    half = diag_scan(a.bfloat16(), b.bfloat16(), c.bfloat16()).output  # not native: chunked
    assert torch.equal(half, diag_scan(a.bfloat16(), b.bfloat16(), c.bfloat16(), impl="chunked").output)
    with pytest.raises(ValueError, match="impl='native' supports"):
        diag_scan(a.bfloat16(), b.bfloat16(), impl="native")


def test_without_a_compiler_auto_falls_back_and_native_raises(monkeypatch, tmp_path):
    a, b, c, _ = make_problem("decay", 2, 10, (3, 4), seed=8, readout="shared")
    monkeypatch.setenv("INTERP_SEQ_CACHE", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))  # no cc, gcc or clang
    monkeypatch.delenv("CC", raising=False)
    library._load.cache_clear()
    try:
        assert not library.available()
        assert "no C compiler" in library.unavailable_reason()
        assert torch.equal(diag_scan(a, b, c).output, diag_scan(a, b, c, impl="chunked").output)
        with pytest.raises(ValueError, match="impl='native' is not available here: no C compiler"):
            diag_scan(a, b, c, impl="native")
        monkeypatch.setenv("CC", "false")  # a "compiler" that fails
        monkeypatch.setenv("PATH", "/usr/bin:/bin")
        library._load.cache_clear()
        assert not library.available() and "failed" in library.unavailable_reason()
        assert not list(tmp_path.iterdir())  # no half-built library left behind
    finally:
        monkeypatch.undo()
        library._load.cache_clear()


@needs_native
def test_builds_into_the_cache_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("INTERP_SEQ_CACHE", str(tmp_path / "cache"))
    library._load.cache_clear()
    try:
        assert library.available()
        built = list((tmp_path / "cache").iterdir())
        assert len(built) == 1 and built[0].name.startswith("interp_seq_native-") and built[0].suffix == ".so"
        a, b, c, h0 = make_problem("decay", 1, 5, (2, 3), seed=1, readout="shared")
        torch.testing.assert_close(diag_scan(a, b, c, impl="native").output,
                                   diag_scan(a, b, c, impl="naive").output, rtol=1e-6, atol=1e-6)
    finally:
        monkeypatch.undo()
        library._load.cache_clear()


def test_every_c_source_is_hashed_and_shipped_as_package_data():
    import tomllib
    from pathlib import Path

    here = Path(library.__file__).parent
    assert set(library.SOURCES) == set(here.glob("*.c")) | set(here.glob("*.h"))  # all in the build's hash
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["models.kernels.native"]
    assert all(any(path.match(g) for g in globs) for path in library.SOURCES)
