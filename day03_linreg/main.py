"""Day 3 — linear regression by hand: y = 3x + 2.

No nn.Linear, no optimizer: the parameters are plain tensors with requires_grad, the loss is MSE written
out, and the SGD update and the gradient reset are done by hand — exactly what `optimizer.step()` and
`optimizer.zero_grad()` hide. A learning rate above the stability limit 2 / λ_max(Hessian) makes the loss grow
every step; the loop notices and stops with a message instead of returning NaN weights.

Run:    python day03_linreg/main.py        (writes runs/day03_linreg/: fit.png, summary.json and its table)
Gates:  python day03_linreg/check.py
"""
import math
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import torch

from day03_linreg.report import fit_table
from sprint import runs_dir, write_results
from sprint.cli import UserError, arg, parse, run, validate
from sprint.plots import save, subplots

TRUE_W, TRUE_B = 3.0, 2.0


def make_data(n: int = 200, noise: float = 0.005, seed: int = 0):
    """Points on y = 3x + 2 with a little Gaussian noise; x in [-1, 1] keeps the problem well conditioned."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g) * 2 - 1
    y = TRUE_W * x + TRUE_B + noise * torch.randn(n, 1, generator=g)
    return x, y


def stable_lr_limit(x: torch.Tensor) -> float:
    """Gradient descent on this MSE converges only for lr < 2 / λ_max of its Hessian, 2/n · [x 1]ᵀ[x 1]."""
    design = torch.cat([x, torch.ones_like(x)], dim=1).double()
    return 2 / torch.linalg.eigvalsh(2 * design.T @ design / len(x)).max().item()


@dataclass(frozen=True)
class Fit:
    w: float
    b: float
    mse: float
    w_lstsq: float  # the closed-form least-squares answer the loop should agree with
    b_lstsq: float
    lr_limit: float  # the largest stable learning rate, 2 / λ_max
    losses: list[float]
    x: list[float]
    y: list[float]


def fit(steps: int = 500, lr: float = 0.1, seed: int = 0) -> Fit:
    """Full-batch gradient descent by hand; returns the fitted figures and the loss curve."""
    x, y = make_data(seed=seed)
    torch.manual_seed(seed)
    w = torch.randn(1, requires_grad=True)  # leaf tensors: autograd stores their .grad
    b = torch.zeros(1, requires_grad=True)
    limit = stable_lr_limit(x)
    losses = []
    for step in range(steps):
        pred = x * w + b
        assert pred.shape == y.shape, (pred.shape, y.shape)  # (N,1) vs (N,) would silently broadcast to (N,N)
        loss = ((pred - y) ** 2).mean()
        losses.append(loss.item())
        if not math.isfinite(losses[-1]) or losses[-1] > 10 * losses[0]:  # each step overshoots further
            raise UserError(f"--lr {lr:g} diverges: the MSE grew from {losses[0]:.3g} to {losses[-1]:.3g} by step "
                            f"{step}; on this data gradient descent is stable only for lr < {limit:.3g}")
        loss.backward()
        with torch.no_grad():  # the update itself must not become part of the graph
            w -= lr * w.grad
            b -= lr * b.grad
        w.grad.zero_()  # gradients accumulate across backward() calls unless reset
        b.grad.zero_()

    # The closed-form least-squares answer: solve [x 1] @ [w b]^T = y in float64.
    design = torch.cat([x, torch.ones_like(x)], dim=1).double()
    w_ls, b_ls = torch.linalg.lstsq(design, y.double()).solution.flatten().tolist()
    with torch.no_grad():
        final_mse = ((x * w + b - y) ** 2).mean().item()
    return Fit(w.item(), b.item(), final_mse, w_ls, b_ls, limit, losses, x.flatten().tolist(), y.flatten().tolist())


def plot(result: Fit, path: Path) -> None:
    fig, (ax1, ax2) = subplots(1, 2, figsize=(10, 4))
    ax1.scatter(result.x, result.y, s=8, alpha=0.6, label="data")
    xs = torch.linspace(-1, 1, 50)
    ax1.plot(xs, result.w * xs + result.b, "r", label=f"fit: y = {result.w:.4f}x + {result.b:.4f}")
    ax1.set(title="y = 3x + 2, fitted by hand-written SGD", xlabel="x", ylabel="y")
    ax1.legend()
    ax2.semilogy(result.losses)
    ax2.axhline(1e-4, color="gray", ls="--", label="gate: 1e-4")
    ax2.set(title="training MSE", xlabel="step", ylabel="MSE (log scale)")
    ax2.legend()
    save(fig, path)


@dataclass
class Config:
    steps: int = arg(500, "full-batch gradient-descent steps", gt=0)
    lr: float = arg(0.1, "learning rate (diverges above 2 / λ_max of the Hessian, about 1 here)", gt=0)
    seed: int = arg(0, "seed of the data and of w's initial value", ge=0)

    def __post_init__(self):
        validate(self)


def main(argv=None) -> Fit:
    cfg, out = parse(Config, argv, __doc__, out=runs_dir(__file__))
    result = fit(cfg.steps, cfg.lr, cfg.seed)
    for step in sorted({0, 10, 50, 100, cfg.steps - 1} & set(range(cfg.steps))):
        print(f"step {step:4d}  mse {result.losses[step]:.3e}")
    print(f"fitted     w = {result.w:.5f}  b = {result.b:.5f}  final MSE = {result.mse:.2e}")
    print(f"lstsq      w = {result.w_lstsq:.5f}  b = {result.b_lstsq:.5f}  (closed form, float64)")
    print(f"stable learning rates: lr < {result.lr_limit:.3f} (2 / largest eigenvalue of the Hessian)")
    out.mkdir(parents=True, exist_ok=True)
    plot(result, out / "fit.png")
    summary = {k: getattr(result, k) for k in ("w", "b", "mse", "w_lstsq", "b_lstsq", "lr_limit")}
    summary |= {"steps": cfg.steps, "lr": cfg.lr}
    write_results(out, "summary", fit_table(summary), summary)
    return result


if __name__ == "__main__":
    run(main)
