"""Shared checks of the converters (models.interop): jitter a tiny source, import it, compare
logits, every block's output and the gradient w.r.t. the input embeddings; save -> load."""

from __future__ import annotations

import importlib

import torch

import models

VOCAB = 13


def jitter(source: torch.nn.Module, scale: float = 0.1, seed: int = 0) -> torch.nn.Module:
    """Add noise to every parameter (norm weights, biases, D, A_log all move off their init)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in source.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * scale)
    return source.eval()


def embedding_leaf(module: torch.nn.Module, store: dict):
    """A forward hook making `module`'s output a leaf that requires grad (stored in store["e"])."""
    def hook(mod, inputs, output):
        store["e"] = output.detach().requires_grad_(True)
        return store["e"]
    return module.register_forward_hook(hook)


def source_run(source, tokens, weights):
    """Source logits, each layer's output, d(sum(logits * weights))/d(input embeddings)."""
    converter = importlib.import_module(
        models.interop.registry.CONVERTERS[source.config.model_type][0])
    outputs, store = [], {}
    handles = [b.register_forward_hook(lambda m, i, o: outputs.append(
        models.interop.convert.layer_output(o).detach())) for b in converter.source_blocks(source)]
    handles.append(embedding_leaf(source.get_input_embeddings(), store))
    try:
        logits = source(tokens).logits
        (grad,) = torch.autograd.grad((logits * weights).sum(), store["e"])
    finally:
        for h in handles:
            h.remove()
    return logits.detach(), outputs, grad


def our_run(model, tokens, weights, path):
    store = {}
    handle = embedding_leaf(model.embed, store)
    names = [f"blocks.{l}.hook_resid_post" for l in range(len(model.blocks))]
    try:
        logits, cache = model.set_execution_path(path).run_with_cache(tokens, names=names)
        (grad,) = torch.autograd.grad((logits * weights).sum(), store["e"])
    finally:
        handle.remove()
        model.set_execution_path("auto")
    return logits.detach(), [cache[n] for n in names], grad


def assert_parity(source, model, tokens, atol: float, embed_scale: float = 1.0) -> None:
    """Logits, every block's output and the input-embedding gradients agree within atol (relative
    to each tensor's scale for the gradients), on our fast and instrumented paths. embed_scale:
    our embedding output is the source's times this (a multiplier folded into our embedding), so
    our gradient times it is the source's."""
    weights = torch.randn(*tokens.shape, model.cfg.vocab_size, generator=torch.Generator().manual_seed(5),
                          dtype=model.embed.weight.dtype)
    logits, blocks, grad = source_run(source, tokens, weights)
    assert len(blocks) == len(model.blocks)
    for path in ("fast", "instrumented"):
        ours, our_blocks, our_grad = our_run(model, tokens, weights, path)
        our_grad = our_grad * embed_scale
        torch.testing.assert_close(ours, logits, atol=atol, rtol=0, msg=f"{path} logits")
        for l, (a, b) in enumerate(zip(our_blocks, blocks)):
            torch.testing.assert_close(a, b, atol=atol, rtol=0, msg=f"{path} block {l}")
        scale = grad.abs().max()
        torch.testing.assert_close(our_grad / scale, grad / scale, atol=atol, rtol=0, msg=f"{path} gradient")


def assert_round_trip(model, run_dir, tokens) -> None:
    """model.save -> models.load: the same config, dtype and logits bit for bit."""
    model.save(run_dir)
    loaded = models.load(run_dir)
    assert loaded.cfg == model.cfg
    with torch.no_grad():
        assert torch.equal(loaded(tokens), model(tokens))
    assert all(a.dtype == b.dtype for a, b in zip(loaded.parameters(), model.parameters()))


def assert_causal_state_patch(model, tokens, name: str, t: int, state_shape: tuple) -> None:
    """A random hook_state patch at step t on an imported model: nothing before t changes, the
    logits at t and at every later step do (the recurrence continues from the patched state)."""
    def scramble(state, hook):
        state[:, t] = torch.randn_like(state[:, t])
        return state

    with torch.no_grad():
        clean, cache = model.run_with_cache(tokens, names=[name])
        patched = model.run_with_hooks(tokens, fwd_hooks=[(name, scramble)])
    assert cache[name].shape == (*tokens.shape, *state_shape)
    assert torch.equal(patched[:, :t], clean[:, :t])
    assert (patched[:, t:] - clean[:, t:]).abs().amax(-1).min() > 0
