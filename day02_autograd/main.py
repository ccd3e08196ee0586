"""Day 2 — autograd: what backward() computes, and the rules around it.

Forward records, for each op, how to push a gradient back through it; backward walks that graph from the loss
and accumulates (+=) gradients into the leaf tensors. Each lesson below is a function that returns its evidence:
hand-derived gradients of six ops against autograd, leaf vs non-leaf and retain_grad, detach vs no_grad,
accumulation and zero_(), the freed graph and retain_graph, and a custom autograd.Function checked by gradcheck
(`custom_function.py`).

Run:    python day02_autograd/main.py     (writes runs/day02_autograd/summary.json and its table, summary.md)
Gates:  python day02_autograd/check.py
"""
import dataclasses
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import torch

from day01_env_and_tensors.main import Error, error_of, shares_storage, show
from day02_autograd.custom_function import CustomFunction, check_custom_function
from day02_autograd.report import lessons_table
from sprint import runs_dir, write_results
from sprint.cli import arg, parse, run, validate


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


@dataclass(frozen=True)
class HandCheck:
    formula: str
    max_abs_diff: float  # max |hand-derived gradient - autograd's| over all inputs


def hand_vs_autograd(seed: int = 0) -> dict[str, HandCheck]:
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
        result[name] = HandCheck(op.formula, max(max_diff(h, x.grad) for h, x in zip(hand, inputs)))
    return result


@dataclass(frozen=True)
class Exactness:
    trials: int
    max_abs_diff: float  # max |hand gradient - w.grad| over the trials


def exact_linear_square(trials: int = 1000, seed: int = 0) -> Exactness:
    """L = (w*x + b)**2 on float32 scalars: the hand gradient 2(wx + b)x equals w.grad bit for bit."""
    gen = torch.Generator().manual_seed(seed)
    worst = 0.0
    for _ in range(trials):
        w, x, b = torch.randn(3, generator=gen).unbind()
        w = w.clone().requires_grad_()
        ((w * x + b) ** 2).backward()
        hand = 2 * (w.detach() * x + b) * x  # chain rule: dL/du = 2u, du/dw = x
        worst = max(worst, abs(hand.item() - w.grad.item()))
    return Exactness(trials, worst)


# ----------------------------------------------------------------------------------------------------------
# 2. Leaves, non-leaves, retain_grad
# ----------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Leaves:
    w_is_leaf: bool  # w: created by the user
    w_grad_fn: str
    y_is_leaf: bool  # y = w * 2: made by an op
    y_grad_fn: str
    y_grad_is_none: bool  # y.grad after backward, without retain_grad
    warning: str | None  # what reading y.grad raised as a warning
    retained_grad_minus_2y: float  # max |y.grad - 2y| after y.retain_grad()


def leaf_and_retain_grad(seed: int = 0) -> Leaves:
    """Only leaves (tensors you created) keep .grad; an intermediate needs retain_grad() to keep its own."""
    w = torch.randn(3, generator=torch.Generator().manual_seed(seed), requires_grad=True)
    y = w * 2  # made by an op: has a grad_fn, so it is not a leaf
    (y ** 2).sum().backward()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y_grad_is_none = y.grad is None  # and torch warns that you probably meant retain_grad()

    kept = w * 2
    kept.retain_grad()  # ask autograd to store this intermediate's gradient too
    (kept ** 2).sum().backward()
    return Leaves(w.is_leaf, str(w.grad_fn), y.is_leaf, type(y.grad_fn).__name__, y_grad_is_none,
                  caught[0].category.__name__ if caught else None,
                  max_diff(kept.grad, 2 * kept.detach()))  # dL/dy of sum(y**2) is 2y


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


@dataclass(frozen=True)
class DetachNoGrad:
    detached_requires_grad: bool
    detached_shares_storage: bool
    grad_of_w_times_w_minus_2w: float  # max |w.grad - 2w| for sum(w * w): two paths
    grad_of_w_times_detached_w_minus_w: float  # max |w.grad - w| for sum(w * w.detach()): one path
    no_grad_output_requires_grad: bool
    no_grad_output_grad_fn: str
    saved_bytes_with_grad: int
    saved_bytes_under_no_grad: int


def detach_vs_no_grad(seed: int = 0) -> DetachNoGrad:
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
    return DetachNoGrad(d.requires_grad, shares_storage(w, d), max_diff(both_paths, 2 * d), max_diff(w.grad, d),
                        out.requires_grad, str(out.grad_fn), saved_bytes(layer), no_grad_bytes)


# ----------------------------------------------------------------------------------------------------------
# 4. Gradients accumulate; the graph is freed after backward
# ----------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Accumulation:
    two_backward_minus_twice_one: float  # max |grad after 2 backward - 2 * grad after 1|
    after_zero: float  # max |grad| after grad.zero_()
    zero_then_one_backward_minus_one: float  # max |grad after zero_() + 1 backward - grad after 1|


def accumulation(seed: int = 0) -> Accumulation:
    """backward() adds into .grad; nothing resets it until you call zero_() (what optimizer.zero_grad() does)."""
    w = torch.randn(3, generator=torch.Generator().manual_seed(seed), requires_grad=True)
    (w ** 2).sum().backward()
    once = w.grad.clone()
    (w ** 2).sum().backward()
    twice = w.grad.clone()
    w.grad.zero_()
    zeroed = w.grad.clone()
    (w ** 2).sum().backward()
    return Accumulation(max_diff(twice, 2 * once), zeroed.abs().max().item(), max_diff(w.grad, once))


@dataclass(frozen=True)
class SecondBackward:
    error: Error | None  # a second loss.backward() after the graph was freed
    error_with_retain_graph: Error | None  # the same after backward(retain_graph=True)
    grad_minus_4w: float  # max |w.grad - 2 * 2w| after both passes


def second_backward(seed: int = 0) -> SecondBackward:
    """Backward frees the tensors the graph saved; a second pass needs retain_graph=True on the first."""
    w = torch.randn(3, generator=torch.Generator().manual_seed(seed), requires_grad=True)
    loss = (w ** 2).sum()
    loss.backward()
    freed = error_of(loss.backward)

    w.grad = None
    loss = (w ** 2).sum()
    loss.backward(retain_graph=True)  # keep the saved tensors for one more pass
    retained = error_of(loss.backward)
    return SecondBackward(freed, retained, max_diff(w.grad, 4 * w.detach()))


# ----------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Lessons:
    hand_vs_autograd: dict[str, HandCheck]  # float64
    linear_square_float32: Exactness
    leaves: Leaves
    detach_vs_no_grad: DetachNoGrad
    accumulation: Accumulation
    second_backward: SecondBackward
    custom_function: CustomFunction


def all_lessons(trials: int = 1000, seed: int = 0) -> Lessons:
    return Lessons(hand_vs_autograd(seed), exact_linear_square(trials, seed), leaf_and_retain_grad(seed),
                   detach_vs_no_grad(seed), accumulation(seed), second_backward(seed), check_custom_function(seed))


@dataclass
class Config:
    trials: int = arg(1000, "random (w, x, b) triples for the exactness check", gt=0)
    seed: int = arg(0, "seed of the random inputs", ge=0)

    def __post_init__(self):
        validate(self)


def main(argv=None) -> Lessons:
    cfg, out = parse(Config, argv, __doc__, out=runs_dir(__file__))
    lessons = all_lessons(cfg.trials, cfg.seed)
    for field in dataclasses.fields(lessons):
        show(field.name.replace("_", " "), getattr(lessons, field.name))
    summary = dataclasses.asdict(lessons)
    write_results(out, "summary", lessons_table(summary), summary)
    return lessons


if __name__ == "__main__":
    run(main)
