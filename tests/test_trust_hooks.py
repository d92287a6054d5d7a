"""A hook's output must keep the activation's dtype and device: another dtype is one clear error
naming the hook, never a silent cast (before: a complex patch lost its imaginary part, a float64
patch was rounded to float32 without a word)."""

import pytest
import torch

import models


@pytest.mark.parametrize("name", ["blocks.0.hook_resid_post", "blocks.0.mixer.hook_state"])
@pytest.mark.parametrize("dtype", [torch.complex64, torch.float64, torch.float16])
def test_a_hook_output_of_another_dtype_is_refused_naming_the_hook(name, dtype):
    model = models.build("mamba", vocab_size=8, d_model=8, n_layers=1)
    tokens = torch.randint(0, 8, (2, 5))

    def patch(x, hook):
        return (x + 1j) if dtype.is_complex else x.to(dtype)

    with pytest.raises(TypeError, match=rf"hook on '{name}' returned a {dtype} tensor .* the activation is torch.float32"):
        model.run_with_hooks(tokens, fwd_hooks=[(name, patch)])


def test_a_hook_output_of_the_same_dtype_still_patches():
    model = models.build("mamba", vocab_size=8, d_model=8, n_layers=1)
    tokens = torch.randint(0, 8, (2, 5))
    clean = model(tokens)
    patched = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_resid_post", lambda x, hook: x.flip(-1))])
    assert not torch.allclose(clean, patched)
