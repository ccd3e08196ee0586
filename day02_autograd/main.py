"""Day 2 — autograd: what backward() computes, and the rules around it.

Forward records, for each op, how to push a gradient back through it; backward walks that graph from the loss
and accumulates (+=) gradients into the leaf tensors. Each lesson below is a function that returns its evidence:
hand-derived gradients of six ops against autograd, leaf vs non-leaf and retain_grad, detach vs no_grad,
accumulation and zero_(), the freed graph and retain_graph, and a custom autograd.Function checked by gradcheck.

Run:    python day02_autograd/main.py     (a few seconds; writes day02_autograd/results/summary.json)
Gates:  python day02_autograd/check.py
"""
import argparse
import json
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import torch
import torch.nn.functional as F
from torch.autograd import gradcheck

from day01_env_and_tensors.main import error_of, shares_storage, show

OUT_DIR = Path(__file__).resolve().parent / "results"


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


# ----------------------------------------------------------------------------------------------------------
# 1. Six gradients derived by hand. `hand(g, *inputs)` is the vector-Jacobian product backward computes:
#    given g = dL/d(output), return dL/d(each input).
# ----------------------------------------------------------------------------------------------------------

@dataclass
class Op:
    formula: str
    shapes: tuple  # one shape per input
    forward: Callable
    hand: Callable
    positive: bool = False  # draw inputs from (0.5, 3.5) instead of N(0, 1), for log's domain


OPS = {
    # broadcasting copies b to every row in forward, so backward sums g over those rows
    "add": Op("x + b, b broadcast over rows: dx = g, db = g.sum(0)", ((3, 4), (4,)),
              lambda x, b: x + b, lambda g, x, b: (g, g.sum(0))),
    "mul": Op("x * y: dx = g*y, dy = g*x", ((3, 4), (3, 4)),
              lambda x, y: x * y, lambda g, x, y: (g * y, g * x)),
    "pow": Op("x**3: dx = 3 x**2 g", ((3, 4),),
              lambda x: x ** 3, lambda g, x: (3 * x ** 2 * g,)),
    "log": Op("log x: dx = g / x", ((3, 4),),
              torch.log, lambda g, x: (g / x,), positive=True),
    "tanh": Op("tanh x: dx = (1 - tanh(x)**2) g", ((3, 4),),
               torch.tanh, lambda g, x: ((1 - torch.tanh(x) ** 2) * g,)),
    "matmul": Op("A @ B: dA = g @ B.T, dB = A.T @ g", ((3, 4), (4, 2)),
                 lambda a, b: a @ b, lambda g, a, b: (g @ b.T, a.T @ g)),
}


def hand_vs_autograd(seed: int = 0) -> dict:
    """For each op: max |hand-derived gradient - autograd's| over all inputs, in float64."""
    gen = torch.Generator().manual_seed(seed)
    result = {}
    for name, op in OPS.items():
        inputs = []
        for shape in op.shapes:
            t = torch.rand(shape, generator=gen, dtype=torch.float64) * 3 + 0.5 if op.positive \
                else torch.randn(shape, generator=gen, dtype=torch.float64)
            inputs.append(t.requires_grad_())
        out = op.forward(*inputs)
        g = torch.randn(out.shape, generator=gen, dtype=torch.float64)  # a random upstream gradient, not just ones
        out.backward(g)
        with torch.no_grad():  # the hand formulas are plain arithmetic, not part of any graph
            hand = op.hand(g, *inputs)
        result[name] = {"formula": op.formula, "max_abs_diff": max(max_diff(h, x.grad) for h, x in zip(hand, inputs))}
    return result


def exact_linear_square(trials: int = 1000, seed: int = 0) -> dict:
    """L = (w*x + b)**2 on float32 scalars: the hand gradient 2(wx + b)x equals w.grad bit for bit."""
    gen = torch.Generator().manual_seed(seed)
    worst = 0.0
    for _ in range(trials):
        w, x, b = torch.randn(3, generator=gen).unbind()
        w = w.clone().requires_grad_()
        ((w * x + b) ** 2).backward()
        hand = 2 * (w.detach() * x + b) * x  # chain rule: dL/du = 2u, du/dw = x
        worst = max(worst, abs(hand.item() - w.grad.item()))
    return {"trials": trials, "max_abs_diff": worst}


# ----------------------------------------------------------------------------------------------------------
# 2. Leaves, non-leaves, retain_grad
# ----------------------------------------------------------------------------------------------------------

def leaf_and_retain_grad(seed: int = 0) -> dict:
    """Only leaves (tensors you created) keep .grad; an intermediate needs retain_grad() to keep its own."""
    w = torch.randn(3, generator=torch.Generator().manual_seed(seed), requires_grad=True)
    y = w * 2  # made by an op: has a grad_fn, so it is not a leaf
    (y ** 2).sum().backward()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y_grad_without_retain = y.grad  # None, and torch warns that you probably meant retain_grad()

    kept = w * 2
    kept.retain_grad()  # ask autograd to store this intermediate's gradient too
    (kept ** 2).sum().backward()
    return {
        "w.is_leaf": w.is_leaf, "w.grad_fn": str(w.grad_fn),
        "y.is_leaf": y.is_leaf, "y.grad_fn": type(y.grad_fn).__name__,
        "y.grad without retain_grad": y_grad_without_retain,
        "warning": caught[0].category.__name__ if caught else None,
        "retained grad - 2y": max_diff(kept.grad, 2 * kept.detach()),  # dL/dy of sum(y**2) is 2y
    }


# ----------------------------------------------------------------------------------------------------------
# 3. detach vs no_grad
# ----------------------------------------------------------------------------------------------------------

def saved_bytes(fn: Callable) -> int:
    """Bytes autograd saves for backward while fn runs (the activations that cost memory during training)."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total


def detach_vs_no_grad(seed: int = 0) -> dict:
    """detach(): one tensor leaves the graph (same memory). no_grad(): no graph at all inside the block."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(3, generator=gen, requires_grad=True)
    d = w.detach()
    (w * w).sum().backward()  # two paths to w: grad = 2w
    both_paths = w.grad.clone()
    w.grad = None
    (w * w.detach()).sum().backward()  # the detached factor is a constant: grad = w

    x = torch.randn(64, 128, generator=gen)
    w1 = torch.randn(128, 256, generator=gen, requires_grad=True)
    w2 = torch.randn(256, 10, generator=gen, requires_grad=True)

    def layer():
        return torch.tanh(x @ w1) @ w2

    with torch.no_grad():
        out = layer()
        no_grad_bytes = saved_bytes(layer)
    return {
        "detached.requires_grad": d.requires_grad,
        "detached shares storage": shares_storage(w, d),
        "grad of w*w - 2w": max_diff(both_paths, 2 * d),
        "grad of w*w.detach() - w": max_diff(w.grad, d),
        "no_grad output.requires_grad": out.requires_grad,
        "no_grad output.grad_fn": str(out.grad_fn),
        "saved bytes with grad": saved_bytes(layer),
        "saved bytes under no_grad": no_grad_bytes,
    }


# ----------------------------------------------------------------------------------------------------------
# 4. Gradients accumulate; the graph is freed after backward
# ----------------------------------------------------------------------------------------------------------

def accumulation(seed: int = 0) -> dict:
    """backward() adds into .grad; nothing resets it until you call zero_() (what optimizer.zero_grad() does)."""
    w = torch.randn(3, generator=torch.Generator().manual_seed(seed), requires_grad=True)
    (w ** 2).sum().backward()
    once = w.grad.clone()
    (w ** 2).sum().backward()
    twice = w.grad.clone()
    w.grad.zero_()
    zeroed = w.grad.clone()
    (w ** 2).sum().backward()
    return {
        "after two backward - 2 * after one": max_diff(twice, 2 * once),
        "max |grad| after zero_()": zeroed.abs().max().item(),
        "after zero_() and one backward - after one": max_diff(w.grad, once),
    }


def second_backward(seed: int = 0) -> dict:
    """Backward frees the tensors the graph saved; a second pass needs retain_graph=True on the first."""
    w = torch.randn(3, generator=torch.Generator().manual_seed(seed), requires_grad=True)
    loss = (w ** 2).sum()
    loss.backward()
    freed = error_of(loss.backward)

    w.grad = None
    loss = (w ** 2).sum()
    loss.backward(retain_graph=True)  # keep the saved tensors for one more pass
    retained = error_of(loss.backward)
    return {
        "second backward": freed,
        "second backward with retain_graph": retained,
        "grad after both - 2 * 2w": max_diff(w.grad, 4 * w.detach()),
    }


# ----------------------------------------------------------------------------------------------------------
# 5. A custom autograd.Function, checked by gradcheck
# ----------------------------------------------------------------------------------------------------------

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


def check_custom_function(seed: int = 0) -> dict:
    """gradcheck compares backward with finite differences: (f(x + eps) - f(x - eps)) / 2eps, eps = 1e-6."""
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(seed), dtype=torch.float64, requires_grad=True)
    x32 = x.detach().float().requires_grad_()
    with warnings.catch_warnings(record=True) as caught:  # gradcheck warns that float32 is not double
        warnings.simplefilter("always")
        float32_passes = gradcheck(SiLU.apply, (x32,), raise_exception=False)
    mine, = torch.autograd.grad(SiLU.apply(x).sum(), x)
    builtin, = torch.autograd.grad(F.silu(x).sum(), x)
    wrong = error_of(lambda: gradcheck(SiLUWrongBackward.apply, (x,)))
    return {
        "correct backward passes (float64)": gradcheck(SiLU.apply, (x,), raise_exception=False),
        "wrong backward passes (float64)": gradcheck(SiLUWrongBackward.apply, (x,), raise_exception=False),
        "wrong backward error": {"type": wrong["type"], "message": wrong["message"].splitlines()[0]},
        # eps = 1e-6 is below float32's resolution around 1, so the numerical Jacobian is noise:
        "correct backward passes (float32)": float32_passes,
        "float32 warning": str(caught[0].message).split(".")[0] if caught else None,
        "grad vs F.silu": max_diff(mine, builtin),
    }


# ----------------------------------------------------------------------------------------------------------

def all_lessons(trials: int = 1000, seed: int = 0) -> dict:
    return {
        "hand vs autograd (float64)": hand_vs_autograd(seed),
        "(w*x+b)**2, float32": exact_linear_square(trials, seed),
        "leaf and retain_grad": leaf_and_retain_grad(seed),
        "detach vs no_grad": detach_vs_no_grad(seed),
        "accumulation": accumulation(seed),
        "second backward": second_backward(seed),
        "custom autograd.Function": check_custom_function(seed),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000, help="random (w, x, b) triples for the exactness check")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="where summary.json goes")
    args = parser.parse_args(argv)
    if args.trials < 1:
        parser.error("--trials must be at least 1")

    lessons = all_lessons(args.trials, args.seed)
    for title, evidence in lessons.items():
        show(title, evidence)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(lessons, indent=2) + "\n")
    print(f"\nwrote {args.out / 'summary.json'}")
    return lessons


if __name__ == "__main__":
    main(sys.argv[1:])
