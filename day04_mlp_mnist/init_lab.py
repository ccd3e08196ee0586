"""Day 4 lab — initialisation and activations, each claim measured.

1. Symmetry: with zero or constant weights every hidden unit computes the same thing and gets the same gradient,
   so training can never tell them apart — the layer acts as one unit.
2. Signal through depth: the std of the activations through a 30-layer MLP (width 512) under too-small, Xavier,
   He and PyTorch's default init, with ReLU and with tanh. Var(W) = 2 / fan_in (He) makes up for ReLU zeroing
   half of its input; anything smaller shrinks the signal by a constant factor per layer.
3. Dead units: a too-large learning rate pushes hidden units negative for every input. ReLU then passes exactly
   zero gradient, so those units can never learn again; GELU's gradient underflows to 0 in float32 only far
   below 0, SiLU's practically never.
4. SwiGLU: three matrices instead of two, so hidden 8d/3 gives exactly the 8d² parameters of a 4d GELU MLP.

Run:  python day04_mlp_mnist/init_lab.py   (writes runs/day04_mlp_mnist/init_lab.{json,md}, activation_std.png)
"""
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import torch
import torch.nn as nn
import torch.nn.functional as F

from day04_mlp_mnist.main import ACTIVATIONS, MLP
from sprint import runs_dir, write_results
from sprint.cli import arg, parse, progress, run, validate
from sprint.data import mnist_split
from sprint.measure import count_params
from sprint.plots import save, subplots

# How each scheme draws a weight matrix (biases start at 0, except PyTorch's default, which keeps its own).
INITS = {
    "too small": lambda w: nn.init.normal_(w, std=0.01),  # a plausible guess; each ReLU layer scales the std by 0.16
    "Xavier": nn.init.xavier_normal_,  # Var = 2 / (fan_in + fan_out): keeps the variance of tanh (linear near 0)
    "He": lambda w: nn.init.kaiming_normal_(w, nonlinearity="relu"),  # Var = 2 / fan_in: ReLU zeroes half the signal
    "PyTorch default": None,  # nn.Linear's own: uniform with Var = 1 / (3 fan_in), a third of He's
}


def initialise(layer: nn.Linear, scheme: str) -> nn.Linear:
    if INITS[scheme] is not None:
        INITS[scheme](layer.weight)
        nn.init.zeros_(layer.bias)
    return layer


# --- 1. symmetry --------------------------------------------------------------------------------------------------
def train_small(model: nn.Module, x, y, steps: int, lr: float, seed: int) -> nn.Module:
    """`steps` Adam steps on random batches of 128 from (x, y)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, len(x), (128,), generator=g)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return model


def symmetry(weights: str, steps: int = 200, seed: int = 0) -> dict:
    """Train 784-64-10 (tanh) from `weights` = "zero", "constant" (0.01) or "random" (Xavier); count the hidden units
    that still differ from each other afterwards."""
    (x, y), (x_val, y_val) = mnist_split(5000, train_subset=5000)
    torch.manual_seed(seed)
    model = MLP(hidden=64, dropout=0.0, norm=False, act="tanh", init="xavier")
    for layer in (model.fc1, model.fc2):
        if weights != "random":
            nn.init.constant_(layer.weight, 0.0 if weights == "zero" else 0.01)
            nn.init.zeros_(layer.bias)
    before = model.fc1.weight.detach().clone()
    train_small(model, x, y, steps, 1e-3, seed)
    w = model.fc1.weight.detach()
    with torch.no_grad():
        acc = (model(x_val).argmax(1) == y_val).float().mean().item()
    return {"weights": weights, "distinct_hidden_units": len(torch.unique(w, dim=0)), "hidden_units": len(w),
            "max_weight_change": (w - before).abs().max().item(), "val_acc": acc}


# --- 2. activation std through depth ------------------------------------------------------------------------------
def activation_stds(scheme: str, act: str, depth: int = 30, width: int = 512, seed: int = 0) -> list[float]:
    """The std of each layer's output (after the activation) for 512 inputs drawn from N(0, 1)."""
    torch.manual_seed(seed)
    h = torch.randn(512, width)
    stds = []
    with torch.no_grad():
        for _ in range(depth):
            h = ACTIVATIONS[act]()(initialise(nn.Linear(width, width), scheme)(h))
            stds.append(h.std().item())
    return stds


# --- 3. dead units after a too-large learning rate ----------------------------------------------------------------
NORMAL_LR, TOO_LARGE_LR = 1e-3, 3e-2  # for Adam on this MLP


def dead_fraction(model: MLP, x: torch.Tensor) -> torch.Tensor:
    """Per hidden unit: True when its activation passes exactly zero gradient for every input in `x`."""
    with torch.no_grad():
        z = model.fc1(x.flatten(1))
    z.requires_grad_()
    (slope,) = torch.autograd.grad(model.act(z).sum(), z)  # d activation / d pre-activation, per input and unit
    return (slope == 0).all(0)


def zero_slope_below(act: str) -> float:
    """The largest pre-activation (on a 0.001 grid over [-100, 0]) where the activation's float32 gradient is 0."""
    z = torch.linspace(-100, 0, 100_001, requires_grad=True)
    (slope,) = torch.autograd.grad(ACTIVATIONS[act]()(z).sum(), z)
    return z[slope == 0].max().item()


def dead_units(act: str, lr: float, steps: int = 100, seed: int = 0) -> dict:
    """Adam at `lr` for `steps`, then `steps` more at a normal 1e-3: the dead units after each phase."""
    (x, y), (x_val, y_val) = mnist_split(5000, train_subset=5000)
    torch.manual_seed(seed)
    model = MLP(hidden=128, dropout=0.0, norm=False, act=act, init="he")
    train_small(model, x, y, steps, lr, seed)
    dead = dead_fraction(model, x)
    train_small(model, x, y, steps, NORMAL_LR, seed + 1)  # a fresh optimizer at a sane LR: can dead units recover?
    after = dead_fraction(model, x)
    with torch.no_grad():
        acc = (model(x_val).argmax(1) == y_val).float().mean().item()
    return {"act": act, "lr": lr, "dead": dead.float().mean().item(), "val_acc": acc,
            "zero_slope_below": zero_slope_below(act),
            "dead_after_recovery": after.float().mean().item(), "revived": (dead & ~after).float().mean().item()}


# --- 4. SwiGLU vs a 4d GELU MLP -----------------------------------------------------------------------------------
class SwiGLU(nn.Module):
    """The LLaMA-style feed-forward block: down(silu(gate(x)) * up(x)), no biases."""

    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.gate, self.up = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


def ffn_params(d: int) -> dict:
    """Parameters of a GELU MLP with hidden 4d and of SwiGLU with hidden 8d/3 and 4d, counted on the meta device."""
    with torch.device("meta"):  # shapes only: a d = 3072 block would otherwise allocate ~300 MB
        gelu = nn.Sequential(nn.Linear(d, 4 * d, bias=False), nn.GELU(), nn.Linear(4 * d, d, bias=False))
        return {"d": d, "gelu_4d": count_params(gelu), "swiglu_8d_3": count_params(SwiGLU(d, 8 * d // 3)),
                "swiglu_4d": count_params(SwiGLU(d, 4 * d)), "8d^2": 8 * d * d}


# --- report -------------------------------------------------------------------------------------------------------
def lab(seed: int = 0) -> dict:
    with progress(total=3 + 2 * len(INITS) + 4 + 2, desc="init lab", unit="experiment") as bar:
        def done(result):
            bar.update()
            return result

        return {
            "symmetry": [done(symmetry(w, seed=seed)) for w in ("zero", "constant", "random")],
            "stds": {act: {s: done(activation_stds(s, act, seed=seed)) for s in INITS} for act in ("relu", "tanh")},
            "dead": [done(dead_units("relu", NORMAL_LR, seed=seed))]
            + [done(dead_units(act, TOO_LARGE_LR, seed=seed)) for act in ("relu", "gelu", "silu")],
            "ffn": [done(ffn_params(d)) for d in (768, 3072)],
        }


def tables(r: dict) -> str:
    lines = ["| weights at start | hidden units still distinct after 200 steps | max weight change | val accuracy |",
             "|---|---|---|---|"]
    lines += [f"| {s['weights']} | {s['distinct_hidden_units']} of {s['hidden_units']} | "
              f"{s['max_weight_change']:.3g} | {100 * s['val_acc']:.1f}% |" for s in r["symmetry"]]
    lines += ["", "| activation | init | std after layer 1 | layer 10 | layer 30 | layer 30 / layer 1 |",
              "|---|---|---|---|---|---|"]
    for act, by_init in r["stds"].items():
        lines += [f"| {act} | {s} | {v[0]:.3g} | {v[9]:.3g} | {v[-1]:.3g} | {v[-1] / v[0]:.3g} |"
                  for s, v in by_init.items()]
    lines += ["", f"| activation | gradient exactly 0 below | Adam LR (100 steps) | dead units | dead after 100 more "
                  f"steps at {NORMAL_LR:g} | revived | val accuracy |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {d['act']} | {d['zero_slope_below']:.3g} | {d['lr']:g} | {100 * d['dead']:.1f}% | "
              f"{100 * d['dead_after_recovery']:.1f}% | {100 * d['revived']:.1f}% | {100 * d['val_acc']:.1f}% |"
              for d in r["dead"]]
    lines += ["", "| d | GELU MLP, hidden 4d | SwiGLU, hidden 8d/3 | SwiGLU, hidden 4d | 8d² |",
              "|---|---|---|---|---|"]
    lines += [f"| {f['d']} | {f['gelu_4d']:,} | {f['swiglu_8d_3']:,} | {f['swiglu_4d']:,} | {f['8d^2']:,} |"
              for f in r["ffn"]]
    return "\n".join(lines) + "\n"


def plot_stds(stds: dict, path: Path) -> Path:
    fig, axes = subplots(1, 2, figsize=(10, 4))
    for ax, (act, by_init) in zip(axes, stds.items()):
        for scheme, values in by_init.items():
            ax.plot(range(1, len(values) + 1), values, "o-", markersize=3, label=scheme)
        ax.set(title=f"{act}: activation std through {len(values)} layers (width 512)", xlabel="layer",
               ylabel="std of the layer's output", yscale="log")
        ax.legend()
    return save(fig, path)


@dataclass
class Config:
    seed: int = arg(0, "seed of the weights, the inputs and the batches", ge=0)

    def __post_init__(self):
        validate(self)


def main(argv=None) -> dict:
    cfg, out = parse(Config, argv, __doc__, out=runs_dir(__file__))
    result = lab(cfg.seed)
    text = tables(result)
    print(text)
    write_results(out, "init_lab", text, result)
    plot_stds(result["stds"], out / "activation_std.png")
    print(f"wrote {out / 'activation_std.png'}")
    return result


if __name__ == "__main__":
    run(main)
