"""Jacobians of recurrent mixers along real input sequences, their spectra, and Theorem 1.

A recurrent mixer (models/mixers/base.py) runs h_t = step(inputs_t, h_{t-1}) with per-step inputs
from prepare(x), x the mixer input (`blocks.{l}.mixer.hook_in`). Along a real sequence:

    J_t = d h_t / d h_{t-1}   evaluated at (inputs_t, h_{t-1}), a matrix [n, n] (rows: outputs),
                              n = prod(state_shape); position t is 0-based, h_{-1} = initial state.

Two ways to compute it:
    "autograd"    torch.func.jacrev of one example's step, vmapped over positions (any mixer);
    "structured"  affine mixers (is_affine): J_t = transition(inputs_t), either diagonal [*S]
                  (h_t = a_t * h_{t-1} + b_t) or dense [n, n]; no differentiation at all.
Both must agree; "auto" picks "structured" when the mixer is affine.

Spectra per step: eigenvalues (sorted by modulus, largest first), singular values (largest first),
spectral radius, largest singular value. Restriction to the state-distinguishing subspace U with
orthonormal basis Q [n, k] (probes.subspace.state_subspace(...).basis): Q^T J Q [k, k], the matrix of
P_U J P_U on U. `restricted_jacobians` computes Q^T J Q directly (k forward-mode products J Q per
position instead of n backward ones) so that it stays cheap for wide nonlinear models.

Words: for positions start..stop-1, the return map's Jacobian J_word = J_{stop-1} ... J_{start}
maps h_{start-1} to h_{stop-1}. Theorem 1 of seed 000 (docs/drift.md): if an affine model maps every centroid back
to itself along a word that returns every state to itself, Q^T J_word Q = I (drift along U is never
corrected). `theorem1_check` measures ||Q^T J_word Q - I||_2; `centroid_return_error` checks the
premise by running the word from every centroid.

The contraction summary of a model is the largest singular value of Q^T J_t Q over steps
(`contraction(model, tokens, basis, layer)`, or `contraction_summary(Q^T J Q)`).

Complex states (S4D, AUSSM, Mamba-3): J_t is the complex derivative [n, n] of a step that is
complex-linear in the state (autograd differentiates the realified step and checks the
Cauchy-Riemann equations, raising if they fail). Probes see complex states as real vectors
view_as_real(h).flatten() of size 2n, so a basis Q for them is [2n, k], and restriction uses the
realified Jacobian (`Jacobians.realified()`, 2 x 2 blocks [[Re, -Im], [Im, Re]]).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from models.hooks import unknown_name_message
from models.mixers.base import RecurrentMixer

METHODS = ("auto", "autograd", "structured")


@dataclass
class MixerTrace:
    """A mixer's per-step inputs and states along real sequences.

    inputs: prepare(hook_in), dict of [B, T, ...]; states [B, T, *S] (hook_state: h_t);
    previous [B, T, *S]: h_{t-1} (the initial state at t = 0).
    """

    mixer: RecurrentMixer
    inputs: dict[str, torch.Tensor]
    states: torch.Tensor
    previous: torch.Tensor


def recurrent_mixer(model, layer: int) -> RecurrentMixer:
    """The recurrent mixer of block `layer` (ValueError naming what is there otherwise)."""
    n_layers = len(model.blocks)
    if isinstance(layer, bool) or not isinstance(layer, int) or not -n_layers <= layer < n_layers:
        raise ValueError(f"layer must be an int in [0, {n_layers}); got {layer!r}")
    mixer = model.blocks[layer].mixer
    if not isinstance(mixer, RecurrentMixer):
        held = "no mixer (an MLP-only block)" if mixer is None else f"mixer {mixer.mixer_name!r}"
        raise ValueError(
            f"layer {layer} holds {held}, which is not a RecurrentMixer; "
            "Jacobians dh_t/dh_{t-1} need a recurrent state"
        )
    return mixer


@torch.no_grad()
def trace(model, tokens: torch.Tensor, layer: int = 0) -> MixerTrace:
    """Run the model on tokens [B, T] and collect layer `layer`'s mixer inputs and states."""
    mixer = recurrent_mixer(model, layer)
    prefix = f"blocks.{layer % len(model.blocks)}.mixer"
    _, cache = model.run_with_cache(tokens, names=[f"{prefix}.hook_in", f"{prefix}.hook_state"])
    states = cache[f"{prefix}.hook_state"]                                        # [B, T, *S]
    inputs = mixer.prepare(cache[f"{prefix}.hook_in"])
    first = mixer.initial_state(states.shape[0], states)                          # [B, *S]
    previous = torch.cat([first[:, None], states[:, :-1]], dim=1)
    return MixerTrace(mixer, inputs, states, previous)


@dataclass
class Jacobians:
    """Per-step Jacobians: values [B, T, n] (diagonal: J_t = diag(values[:, t])) or [B, T, n, n].

    From the structured path, values may be a broadcast view sharing memory with the model's
    parameters (a time-invariant A expanded over steps); clone it before modifying either.
    """

    values: torch.Tensor
    diagonal: bool
    state_shape: tuple[int, ...]
    method: str

    @property
    def n(self) -> int:
        return math.prod(self.state_shape)

    @property
    def is_complex(self) -> bool:
        return self.values.dtype.is_complex

    def dense(self) -> torch.Tensor:
        """[B, T, n, n] (materialises a diagonal)."""
        return torch.diag_embed(self.values) if self.diagonal else self.values

    def realified(self) -> torch.Tensor:
        """Complex J as the real [B, T, 2n, 2n] matrix acting on view_as_real(h).flatten()
        (coordinates (Re h_0, Im h_0, Re h_1, ...)); a real J is returned dense as is."""
        if not self.is_complex:
            return self.dense()
        re, im = self.dense().real, self.dense().imag                              # [B, T, n, n]
        blocks = torch.stack([torch.stack([re, -im], -1), torch.stack([im, re], -1)], -3)  # [B, T, n, 2, n, 2]
        return blocks.reshape(*re.shape[:2], 2 * self.n, 2 * self.n)

    def restrict(self, basis) -> torch.Tensor:
        """Q^T J_t Q for every step: [B, T, k, k]. Complex states: Q [2n, k] lives in the
        realified coordinates view_as_real(h).flatten() (as probes see complex states)."""
        values = self.values
        if _broadcast_in_time(values):                       # time-invariant: restrict once
            values = values[:, :1]
        if self.is_complex:
            q = as_basis(basis, 2 * self.n, values.real)
            if self.diagonal:                                # 2x2 blocks [[re, -im], [im, re]] per entry
                re, im = values.real, values.imag
                blocks = torch.stack([torch.stack([re, -im], -1), torch.stack([im, re], -1)], -2)
                q3 = q.reshape(self.n, 2, -1)
                restricted = torch.einsum("iak,btiac,icl->btkl", q3, blocks, q3)
            else:
                restricted = q.T @ Jacobians(values, False, self.state_shape, self.method).realified() @ q
        else:
            q = as_basis(basis, self.n, values)
            if self.diagonal:
                restricted = torch.einsum("nk,btn,nl->btkl", q, values, q)
            else:
                restricted = q.T @ values @ q
        return restricted.expand(values.shape[0], self.values.shape[1], *restricted.shape[2:])


def as_basis(basis, n: int, like: torch.Tensor) -> torch.Tensor:
    """An orthonormal basis [n, k] (numpy, torch, or an object with .basis) as a tensor like `like`."""
    basis = getattr(basis, "basis", basis)
    if isinstance(basis, np.ndarray):
        basis = torch.from_numpy(basis)
    if not isinstance(basis, torch.Tensor):
        raise TypeError(f"basis must be a numpy array, a tensor or a Subspace; got {type(basis).__name__}")
    if basis.dim() != 2 or basis.shape[0] != n or basis.shape[1] < 1:
        raise ValueError(f"basis must be [n={n}, k] with k >= 1 (the flattened state size); got {tuple(basis.shape)}")
    return basis.to(dtype=like.dtype, device=like.device)


def _check_trace_inputs(mixer, inputs, previous) -> tuple[int, int, tuple[int, ...]]:
    if not isinstance(mixer, RecurrentMixer):
        raise TypeError(f"mixer must be a RecurrentMixer; got {type(mixer).__name__}")
    shape = tuple(mixer.state_shape)
    if previous.dim() != 2 + len(shape) or tuple(previous.shape[2:]) != shape:
        raise ValueError(f"previous must be [B, T, *state_shape={shape}]; got {tuple(previous.shape)}")
    batch, length = previous.shape[:2]
    for key, value in inputs.items():
        if tuple(value.shape[:2]) != (batch, length):
            raise ValueError(f"inputs[{key!r}] must start with [B, T] = {(batch, length)}; got {tuple(value.shape)}")
    return batch, length, shape


def _single_step(mixer: RecurrentMixer, shape: tuple[int, ...], complex_state: bool):
    """step for one example with real coordinates: (inputs_t dict of [...], h) -> h_t flattened.

    Real states: h [*S] -> [n]. Complex states: h = view_as_real(state) [*S, 2] -> [2n].
    """

    def one(inputs_t: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        state = torch.complex(h[..., 0], h[..., 1]) if complex_state else h
        out = mixer.step({k: v.unsqueeze(0) for k, v in inputs_t.items()}, state.unsqueeze(0))[0]
        return (torch.stack([out.real, out.imag], -1) if complex_state else out).reshape(-1)

    return one


def _real_coordinates(previous: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(previous) if previous.dtype.is_complex else previous


def _complex_jacobian(real_jac: torch.Tensor, n: int, mixer: RecurrentMixer) -> torch.Tensor:
    """[m, 2n, *S, 2] real Jacobian of a holomorphic step -> complex [m, n, n] (d h_t / d h_{t-1})."""
    jac = real_jac.reshape(-1, n, 2, n, 2)
    by_re = torch.complex(jac[:, :, 0, :, 0], jac[:, :, 1, :, 0])                 # d h_t / d Re h
    by_im = torch.complex(jac[:, :, 0, :, 1], jac[:, :, 1, :, 1])                 # d h_t / d Im h
    scale = float(by_re.abs().max()) + 1e-30
    if float((by_im - 1j * by_re).abs().max()) > 1e-4 * scale:
        raise ValueError(
            f"{mixer.mixer_name}.step is not complex-differentiable in the state (Cauchy-Riemann "
            "fails), so its Jacobian is not a complex n x n matrix; use restricted_jacobians, which "
            "works in the realified coordinates view_as_real(h)"
        )
    return by_re


def _chunks(inputs: dict[str, torch.Tensor], previous: torch.Tensor, chunk_size: int):
    """Flatten [B, T] to positions and yield (inputs chunk, previous chunk)."""
    flat_inputs = {k: v.reshape(-1, *v.shape[2:]) for k, v in inputs.items()}
    flat_prev = previous.reshape(-1, *previous.shape[2:])
    for start in range(0, flat_prev.shape[0], chunk_size):
        yield {k: v[start : start + chunk_size] for k, v in flat_inputs.items()}, flat_prev[start : start + chunk_size]


def _check_chunk_size(chunk_size) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int; got {chunk_size!r}")


def _resolve_method(mixer: RecurrentMixer, method: str) -> str:
    if method not in METHODS:
        raise ValueError(unknown_name_message("method", str(method), list(METHODS)))
    if method == "auto":
        return "structured" if mixer.is_affine else "autograd"
    if method == "structured" and not mixer.is_affine:
        raise ValueError(
            f"method='structured' needs an affine mixer (is_affine with transition()); "
            f"{mixer.mixer_name!r} is state-dependent: use method='autograd'"
        )
    return method


def _transition(mixer: RecurrentMixer, inputs_t: dict[str, torch.Tensor], shape, n) -> tuple[torch.Tensor, bool]:
    """transition(inputs_t) for m positions -> ([m, n] diagonal, True) or ([m, n, n], False)."""
    a = mixer.transition(inputs_t)
    m = next(iter(inputs_t.values())).shape[0]
    if tuple(a.shape) == (m, *shape):
        return a.reshape(m, n), True
    if tuple(a.shape) == (m, n, n):
        return a, False
    raise ValueError(
        f"{mixer.mixer_name}.transition returned shape {tuple(a.shape)}; expected diagonal "
        f"{(m, *shape)} or dense {(m, n, n)}"
    )


@torch.no_grad()
def step_jacobians(mixer: RecurrentMixer, inputs: dict[str, torch.Tensor], previous: torch.Tensor,
                   method: str = "auto", chunk_size: int = 256) -> Jacobians:
    """J_t = dh_t/dh_{t-1} at every position: inputs dict of [B, T, ...], previous [B, T, *S].

    chunk_size: positions differentiated at once by the autograd path (memory ~ chunk_size * n^2
    per intermediate); the structured path calls transition() once over all positions.
    """
    batch, length, shape = _check_trace_inputs(mixer, inputs, previous)
    method = _resolve_method(mixer, method)
    _check_chunk_size(chunk_size)
    n = math.prod(shape)
    if method == "structured":
        # one call over all positions: the output has to be held anyway, and a time-invariant
        # transition (A.expand(...)) stays a broadcast view instead of T copies
        flat_inputs = {k: v.reshape(-1, *v.shape[2:]) for k, v in inputs.items()}
        a, diagonal = _transition(mixer, flat_inputs, shape, n)
        return Jacobians(a.detach().reshape(batch, length, *a.shape[1:]), diagonal, shape, method)
    complex_state = previous.dtype.is_complex
    one = _single_step(mixer, shape, complex_state)
    # jacrev sees only the state (inputs may be complex, which jacrev refuses as arguments)
    jac = torch.func.vmap(lambda inputs_t, h: torch.func.jacrev(lambda x: one(inputs_t, x))(h))
    pieces = []
    for inputs_c, prev_c in _chunks(inputs, _real_coordinates(previous), chunk_size):
        real_jac = jac(inputs_c, prev_c).detach()          # function transforms ignore the outer no_grad
        pieces.append(_complex_jacobian(real_jac, n, mixer) if complex_state else real_jac.reshape(-1, n, n))
    return Jacobians(torch.cat(pieces).reshape(batch, length, n, n), False, shape, method)


def jacobians(model, tokens: torch.Tensor, layer: int = 0, method: str = "auto", chunk_size: int = 256) -> Jacobians:
    """Per-step Jacobians of layer `layer`'s recurrent mixer along tokens [B, T]."""
    t = trace(model, tokens, layer)
    return step_jacobians(t.mixer, t.inputs, t.previous, method, chunk_size)


@torch.no_grad()
def restricted_jacobians(mixer: RecurrentMixer, inputs: dict[str, torch.Tensor], previous: torch.Tensor,
                         basis, method: str = "auto", chunk_size: int = 256) -> torch.Tensor:
    """Q^T J_t Q [B, T, k, k] without forming J_t when differentiating (k jvps per position)."""
    batch, length, shape = _check_trace_inputs(mixer, inputs, previous)
    method = _resolve_method(mixer, method)
    _check_chunk_size(chunk_size)
    n = math.prod(shape)
    complex_state = previous.dtype.is_complex
    real_prev = _real_coordinates(previous)
    q = as_basis(basis, 2 * n if complex_state else n, real_prev)
    if method == "structured":
        return step_jacobians(mixer, inputs, previous, method, chunk_size).restrict(q)
    one = _single_step(mixer, shape, complex_state)
    tangents = q.T.reshape(-1, *real_prev.shape[2:])                               # [k, *S(, 2)]

    def at(inputs_t, h):                                                           # -> J Q as [k, n]
        push = lambda u: torch.func.jvp(lambda x: one(inputs_t, x), (h,), (u,))[1]  # noqa: E731
        return torch.func.vmap(push)(tangents)

    pieces = [torch.func.vmap(at)(inputs_c, prev_c) for inputs_c, prev_c in _chunks(inputs, real_prev, chunk_size)]
    jq = torch.cat(pieces).detach()                                                # [m, k, n]: row j = J q_j
    return (jq @ q).transpose(-1, -2).reshape(batch, length, q.shape[1], q.shape[1])


@dataclass
class Spectra:
    """eigenvalues [B, T, m] complex (largest modulus first), singular_values [B, T, m] (largest
    first), spectral_radius [B, T], max_singular_value [B, T]; m = n, or k when restricted."""

    eigenvalues: torch.Tensor
    singular_values: torch.Tensor
    spectral_radius: torch.Tensor
    max_singular_value: torch.Tensor


def _broadcast_in_time(values: torch.Tensor) -> bool:
    """values [B, T, ...] is one tensor per example broadcast over T (stride 0 along time)."""
    return values.shape[1] > 1 and values.stride(1) == 0


def _time_invariant(values: torch.Tensor) -> bool:
    """Every step's matrix equals step 0's (per example): LTI models such as the linear RNN."""
    return _broadcast_in_time(values) or (
        values.shape[1] > 1 and torch.equal(values, values[:, :1].expand_as(values)))


@torch.no_grad()
def spectra(jac, basis=None) -> Spectra:
    """Spectra of Jacobians (a Jacobians, or matrices [B, T, m, m]); of Q^T J Q when basis is given.

    A diagonal Jacobian's spectrum is read off its entries. When every step's matrix is the same
    (a time-invariant model) the decomposition runs once per example and is repeated over steps.
    """
    if isinstance(jac, Jacobians):
        if basis is not None:
            return spectra(jac.restrict(basis))
        if jac.diagonal:
            values = jac.values
            order = values.abs().argsort(dim=-1, descending=True)
            eig = torch.gather(values, -1, order).to(torch.promote_types(values.dtype, torch.complex64))
            sv = torch.gather(values.abs(), -1, order)
            return Spectra(eig, sv, sv[..., 0], sv[..., 0])
        matrices = jac.values
    else:
        if basis is not None:
            raise ValueError("basis restricts a Jacobians object; restrict the matrices first (Q^T J Q)")
        matrices = jac
    if not isinstance(matrices, torch.Tensor) or matrices.dim() != 4 or matrices.shape[-1] != matrices.shape[-2]:
        shape = tuple(matrices.shape) if isinstance(matrices, torch.Tensor) else type(matrices).__name__
        raise ValueError(f"jac must be a Jacobians or square matrices [B, T, m, m]; got {shape}")
    length = matrices.shape[1]
    if _time_invariant(matrices):
        once = spectra(matrices[:, :1])
        return Spectra(*(x.expand(x.shape[0], length, *x.shape[2:]) for x in
                         (once.eigenvalues, once.singular_values, once.spectral_radius, once.max_singular_value)))
    eig = torch.linalg.eigvals(matrices)
    eig = torch.gather(eig, -1, eig.abs().argsort(dim=-1, descending=True))
    sv = torch.linalg.svdvals(matrices)
    return Spectra(eig, sv, eig.abs()[..., 0], sv[..., 0])


def word_jacobian(jac: Jacobians, start: int, stop: int) -> Jacobians:
    """The return map's Jacobian over positions start..stop-1: J_{stop-1} ... J_{start}, as a
    Jacobians with one step (values [B, 1, n] diagonal or [B, 1, n, n])."""
    if not isinstance(jac, Jacobians):
        raise TypeError(f"jac must be a Jacobians; got {type(jac).__name__}")
    length = jac.values.shape[1]
    if any(isinstance(v, bool) or not isinstance(v, int) for v in (start, stop)) or not 0 <= start < stop <= length:
        raise ValueError(f"need ints 0 <= start < stop <= T={length}; got start={start!r}, stop={stop!r}")
    if jac.diagonal:
        product = jac.values[:, start:stop].prod(dim=1, keepdim=True)
    else:
        product = jac.values[:, start]
        for t in range(start + 1, stop):
            product = jac.values[:, t] @ product
        product = product[:, None]
    return Jacobians(product, jac.diagonal, jac.state_shape, jac.method)


@dataclass
class Theorem1Check:
    """restricted [B, k, k] = Q^T J_word Q; deviation [B] = ||restricted - I||_2; holds [B] = deviation <= atol."""

    restricted: torch.Tensor
    deviation: torch.Tensor
    holds: torch.Tensor
    atol: float


def theorem1_check(word_jac: Jacobians, basis, atol: float = 1e-3) -> Theorem1Check:
    """Theorem 1's conclusion along a word: Q^T J_word Q ~ I (spectral-norm distance <= atol)."""
    if not isinstance(word_jac, Jacobians) or word_jac.values.shape[1] != 1:
        raise ValueError("word_jac must be the one-step Jacobians returned by word_jacobian(...)")
    if not isinstance(atol, float) or atol <= 0:
        raise ValueError(f"atol must be a positive float; got {atol!r}")
    restricted = word_jac.restrict(basis)[:, 0]                                   # [B, k, k]
    eye = torch.eye(restricted.shape[-1], dtype=restricted.dtype, device=restricted.device)
    deviation = torch.linalg.matrix_norm(restricted - eye, ord=2)
    return Theorem1Check(restricted, deviation, deviation <= atol, atol)


@torch.no_grad()
def centroid_return_error(mixer: RecurrentMixer, inputs: dict[str, torch.Tensor], start: int, stop: int,
                          centroid_means, example: int = 0) -> torch.Tensor:
    """Theorem 1's premise: run the word (positions start..stop-1 of `example`) from every centroid.

    centroid_means [G, n] (e.g. Subspace.centroids.means), or [G, 2n] for complex states in the
    realified coordinates view_as_real(h).flatten(); returns ||F_word(c_g) - c_g|| [G].
    """
    shape = tuple(mixer.state_shape)
    n = math.prod(shape)
    first = next(iter(inputs.values()))
    if not 0 <= start < stop <= first.shape[1] or not 0 <= example < first.shape[0]:
        raise ValueError(f"need 0 <= start < stop <= T={first.shape[1]} and 0 <= example < B={first.shape[0]}; "
                         f"got start={start}, stop={stop}, example={example}")
    real_dtype = next((v.real.dtype for v in inputs.values() if v.is_floating_point() or v.is_complex()),
                      torch.get_default_dtype())
    means = torch.as_tensor(np.asarray(centroid_means), dtype=real_dtype, device=first.device)
    if means.dim() != 2 or means.shape[1] not in (n, 2 * n):
        raise ValueError(f"centroid_means must be [G, n={n}] (or [G, 2n] for complex states); got {tuple(means.shape)}")
    realified = means.shape[1] == 2 * n
    h = torch.view_as_complex(means.reshape(-1, *shape, 2).contiguous()) if realified else means.reshape(-1, *shape)
    for t in range(start, stop):
        h = mixer.step({k: v[example, t].expand(h.shape[0], *v.shape[2:]) for k, v in inputs.items()}, h)
    end = torch.view_as_real(h) if realified else h
    return torch.linalg.vector_norm(end.reshape(len(means), -1) - means, dim=-1)


@dataclass
class ContractionSummary:
    """per_step [B, T]: largest singular value of Q^T J_t Q; max / mean / median over all steps;
    expanding: the fraction of steps whose largest singular value on U exceeds 1."""

    per_step: torch.Tensor
    max: float
    mean: float
    median: float
    expanding: float


def contraction_summary(restricted: torch.Tensor) -> ContractionSummary:
    """Summary of Q^T J_t Q [B, T, k, k] (from Jacobians.restrict or restricted_jacobians)."""
    if not isinstance(restricted, torch.Tensor) or restricted.dim() != 4 or restricted.shape[-1] != restricted.shape[-2]:
        shape = tuple(restricted.shape) if isinstance(restricted, torch.Tensor) else type(restricted).__name__
        raise ValueError(f"restricted must be matrices [B, T, k, k]; got {shape}")
    top = torch.linalg.matrix_norm(restricted, ord=2)                              # [B, T]
    flat = top.flatten().double()
    return ContractionSummary(top, float(flat.max()), float(flat.mean()), float(flat.median()),
                              float((flat > 1).double().mean()))


def contraction(model, tokens: torch.Tensor, basis, layer: int = 0, method: str = "auto",
                chunk_size: int = 256) -> ContractionSummary:
    """A model's contraction summary on U along tokens [B, T]: the largest singular value of
    Q^T J_t Q at every step (structured for affine mixers, k jvps per step otherwise)."""
    t = trace(model, tokens, layer)
    return contraction_summary(restricted_jacobians(t.mixer, t.inputs, t.previous, basis, method, chunk_size))
