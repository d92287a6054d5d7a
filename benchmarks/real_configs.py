"""The four real-size configurations of the real-size benchmark, as random-weight transformers
models (nothing is downloaded): GPT-2 small (124M), a 125M Llama with grouped-query attention,
Mamba-130m and Mamba-2 130M, each with the published checkpoint's shape.

    source = build_source("mamba2")            # transformers model, eval mode, float32
    ours = models.from_pretrained(source)      # our instrumented copy of the same weights
"""

from __future__ import annotations

import torch

REAL_SIZES = ("gpt2", "llama", "mamba", "mamba2")
HYBRIDS = ("nemotron_h",)  # hybrid configs of about the same size (generation benchmark)
# a 172M NemotronH (tied embeddings): 24 single-sublayer layers, Mamba-2 and relu2 MLPs alternating, attention at 3
NEMOTRON_H_LAYERS = [("full_attention" if layer % 8 == 7 else "linear_attention") if layer % 2 else "mlp"
                     for layer in range(1, 25)]
IDS = dict(pad_token_id=0, bos_token_id=0, eos_token_id=0)


def source_config(name: str):
    """The transformers config of `name` (one of REAL_SIZES)."""
    import transformers as tf

    if name == "gpt2":  # gpt2 (small): 12 layers, d 768, 12 heads, vocab 50257, 1024 positions
        return tf.GPT2Config()
    if name == "llama":  # a 125M Llama: 12 layers, d 768, 12 query heads over 4 key/value heads
        return tf.LlamaConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                              num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=4096,
                              tie_word_embeddings=False, **IDS)
    if name == "mamba":  # state-spaces/mamba-130m: 24 layers, d 768, d_inner 1536, d_state 16
        return tf.MambaConfig(vocab_size=50280, hidden_size=768, state_size=16, num_hidden_layers=24, expand=2,
                              conv_kernel=4, tie_word_embeddings=True, **IDS)
    if name == "mamba2":  # state-spaces/mamba2-130m: 24 layers, d 768, 24 heads of 64, d_state 128
        return tf.Mamba2Config(vocab_size=50288, hidden_size=768, state_size=128, num_hidden_layers=24, expand=2,
                               head_dim=64, num_heads=24, n_groups=1, conv_kernel=4, chunk_size=256, tie_word_embeddings=True, **IDS)
    if name == "nemotron_h":  # Mamba-2 layers of 24 heads of 64 (d_state 128), GQA 12 / 4, relu2 MLP 3072
        return tf.NemotronHConfig(vocab_size=50280, hidden_size=768, layers_block_type=NEMOTRON_H_LAYERS,
                                  num_attention_heads=12, num_key_value_heads=4, head_dim=64, intermediate_size=3072,
                                  ssm_state_size=128, mamba_num_heads=24, mamba_head_dim=64, n_groups=1,
                                  chunk_size=256, max_position_embeddings=4096, tie_word_embeddings=True, **IDS)
    raise ValueError(f"name must be one of {REAL_SIZES + HYBRIDS}; got {name!r}")


def build_source(name: str, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A random-weight transformers causal LM of the real config `name`, eval mode."""
    import transformers as tf

    torch.manual_seed(seed)
    config = source_config(name)
    cls = {"gpt2": tf.GPT2LMHeadModel, "llama": tf.LlamaForCausalLM, "mamba": tf.MambaForCausalLM,
           "mamba2": tf.Mamba2ForCausalLM, "nemotron_h": tf.NemotronHForCausalLM}[name]
    return cls(config).to(dtype).eval()


def tokens(name: str, batch: int, length: int, seed: int = 0) -> torch.Tensor:
    """Random token ids [batch, length] within the config's vocabulary."""
    vocab = source_config(name).vocab_size
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))
