"""Day 3 — linear regression by hand: y = 3x + 2.

No nn.Linear, no optimizer: the parameters are plain tensors with requires_grad, the loss is MSE written
out, and the SGD update and the gradient reset are done by hand — exactly what `optimizer.step()` and
`optimizer.zero_grad()` hide.

Run:    python day03_linreg/main.py        (a few seconds; writes day03_linreg/results/)
Gates:  python day03_linreg/check.py
"""
import argparse
import json
import sys
from pathlib import Path

import torch

OUT_DIR = Path(__file__).resolve().parent / "results"
TRUE_W, TRUE_B = 3.0, 2.0


def make_data(n: int = 200, noise: float = 0.005, seed: int = 0):
    """Points on y = 3x + 2 with a little Gaussian noise; x in [-1, 1] keeps the problem well conditioned."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g) * 2 - 1
    y = TRUE_W * x + TRUE_B + noise * torch.randn(n, 1, generator=g)
    return x, y


def fit(steps: int = 500, lr: float = 0.1, seed: int = 0) -> dict:
    """Full-batch gradient descent by hand; returns the fitted figures and the loss curve."""
    x, y = make_data(seed=seed)
    torch.manual_seed(seed)
    w = torch.randn(1, requires_grad=True)  # leaf tensors: autograd stores their .grad
    b = torch.zeros(1, requires_grad=True)
    losses = []
    for _ in range(steps):
        pred = x * w + b
        assert pred.shape == y.shape, (pred.shape, y.shape)  # (N,1) vs (N,) would silently broadcast to (N,N)
        loss = ((pred - y) ** 2).mean()
        loss.backward()
        with torch.no_grad():  # the update itself must not become part of the graph
            w -= lr * w.grad
            b -= lr * b.grad
        w.grad.zero_()  # gradients accumulate across backward() calls unless reset
        b.grad.zero_()
        losses.append(loss.item())

    # The closed-form least-squares answer the loop should agree with: solve [x 1] @ [w b]^T = y.
    design = torch.cat([x, torch.ones_like(x)], dim=1).double()
    w_ls, b_ls = torch.linalg.lstsq(design, y.double()).solution.flatten().tolist()
    with torch.no_grad():
        final_mse = ((x * w + b - y) ** 2).mean().item()
    return {"w": w.item(), "b": b.item(), "mse": final_mse, "w_lstsq": w_ls, "b_lstsq": b_ls,
            "steps": steps, "lr": lr, "losses": losses, "x": x.flatten().tolist(), "y": y.flatten().tolist()}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.scatter(result["x"], result["y"], s=8, alpha=0.6, label="data")
    xs = torch.linspace(-1, 1, 50)
    ax1.plot(xs, result["w"] * xs + result["b"], "r", label=f"fit: y = {result['w']:.4f}x + {result['b']:.4f}")
    ax1.set(title="y = 3x + 2, fitted by hand-written SGD", xlabel="x", ylabel="y")
    ax1.legend()
    ax2.semilogy(result["losses"])
    ax2.axhline(1e-4, color="gray", ls="--", label="gate: 1e-4")
    ax2.set(title="training MSE", xlabel="step", ylabel="MSE (log scale)")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="where the plot and summary go")
    args = parser.parse_args(argv)

    result = fit(args.steps, args.lr, args.seed)
    for step in sorted({0, 10, 50, 100, args.steps - 1} & set(range(args.steps))):
        print(f"step {step:4d}  mse {result['losses'][step]:.3e}")
    print(f"fitted     w = {result['w']:.5f}  b = {result['b']:.5f}  final MSE = {result['mse']:.2e}")
    print(f"lstsq      w = {result['w_lstsq']:.5f}  b = {result['b_lstsq']:.5f}  (closed form, float64)")
    args.out.mkdir(parents=True, exist_ok=True)
    plot(result, args.out / "fit.png")
    summary = {k: result[k] for k in ("w", "b", "mse", "w_lstsq", "b_lstsq", "steps", "lr")}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {args.out / 'fit.png'} and summary.json")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
