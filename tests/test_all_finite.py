"""models.hooks.all_finite (the hooks' NaN / Inf check by min and max) agrees with
isfinite(x).all() wherever one bad value sits, in every floating and complex dtype."""

import pytest
import torch

from models.hooks import all_finite


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_one_bad_value_anywhere(dtype, bad):
    x = torch.randn(3, 37, 5).to(dtype)
    assert all_finite(x)
    for index in range(x.numel()):  # every offset within the vector lanes and the tail
        y = x.clone().view(-1)
        y[index] = bad if not dtype.is_complex else complex(0.0, bad)
        assert not all_finite(y.view_as(x)) and not bool(torch.isfinite(y).all())


def test_empty_and_grad():
    assert all_finite(torch.empty(0, 3))
    assert all_finite(torch.ones(4, requires_grad=True) * 2)
