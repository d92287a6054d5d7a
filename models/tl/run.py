"""TransformerLens' keyword arguments of run_with_hooks / run_with_cache, in our terms.

    return_type       "logits" (default), "loss" (TL's lm_cross_entropy_loss: the mean negative
                      log-likelihood of each next token), "both" ((logits, loss)) or None (None)
    loss_per_token    with "loss" / "both": the loss at each position [B, T - 1], not its mean
    stop_at_layer     run blocks [0, stop_at_layer) only and return the residual stream after them
                      [B, T, d_model] (0: hook_embed; negative counts from the end; n_layers: the
                      last block's hook_resid_post, before the final norm); return_type is then
                      ignored, as in TL, and hooks after the stop do not fire
    start_at_layer    the first argument is the residual stream [B, T, d_model] entering block
                      start_at_layer (what blocks.{k}.hook_resid_pre reads; negative counts from
                      the end); blocks k.. run, then the final norm and unembedding, and hooks
                      before block k (hook_embed, earlier blocks) do not fire: run_with_cache's
                      Cache holds blocks >= k and the final ones (names before k, even named, are
                      left out, as TL's). With stop_at_layer, blocks [k, stop) run. return_type
                      "loss" / "both" then need labels= (the token ids [B, T]; HookedTransformer's
                      tokens=)
    labels            token ids [B, T] the loss is computed against instead of the input (TL 4.3's
                      bridge): next-token targets labels[:, 1:], -100 ignored
    bwd_hooks         [(name, fn)]: fn(grad, hook) sees d output / d activation when the caller
                      runs backward() on what came back (a returned tensor replaces the gradient);
                      the hooks stay on the autograd graph, so TL's reset_hooks_end=False is not
                      needed. Not on hook_state (its value is re-run, not on the graph): use
                      run_with_cache(incl_bwd=True) for d metric / d h_t
    remove_batch_dim  run_with_hooks: hook functions see one example without the batch axis
                      (batch size 1); run_with_cache: the Cache loses the batch axis
    names_filter      run_with_cache: TL's name for `names` (a name, a list or a predicate)
    pos_slice         run_with_cache: TL's position slice (a slice, a (start, stop[, step])
                      tuple or a list) as `positions`; an int, which drops the axis in TL, is
                      refused (positions=[t] keeps a length-1 axis)

Other TL arguments (reset_hooks_end=False,
return_cache_object=False, clear_contexts, prepend_bos, padding_side, attention_mask,
past_kv_cache) raise a TypeError saying what to do here instead.

`stop_at_layer` stops the forward pass by an exception raised from a reader of the stop hook,
after every other reader (the cache) has seen it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

RETURN_TYPES = ("logits", "loss", "both", None)


class _Stopped(Exception):
    """Raised by the stop reader of stop_at_layer, carrying the residual stream there."""

    def __init__(self, value: torch.Tensor) -> None:
        super().__init__("stop_at_layer")
        self.value = value


def stop_hook(n_layers: int, stop_at_layer: int) -> str:
    """The hook whose value run(stop_at_layer=...) returns: hook_embed for 0, else the residual
    after block stop_at_layer - 1 (negative: counted from the end)."""
    if not isinstance(stop_at_layer, int) or isinstance(stop_at_layer, bool) \
            or not -n_layers <= stop_at_layer <= n_layers:
        raise ValueError(f"stop_at_layer must be None or an int in [-{n_layers}, {n_layers}] (n_layers "
                         f"{n_layers}); got {stop_at_layer!r}")
    stop = stop_at_layer % n_layers if stop_at_layer < 0 else stop_at_layer
    return "hook_embed" if stop == 0 else f"blocks.{stop - 1}.hook_resid_post"


def start_layer(n_layers: int, start_at_layer: int) -> int:
    """The block index run(start_at_layer=...) starts at (negative: counted from the end)."""
    if not isinstance(start_at_layer, int) or isinstance(start_at_layer, bool) \
            or not -n_layers <= start_at_layer < n_layers:
        raise ValueError(f"start_at_layer must be None or an int in [-{n_layers}, {n_layers - 1}] (n_layers "
                         f"{n_layers}); got {start_at_layer!r}")
    return start_at_layer % n_layers


def tl_forward(model, tokens: torch.Tensor, kwargs: dict, return_type="logits", loss_per_token: bool = False,
               stop_at_layer: int | None = None, start_at_layer: int | None = None, labels=None):
    """TL's forward: what return_type asks for (the residual stream [B, T, D] with
    stop_at_layer), the TL arguments checked and those we do not take refused from kwargs."""
    refuse_unsupported(kwargs)
    unknown = sorted(set(kwargs) - {"at"})   # (at: the plain call's own, passed on to it)
    if unknown:   # not TL's either: passed on, the plain call would hand them back to this function
        raise TypeError(f"forward() got unexpected keyword arguments {unknown}: it takes at, return_type, "
                        "loss_per_token, stop_at_layer, start_at_layer and labels")
    check_return_type(return_type)
    targets = loss_targets(tokens, labels, start_at_layer, return_type)
    out = forward(model, tokens, stop_at_layer, kwargs, start_at_layer)
    return out if stop_at_layer is not None else output(out, targets, return_type, loss_per_token)


def forward(model, tokens: torch.Tensor, stop_at_layer: int | None, kwargs: dict,
            start_at_layer: int | None = None) -> torch.Tensor:
    """model(tokens, **kwargs), or the residual stream [B, T, D] where stop_at_layer stops it;
    with start_at_layer, `tokens` is the residual entering that block (forward_from)."""
    if start_at_layer is not None:
        return forward_from(model, tokens, start_at_layer, stop_at_layer)
    if stop_at_layer is None:
        return model(tokens, **kwargs)
    point = model.hook_point(stop_hook(len(model.blocks), stop_at_layer))

    def stop(x: torch.Tensor, hook) -> None:
        raise _Stopped(x)

    point._readers.append(stop)  # after the cache's readers, so they see the value first
    try:
        model(tokens, **kwargs)
    except _Stopped as stopped:
        return stopped.value
    finally:
        point._readers.remove(stop)
    raise RuntimeError(f"stop_at_layer={stop_at_layer}: the forward pass never reached {point.name!r}")


def forward_from(model, residual: torch.Tensor, start_at_layer: int, stop_at_layer: int | None) -> torch.Tensor:
    """TL's start_at_layer: residual [B, T, D] enters block k = start_at_layer; blocks k..
    (to stop_at_layer) run -> the logits [B, T, V], or with stop_at_layer the residual after
    block stop - 1 [B, T, D]."""
    n_layers = len(model.blocks)
    start = start_layer(n_layers, start_at_layer)
    check_residual(model, residual)
    stop = n_layers
    if stop_at_layer is not None:
        name = stop_hook(n_layers, stop_at_layer)
        stop = 0 if name == "hook_embed" else int(name.split(".")[1]) + 1
        if stop <= start:
            raise ValueError(f"stop_at_layer={stop_at_layer} stops before start_at_layer={start_at_layer}: "
                             "no block would run")
    x = residual
    for block in model.blocks[start:stop]:
        x = block(x)
    return x if stop_at_layer is not None else model.read_out(x)


def check_residual(model, residual) -> None:
    """The input of a run with start_at_layer: a float residual stream [B, T, d_model]."""
    width = model.cfg.d_model
    if not isinstance(residual, torch.Tensor) or not residual.is_floating_point() or residual.dim() != 3 \
            or residual.shape[-1] != width:
        shape = tuple(residual.shape) if isinstance(residual, torch.Tensor) else type(residual).__name__
        raise ValueError(f"with start_at_layer the input is the residual stream, a float tensor [B, T, d_model="
                         f"{width}]; got {shape}")


# TL arguments we do not take: (the value that is what we do anyway, or None; what to do instead)
UNSUPPORTED = {
    "reset_hooks_end": (True, "our hooks are always removed when the call returns; bwd_hooks stay on the "
                              "autograd graph without it"),
    "return_cache_object": (True, "run_with_cache returns a Cache, a Mapping (dict(cache) is a dict)"),
    "clear_contexts": (False, "our hook points have no ctx"),
    "prepend_bos": (None, "tokenize with model.to_tokens(text, prepend_bos=...) and pass the token ids [B, T]"),
    "padding_side": (None, "model.to_tokens pads on the right (no padding masks here); pass the token ids [B, T]"),
    "attention_mask": (None, "there are no padding masks: run equal-length batches"),
    "past_kv_cache": (None, "decode with model.generate (models.decoding: KV caches and recurrent states)"),
}


def refuse_unsupported(kwargs: dict) -> None:
    """Drop TL arguments given their value that we follow anyway; refuse the others in UNSUPPORTED."""
    for name in [n for n in kwargs if n in UNSUPPORTED]:
        default, instead = UNSUPPORTED[name]
        if default is not None and kwargs[name] is default:
            del kwargs[name]
            continue
        raise TypeError(f"{name}={kwargs[name]!r} is a TransformerLens argument this toolkit does not take: {instead}")


def check_return_type(return_type) -> None:
    if return_type not in RETURN_TYPES:
        raise ValueError(f"return_type must be one of {RETURN_TYPES}; got {return_type!r}")


def lm_loss(logits: torch.Tensor, tokens: torch.Tensor, per_token: bool = False) -> torch.Tensor:
    """TL's lm_cross_entropy_loss: -log p(tokens[:, t + 1] | logits[:, t]), its mean over every
    example and position (per_token: [B, T - 1]); targets -100 (labels) are left out of the mean
    and 0 per token, as TL's labels loss."""
    targets = tokens[:, 1:].to(logits.device)
    valid = targets != IGNORE
    log_probs = logits.log_softmax(dim=-1)
    nll = -log_probs[:, :-1].gather(-1, targets.clamp(min=0)[..., None])[..., 0] * valid
    return nll if per_token else nll.sum() / valid.sum()


IGNORE = -100  # a label left out of the loss


def loss_targets(tokens: torch.Tensor, labels, start_at_layer, return_type) -> torch.Tensor | None:
    """The token ids the loss is computed against: labels if given (checked), else the input
    tokens; None where no loss is wanted. With start_at_layer a loss needs labels."""
    if labels is not None:
        shape = tuple(tokens.shape[:2])
        if not isinstance(labels, torch.Tensor) or labels.is_floating_point() or tuple(labels.shape) != shape:
            raise ValueError(f"labels must be token ids [B, T] = {list(shape)} (-100: left out of the loss); got "
                             f"{getattr(labels, 'shape', type(labels).__name__)!r}")
        return labels
    if start_at_layer is not None and return_type in ("loss", "both"):
        raise ValueError(f"return_type={return_type!r} with start_at_layer needs the token ids the loss is against: "
                         "pass labels=tokens [B, T] (TL 4.3's labels=, HookedTransformer's tokens=)")
    return tokens if start_at_layer is None else None


def output(logits: torch.Tensor, tokens: torch.Tensor | None, return_type, per_token: bool = False):
    """What TL's forward returns for return_type (checked by check_return_type); tokens: the
    loss's targets (loss_targets)."""
    if return_type is None:
        return None
    if return_type == "logits":
        return logits
    loss = lm_loss(logits, tokens, per_token)
    return loss if return_type == "loss" else (logits, loss)


def started_names(names: list[str], n_layers: int, start_at_layer: int | None) -> list[str]:
    """names without those that do not fire when the run starts at block start_at_layer (the
    embedding's, blocks before it), as TL's run_with_cache leaves them out."""
    if start_at_layer is None:
        return names
    start = start_layer(n_layers, start_at_layer)
    return [n for n in names if n not in EMBEDDING_HOOKS
            and not (n.startswith("blocks.") and int(n.split(".")[1]) < start)]


EMBEDDING_HOOKS = frozenset({"hook_embed", "hook_token_embed", "hook_pos_embed"})


def backward_hook(fn: Callable) -> Callable:
    """A forward hook function that puts fn(grad, hook) on its activation's gradient."""

    def on_gradient(x: torch.Tensor, hook) -> None:
        if hook.name.endswith("hook_state"):
            raise ValueError(f"bwd_hooks on {hook.name!r}: a hook_state is re-run after its hooks and its "
                             "value is not on the graph; run_with_cache(incl_bwd=True, metric=...) caches "
                             "d metric / d h_t")
        if x.requires_grad:
            x.register_hook(lambda grad: fn(grad, hook))

    on_gradient.__name__ = f"bwd:{getattr(fn, '__name__', 'fn')}"
    return on_gradient


def unbatched(fn: Callable) -> Callable:
    """fn(x, hook) on one example without the batch axis (TL's remove_batch_dim)."""

    def hook_fn(x: torch.Tensor, hook):
        if x.shape[0] != 1:
            raise ValueError(f"remove_batch_dim=True needs batch size 1; {hook.name!r} has {x.shape[0]}")
        out = fn(x[0], hook)
        return None if out is None else out.unsqueeze(0) if isinstance(out, torch.Tensor) else out

    hook_fn.__name__ = getattr(fn, "__name__", "fn")
    return hook_fn


def positions_of(pos_slice, length: int) -> list[int]:
    """TL's pos_slice (a slice, a (start, stop[, step]) tuple, a list of ints) as positions."""
    if isinstance(pos_slice, tuple):
        pos_slice = slice(*pos_slice)
    if isinstance(pos_slice, slice):
        return list(range(length))[pos_slice]
    if isinstance(pos_slice, int) and not isinstance(pos_slice, bool):
        raise ValueError(f"pos_slice={pos_slice} drops the position axis in TransformerLens; here pass "
                         f"positions=[{pos_slice}] (keeps a length-1 axis) or pos_slice=[{pos_slice}]")
    if isinstance(pos_slice, (list, torch.Tensor)):
        return [int(t) for t in pos_slice]
    raise TypeError(f"pos_slice must be a slice, a (start, stop[, step]) tuple or a list of positions; "
                    f"got {pos_slice!r}")


def cache_arguments(tokens: torch.Tensor, names, names_filter, positions, pos_slice, return_type, incl_bwd: bool,
                    metric, remove_batch_dim: bool, to_disk, kwargs: dict, targets: torch.Tensor | None = None):
    """run_with_cache's (names, positions, metric) with TL's names_filter, pos_slice and
    return_type="loss" (incl_bwd without a metric: the gradient of the loss against targets,
    loss_targets, as TL's incl_bwd) folded in; each checked, and TL arguments we do not take
    refused from kwargs."""
    refuse_unsupported(kwargs)
    check_return_type(return_type)
    if names_filter is not None:
        if names is not None:
            raise ValueError(f"pass names or names_filter (TransformerLens' name for it), not both; got "
                             f"names={names!r}, names_filter={names_filter!r}")
        names = names_filter
    if pos_slice is not None:
        if positions is not None:
            raise ValueError(f"pass positions or pos_slice (TransformerLens'), not both; got positions={positions!r}, "
                             f"pos_slice={pos_slice!r}")
        positions = positions_of(pos_slice, tokens.shape[1])
    if incl_bwd and metric is None and return_type in ("loss", "both"):
        metric = lambda logits: lm_loss(logits, targets)  # noqa: E731
    if remove_batch_dim and to_disk is not None:
        raise ValueError(f"remove_batch_dim=True builds the Cache in memory; with to_disk={to_disk!r} call "
                         "cache.remove_batch_dim() when you read it")
    return names, positions, metric
