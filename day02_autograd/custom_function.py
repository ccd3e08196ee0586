"""Day 2, lesson 5 — a custom torch.autograd.Function, and gradcheck as its test.

`SiLU` writes forward and backward by hand (the product rule); `gradcheck` compares that backward with finite
differences and accepts it in float64, rejects a backward that forgets a term, and cannot judge even the right
one in float32 (its eps = 1e-6 is below float32's resolution around 1).
"""
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.autograd import gradcheck

from day01_env_and_tensors.main import Error, error_of



class SiLU(torch.autograd.Function):
    """y = x * sigmoid(x). Product rule: dy/dx = s + x * s * (1 - s) = s * (1 + x * (1 - s)), s = sigmoid(x)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)  # what backward needs; autograd frees it after the pass
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad_out * s * (1 + x * (1 - s))


class SiLUWrongBackward(SiLU):
    """Same forward; the backward forgets the product rule's second term."""

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return grad_out * torch.sigmoid(x)


@dataclass(frozen=True)
class CustomFunction:
    correct_passes_float64: bool
    wrong_passes_float64: bool
    wrong_error: Error | None  # first line of gradcheck's error for the wrong backward
    correct_passes_float32: bool  # eps = 1e-6 is below float32's resolution around 1: the numerical Jacobian is noise
    float32_warning: str | None
    grad_minus_f_silu: float  # max |our SiLU's gradient - F.silu's|


def check_custom_function(seed: int = 0) -> CustomFunction:
    """gradcheck compares backward with finite differences: (f(x + eps) - f(x - eps)) / 2eps, eps = 1e-6."""
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(seed), dtype=torch.float64, requires_grad=True)
    x32 = x.detach().float().requires_grad_()
    with warnings.catch_warnings(record=True) as caught:  # gradcheck warns that float32 is not double
        warnings.simplefilter("always")
        float32_passes = gradcheck(SiLU.apply, (x32,), raise_exception=False)
    mine, = torch.autograd.grad(SiLU.apply(x).sum(), x)
    builtin, = torch.autograd.grad(F.silu(x).sum(), x)
    wrong = error_of(lambda: gradcheck(SiLUWrongBackward.apply, (x,)))
    return CustomFunction(gradcheck(SiLU.apply, (x,), raise_exception=False),
                          gradcheck(SiLUWrongBackward.apply, (x,), raise_exception=False),
                          wrong and Error(wrong.type, wrong.message.splitlines()[0]), float32_passes,
                          str(caught[0].message).split(".")[0] if caught else None, (mine - builtin).abs().max().item())
