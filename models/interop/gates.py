"""Size gates for a checkpoint directory, checked before any model is built: sanity bounds on the
config fields that size a model, and a memory estimate of the built model against the memory
this process can have.

    check_config_sizes(config, where)          # config: the parsed config.json (nested configs too)
    check_memory(n_elements, bytes_each, copies, where)

Each refusal is one ValueError line naming the field (or the estimate), the value and the bound.
Self-contained (the run-config gates of models/config.py are a separate check of our own configs).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

LAYERS = 1 << 9         # the deepest public checkpoints have ~130 layers; building 512 on meta takes seconds
WIDTH = 1 << 17         # hidden sizes: the widest public ones are ~25k
MLP_WIDTH = 1 << 20
VOCAB = 1 << 22         # the largest public vocabularies are ~260k
HEADS = 1 << 12
STATE = 1 << 12         # SSM state sizes, head dims, conv windows
EXPERTS = 1 << 12
POSITIONS = 1 << 24     # max positions: the longest public contexts are ~10M

# config field -> the largest value accepted (fields that size the model; every family's names)
BOUNDS: dict[str, int] = {
    **dict.fromkeys(("vocab_size",), VOCAB),
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "mamba_d_ssm", "kv_lora_rank", "q_lora_rank"), WIDTH),
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "num_mem_blocks"), LAYERS),
    **dict.fromkeys(("intermediate_size", "n_inner", "moe_intermediate_size", "shared_intermediate_size",
                     "shared_expert_intermediate_size", "mamba_expand", "expand"), MLP_WIDTH),
    **dict.fromkeys(("num_attention_heads", "num_key_value_heads", "n_head", "num_heads", "mamba_n_heads",
                     "mamba_num_heads", "n_mamba_heads", "linear_num_key_heads", "linear_num_value_heads",
                     "n_groups", "mamba_n_groups", "mamba_ngroups"), HEADS),
    **dict.fromkeys(("head_dim", "mamba_d_head", "mamba_head_dim", "state_size", "mamba_d_state", "ssm_state_size",
                     "d_state", "conv_kernel", "mamba_d_conv", "conv_L_cache", "linear_conv_kernel_dim",
                     "linear_key_head_dim", "linear_value_head_dim", "qk_nope_head_dim", "qk_rope_head_dim",
                     "v_head_dim", "decay_low_rank_dim", "gate_low_rank_dim", "a_low_rank_dim", "v_low_rank_dim",
                     "adapter_rank", "chunk_size", "mamba_chunk_size"), STATE),
    **dict.fromkeys(("num_local_experts", "num_experts", "n_routed_experts", "n_shared_experts",
                     "num_experts_per_tok", "n_group", "topk_group"), EXPERTS),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx"), POSITIONS),
}
# config fields listing one entry per layer -> the longest accepted
LENGTH_BOUNDS: dict[str, int] = dict.fromkeys(
    ("layers_block_type", "layer_types", "hybrid_override_pattern", "block_types", "attn_layer_indices",
     "full_attn_idxs", "mlp_only_layers"), LAYERS)


def check_config_sizes(config: dict, where: str) -> None:
    """Refuse a config (a parsed config.json, its nested configs too) whose model-sizing fields
    are not integers within BOUNDS, or whose per-layer lists are longer than LENGTH_BOUNDS;
    ValueError naming `where`, the field, the value and the bound."""
    for path, field, value in _fields(config):
        if field in BOUNDS and value is not None:
            bound = BOUNDS[field]
            if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= bound):
                raise ValueError(f"{where}: {path}{field}={value!r} is outside the sanity bound for a model's size: "
                                 f"an integer in [0, {bound}]")
        if field in LENGTH_BOUNDS and isinstance(value, (list, str)) and len(value) > LENGTH_BOUNDS[field]:
            raise ValueError(f"{where}: {path}{field} has {len(value)} entries; at most {LENGTH_BOUNDS[field]} "
                             f"(one per layer) are accepted")


def _fields(config: dict, path: str = "") -> Iterator[tuple[str, str, object]]:
    """(the nesting path "text_config.", field, value) for every field of config and its nested configs."""
    for field, value in config.items():
        yield path, field, value
        if isinstance(value, dict):
            yield from _fields(value, f"{path}{field}.")


def check_memory(n_elements: int, bytes_each: int, copies: int, where: str) -> None:
    """Refuse building a model of n_elements weights of bytes_each bytes, held `copies` times at
    the peak, when that exceeds the memory this process can have (available_memory)."""
    needed, available = n_elements * bytes_each * copies, available_memory()
    if available is not None and needed > available:
        raise ValueError(f"{where}: the built model needs an estimated {_gib(needed)} ({n_elements} weights x "
                         f"{bytes_each} bytes x {copies} cop{'y' if copies == 1 else 'ies'} at the peak); "
                         f"at most the {_gib(available)} available memory is allowed")


def available_memory() -> int | None:
    """Bytes this process can still allocate: the system's MemAvailable, capped by the cgroup's
    memory.max less its memory.current (a container's limit); None where neither can be read."""
    candidates = [_meminfo_available()]
    limit, current = (_read_int(Path("/sys/fs/cgroup") / name) for name in ("memory.max", "memory.current"))
    if limit is not None and current is not None:
        candidates.append(max(limit - current, 0))
    known = [c for c in candidates if c is not None]
    return min(known) if known else None


def _meminfo_available() -> int | None:
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return _sysconf_available()
    for line in lines:
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024  # kB
    return _sysconf_available()


def _sysconf_available() -> int | None:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):  # absent, or "max" (no limit)
        return None


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:.3g} GiB"
