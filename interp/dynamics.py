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
maps h_{start-1} to h_{stop-1}. Theorem 1 (SCIENCE.md): if an affine model maps every centroid back
to itself along a word that returns every state to itself, Q^T J_word Q = I (drift along U is never
corrected). `theorem1_check` measures ||Q^T J_word Q - I||_2; `centroid_return_error` checks the
premise by running the word from every centroid.

The contraction summary of a model is the largest singular value of Q^T J_t Q over steps.
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
        raise ValueError(
            f"layer {layer} holds mixer {mixer.mixer_name!r}, which is not a RecurrentMixer; "
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
    """Per-step Jacobians: values [B, T, n] (diagonal: J_t = diag(values[:, t])) or [B, T, n, n]."""

    values: torch.Tensor
    diagonal: bool
    state_shape: tuple[int, ...]
    method: str

    @property
    def n(self) -> int:
        return math.prod(self.state_shape)

    def dense(self) -> torch.Tensor:
        """[B, T, n, n] (materialises a diagonal)."""
        return torch.diag_embed(self.values) if self.diagonal else self.values

    def restrict(self, basis) -> torch.Tensor:
        """Q^T J_t Q for every step: [B, T, k, k]."""
        q = as_basis(basis, self.n, self.values)
        if self.diagonal:
            return torch.einsum("nk,btn,nl->btkl", q, self.values, q)
        return q.T @ self.values @ q


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


def _single_step(mixer: RecurrentMixer, n: int):
    """step for one example: (inputs_t dict of [...], h [*S]) -> h_t [n]."""

    def one(inputs_t: dict[str, torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        return mixer.step({k: v.unsqueeze(0) for k, v in inputs_t.items()}, h.unsqueeze(0)).reshape(n)

    return one


def _chunks(inputs: dict[str, torch.Tensor], previous: torch.Tensor, chunk_size: int):
    """Flatten [B, T] to positions and yield (inputs chunk, previous chunk)."""
    flat_inputs = {k: v.reshape(-1, *v.shape[2:]) for k, v in inputs.items()}
    flat_prev = previous.reshape(-1, *previous.shape[2:])
    for start in range(0, flat_prev.shape[0], chunk_size):
        yield {k: v[start : start + chunk_size] for k, v in flat_inputs.items()}, flat_prev[start : start + chunk_size]


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
    """J_t = dh_t/dh_{t-1} at every position: inputs dict of [B, T, ...], previous [B, T, *S]."""
    batch, length, shape = _check_trace_inputs(mixer, inputs, previous)
    method = _resolve_method(mixer, method)
    n = math.prod(shape)
    pieces, diagonal = [], False
    if method == "structured":
        for inputs_c, _ in _chunks(inputs, previous, chunk_size):
            a, diagonal = _transition(mixer, inputs_c, shape, n)
            pieces.append(a)
    else:
        jac = torch.func.vmap(torch.func.jacrev(_single_step(mixer, n), argnums=1))
        for inputs_c, prev_c in _chunks(inputs, previous, chunk_size):
            pieces.append(jac(inputs_c, prev_c).reshape(-1, n, n))
    values = torch.cat(pieces).reshape(batch, length, *pieces[0].shape[1:])
    return Jacobians(values, diagonal, shape, method)


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
    n = math.prod(shape)
    q = as_basis(basis, n, previous)
    if method == "structured":
        return step_jacobians(mixer, inputs, previous, method, chunk_size).restrict(q)
    one = _single_step(mixer, n)
    tangents = q.T.reshape(-1, *shape)                                             # [k, *S]

    def at(inputs_t, h):                                                           # -> J Q as [k, n]
        push = lambda u: torch.func.jvp(lambda x: one(inputs_t, x), (h,), (u,))[1]  # noqa: E731
        return torch.func.vmap(push)(tangents)

    pieces = [torch.func.vmap(at)(inputs_c, prev_c) for inputs_c, prev_c in _chunks(inputs, previous, chunk_size)]
    jq = torch.cat(pieces)                                                         # [m, k, n]: row j = J q_j
    return (jq @ q).transpose(-1, -2).reshape(batch, length, q.shape[1], q.shape[1])


@dataclass
class Spectra:
    """eigenvalues [B, T, m] complex (largest modulus first), singular_values [B, T, m] (largest
    first), spectral_radius [B, T], max_singular_value [B, T]; m = n, or k when restricted."""

    eigenvalues: torch.Tensor
    singular_values: torch.Tensor
    spectral_radius: torch.Tensor
    max_singular_value: torch.Tensor


def _time_invariant(values: torch.Tensor) -> bool:
    """Every step's matrix equals step 0's (per example): LTI models such as the linear RNN."""
    return values.shape[1] > 1 and torch.equal(values, values[:, :1].expand_as(values))


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

    centroid_means [G, n] (e.g. Subspace.centroids.means); returns ||F_word(c_g) - c_g|| [G].
    """
    shape = tuple(mixer.state_shape)
    n = math.prod(shape)
    first = next(iter(inputs.values()))
    if not 0 <= start < stop <= first.shape[1] or not 0 <= example < first.shape[0]:
        raise ValueError(f"need 0 <= start < stop <= T={first.shape[1]} and 0 <= example < B={first.shape[0]}; "
                         f"got start={start}, stop={stop}, example={example}")
    means = torch.as_tensor(np.asarray(centroid_means), dtype=first.dtype, device=first.device)
    if means.dim() != 2 or means.shape[1] != n:
        raise ValueError(f"centroid_means must be [G, n={n}]; got {tuple(means.shape)}")
    h = means.reshape(-1, *shape)
    for t in range(start, stop):
        h = mixer.step({k: v[example, t].expand(h.shape[0], *v.shape[2:]) for k, v in inputs.items()}, h)
    return torch.linalg.vector_norm(h.reshape(-1, n) - means, dim=-1)


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
