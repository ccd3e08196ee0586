"""Day 9 lab — normalisation, measured: the five things interviewers ask about BatchNorm and its alternatives.

1. Train vs eval mode. In train mode BatchNorm normalises with the batch's own statistics, so a sample's output
   depends on the rest of its batch; in eval mode it uses the running averages: deterministic per sample.
2. Batch size 1 in train mode. One value per feature has no variance: BatchNorm raises PyTorch's real error (the
   last, partial batch of an epoch is the classic culprit: `drop_last=True`). Eval mode and LayerNorm do not care.
3. `model.eval()` forgotten before validation. A train-mode pass rewrites the running statistics (even under
   `no_grad`); over label-sorted batches, as datasets stored by class produce, the accuracy afterwards drops.
4. BatchNorm vs GroupNorm vs LayerNorm (and none) at batch 2 and 128, the same number of steps.
5. RMSNorm in four lines equals `torch.nn.RMSNorm`; its cost next to LayerNorm is timed on this machine.

The network is Day 4's shape, smaller: 784-64-64-10 with a normalisation layer after each hidden Linear. Here
BatchNorm1d's statistics at batch 2 come from two numbers per feature, the starkest case; in a CNN, BatchNorm2d
also pools each channel over its H x W positions, which softens the effect without removing it. Adam, the
training images minus the validation split (`sprint.data.mnist_split`), accuracy on that validation split: the
test set is not used here.

Run:    python day09_cnn/norms_lab.py                              (writes runs/day09_cnn/norms.*)
        python day09_cnn/norms_lab.py --out day09_cnn/results      (refreshes the committed table and plot)
Gates:  python day09_cnn/check.py
"""
import copy
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import torch
import torch.nn as nn
import torch.nn.functional as F

from sprint import machine, runs_dir, write_results
from sprint.cli import arg, parse, progress, run, validate
from sprint.data import mnist_split
from sprint.measure import median_seconds
from sprint.plots import save, subplots

NORMS = {"BatchNorm": nn.BatchNorm1d, "GroupNorm": lambda c: nn.GroupNorm(8, c), "LayerNorm": nn.LayerNorm,
         "none": lambda c: nn.Identity()}


class RMSNorm(nn.Module):
    """LayerNorm without the centring: x / sqrt(mean(x^2) + eps), times a learned gain per feature (no bias)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


@dataclass
class Config:
    steps: int = arg(300, "Adam steps of every run, the same at each batch size", gt=0)
    batch_sizes: tuple[int, ...] = arg((2, 128), "batch sizes compared (BatchNorm needs at least 2)", ge=2)
    norms: tuple[str, ...] = arg(tuple(NORMS), "normalisations compared (BatchNorm and LayerNorm are needed)",
                                 choices=tuple(NORMS))
    lr: float = arg(1e-3, "Adam learning rate", gt=0)
    hidden: int = arg(64, "hidden width (a multiple of GroupNorm's 8 groups)", gt=0)
    seed: int = arg(0, "initialisation and batch-sampling seed", ge=0)
    timing: bool = arg(True, "time RMSNorm against LayerNorm (not needed by the gates)")

    def __post_init__(self):
        validate(self)
        if self.hidden % 8:
            raise ValueError(f"--hidden must be a multiple of 8 (GroupNorm's groups), got {self.hidden}")
        if not {"BatchNorm", "LayerNorm"} <= set(self.norms):
            raise ValueError(f"--norms must include BatchNorm and LayerNorm (parts 1-3 use them), got {self.norms}")


def net(norm: str, hidden: int = 128) -> nn.Sequential:
    make = NORMS[norm]
    return nn.Sequential(nn.Linear(784, hidden), make(hidden), nn.ReLU(),
                         nn.Linear(hidden, hidden), make(hidden), nn.ReLU(), nn.Linear(hidden, 10))


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()  # running statistics, and nothing updated
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


def fit(norm: str, batch_size: int, cfg: Config, data) -> tuple[nn.Module, float]:
    """Train for `cfg.steps` on random batches of `batch_size`; return the model and its validation accuracy."""
    (x, y), (x_val, y_val) = data
    torch.manual_seed(cfg.seed)
    pick = torch.Generator().manual_seed(cfg.seed)
    model = net(norm, cfg.hidden)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    model.train()
    for _ in range(cfg.steps):
        idx = torch.randint(len(x), (batch_size,), generator=pick)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return model, accuracy(model, x_val, y_val)


# --- 1 and 2: what a batch does to BatchNorm -----------------------------------------------------------------
def batch_dependence(bn_model: nn.Module, x: torch.Tensor) -> dict:
    """Sample 0's logits inside two batches that differ in every other sample, in train and in eval mode."""
    model = copy.deepcopy(bn_model)  # a train-mode forward updates running statistics: keep the original intact
    batch_a, batch_b = x[:32], torch.cat([x[:1], x[32:63]])
    out = {}
    with torch.no_grad():
        for mode in ("train", "eval"):
            model.train(mode == "train")
            out[mode] = (model(batch_a)[0] - model(batch_b)[0]).abs().max().item()
        model.eval()
        eval_logits = model(batch_a)
        model.train()
        out["train_vs_eval"] = (model(batch_a) - eval_logits).abs().max().item()
    return {"sample_change_train": out["train"], "sample_change_eval": out["eval"],
            "train_vs_eval": out["train_vs_eval"]}


def batch_of_one(bn_model: nn.Module, ln_model: nn.Module, x: torch.Tensor) -> dict:
    """Train mode at batch 1: BatchNorm's real error; eval mode and LayerNorm work."""
    model, error = copy.deepcopy(bn_model).train(), None
    try:
        model(x[:1])
    except ValueError as exc:
        error = str(exc)
    with torch.no_grad():
        eval_shape = list(copy.deepcopy(bn_model).eval()(x[:1]).shape)
        layernorm_shape = list(copy.deepcopy(ln_model).train()(x[:1]).shape)
    return {"train_error": error, "eval_output_shape": eval_shape, "layernorm_train_output_shape": layernorm_shape}


# --- 3: a validation pass that forgot model.eval() ---------------------------------------------------------
def running_stats(model: nn.Module) -> list[torch.Tensor]:
    return [b.clone() for name, b in model.named_buffers() if "running" in name]


def validation_pass(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 64) -> float:
    """The evaluation loop as written, without `model.eval()`: whatever mode the model is in."""
    hits = 0
    with torch.no_grad():  # no gradients, but train-mode BatchNorm still updates its running statistics
        for i in range(0, len(x), batch_size):
            hits += (model(x[i:i + batch_size]).argmax(1) == y[i:i + batch_size]).sum().item()
    return hits / len(x)


def forgotten_eval(bn_model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict:
    """Accuracy (eval mode) before and after one validation pass left in train mode, over label-sorted and over
    shuffled batches; and the running statistics after a correct, eval-mode pass."""
    by_label = torch.argsort(y, stable=True)  # a dataset stored class by class
    out = {"clean": accuracy(copy.deepcopy(bn_model), x, y)}
    for name, order in (("sorted", by_label), ("shuffled", torch.arange(len(y)))):
        model = copy.deepcopy(bn_model).train()  # the bug: still in train mode from the training loop
        out[f"reported_{name}"] = validation_pass(model, x[order], y[order])
        out[f"after_{name}"] = accuracy(model, x, y)
    model = copy.deepcopy(bn_model).eval()
    before = running_stats(model)
    validation_pass(model, x[by_label], y[by_label])
    out["eval_pass_stats_change"] = max(((a - b).abs().max().item() for a, b in zip(before, running_stats(model))),
                                        default=0.0)
    return out


# --- 5: RMSNorm -------------------------------------------------------------------------------------------
def rmsnorm_vs_torch(dim: int = 64, seed: int = 0) -> float:
    """Max |difference| of outputs, input gradients and weight gradients between `RMSNorm` and torch's."""
    torch.manual_seed(seed)
    ours, theirs = RMSNorm(dim), nn.RMSNorm(dim, eps=1e-6)
    with torch.no_grad():
        theirs.weight.copy_(torch.randn(dim))
        ours.weight.copy_(theirs.weight)
    x = torch.randn(16, dim) * 3 + 1
    grads = []
    for module in (ours, theirs):
        xi = x.clone().requires_grad_()
        y = module(xi)
        (y * torch.linspace(-1, 1, dim)).sum().backward()
        grads.append((y.detach(), xi.grad, module.weight.grad))
    return max((a - b).abs().max().item() for a, b in zip(*grads))


def rmsnorm_vs_layernorm_speed(rows: int = 4096, dim: int = 1024) -> dict:
    """Median forward time of LayerNorm, torch's RMSNorm and ours on one (rows, dim) float32 tensor."""
    x = torch.randn(rows, dim)
    modules = {"LayerNorm": nn.LayerNorm(dim), "torch.nn.RMSNorm": nn.RMSNorm(dim, eps=1e-6),
               "RMSNorm (ours)": RMSNorm(dim)}
    with torch.no_grad():
        ms = {name: 1e3 * median_seconds(lambda m=m: m(x), repeat=10, warmup=2) for name, m in modules.items()}
    return {"shape": [rows, dim], "ms": ms, "threads": torch.get_num_threads()}


# --- the lab -------------------------------------------------------------------------------------------------
def run_lab(cfg: Config = Config()) -> dict:
    (x, y), (x_val, y_val) = mnist_split()
    data = (x.flatten(1), y), (x_val.flatten(1), y_val)
    runs, models = [], {}
    for batch_size in cfg.batch_sizes:
        for norm in progress(cfg.norms, desc=f"batch {batch_size}", unit="run"):
            models[norm, batch_size], val_acc = fit(norm, batch_size, cfg, data)
            runs.append({"norm": norm, "batch_size": batch_size, "val_acc": val_acc})
            print(f"batch {batch_size:4d}  {norm:9s}  validation accuracy {val_acc:.2%}", flush=True)
    largest = max(cfg.batch_sizes)
    bn, ln = models["BatchNorm", largest], models["LayerNorm", largest]  # trained the usual way
    result = {"config": asdict(cfg), "machine": machine(), "runs": runs,
              "batch_dependence": batch_dependence(bn, data[1][0]),
              "batch_of_one": batch_of_one(bn, ln, data[1][0]),
              "forgotten_eval": forgotten_eval(bn, *data[1]),
              "rmsnorm_max_diff": rmsnorm_vs_torch()}
    if cfg.timing:
        result["rmsnorm_speed"] = rmsnorm_vs_layernorm_speed()
    return result


def accuracy_of(result: dict, norm: str, batch_size: int) -> float:
    return next(r["val_acc"] for r in result["runs"] if (r["norm"], r["batch_size"]) == (norm, batch_size))


def report(result: dict) -> str:
    """The README's tables, from the figures of this run."""
    sizes = result["config"]["batch_sizes"]
    lines = [f"Validation accuracy after {result['config']['steps']} Adam steps (lr {result['config']['lr']:g}), "
             f"784-{result['config']['hidden']}-{result['config']['hidden']}-10 MLP:", "",
             "| normalisation | " + " | ".join(f"batch {b}" for b in sizes) + " |",
             "|---|" + "---:|" * len(sizes)]
    for norm in result["config"]["norms"]:
        lines.append(f"| {norm} | " + " | ".join(f"{accuracy_of(result, norm, b):.2%}" for b in sizes) + " |")
    d, f, one = result["batch_dependence"], result["forgotten_eval"], result["batch_of_one"]
    lines += ["", "| BatchNorm, measured | value |", "|---|---:|",
              f"| sample 0's logits, batch-mates swapped, train mode: max change | {d['sample_change_train']:.3f} |",
              f"| same, eval mode | {d['sample_change_eval']:.1e} |",
              f"| train-mode vs eval-mode logits, same batch: max difference | {d['train_vs_eval']:.3f} |",
              f"| batch of 1 in train mode | `{one['train_error']}` |",
              f"| validation accuracy, eval mode (clean) | {f['clean']:.2%} |",
              f"| accuracy the forgotten-eval loop reports, label-sorted batches | {f['reported_sorted']:.2%} |",
              f"| accuracy afterwards (eval mode), label-sorted pass | {f['after_sorted']:.2%} |",
              f"| accuracy afterwards (eval mode), shuffled pass | {f['after_shuffled']:.2%} |",
              f"| running statistics changed by an eval-mode pass | {f['eval_pass_stats_change']:g} |",
              f"| RMSNorm (4 lines) vs `torch.nn.RMSNorm`: max difference (output, gradients) | "
              f"{result['rmsnorm_max_diff']:.1e} |"]
    if "rmsnorm_speed" in result:
        s = result["rmsnorm_speed"]
        lines += ["", f"Forward time on a {s['shape'][0]}x{s['shape'][1]} float32 tensor ({s['threads']} thread(s), "
                      f"{result['machine']}): " + ", ".join(f"{k} {v:.2f} ms" for k, v in s["ms"].items()) + "."]
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    sizes, f = result["config"]["batch_sizes"], result["forgotten_eval"]
    fig, (ax1, ax2) = subplots(1, 2, figsize=(11, 4))
    norms = result["config"]["norms"]
    width = 0.8 / len(norms)
    for i, norm in enumerate(norms):
        ax1.bar([j + i * width for j in range(len(sizes))], [100 * accuracy_of(result, norm, b) for b in sizes],
                width, label=norm)
    ax1.set(title=f"validation accuracy after {result['config']['steps']} steps", ylabel="accuracy (%)",
            xticks=[j + 0.4 - width / 2 for j in range(len(sizes))], xticklabels=[f"batch {b}" for b in sizes])
    ax1.legend(fontsize=8)
    labels = ["clean\n(eval mode)", "after a train-mode\npass, shuffled", "after a train-mode\npass, label-sorted"]
    ax2.bar(labels, [100 * f["clean"], 100 * f["after_shuffled"], 100 * f["after_sorted"]],
            color=["tab:green", "tab:orange", "tab:red"])
    ax2.set(title="BatchNorm: model.eval() forgotten during validation", ylabel="validation accuracy (%)")
    save(fig, path)


def main(argv=None) -> dict:
    cfg, out = parse(Config, argv, __doc__, out=runs_dir(__file__))
    result = run_lab(cfg)
    text = report(result)
    print("\n" + text)
    write_results(out, "norms", text, result)
    plot(result, out / "norms.png")
    print(f"wrote {out / 'norms.png'}")
    return result


if __name__ == "__main__":
    run(main)
