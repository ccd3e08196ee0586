"""Day 7 lab — schedules, clipping and batch-size scaling, measured on the Day 4 MLP.

1. Warmup + cosine: Day 6's `warmup_cosine` stepped through a whole run (check.py compares every step with the
   formula). At a high peak LR, the same run without warmup ends with a worse validation loss: the first AdamW steps
   move every weight by about the full LR whatever its gradient, before the second-moment estimates mean anything.
2. `clip_grad_norm_` returns the global norm *before* clipping and rescales all gradients together, so their global
   norm after it is at most `max_norm` and their direction is unchanged.
3. With fp16 and a GradScaler, clipping before `unscale_` clips the *scaled* gradients: every step is cut to
   max_norm / scale. SGD then barely moves; AdamW hides it, because dividing by √v cancels a uniform rescale.
4. Batch 32 → 128 (4× fewer steps for the same epoch): the linear rule (LR × 4) and the square-root rule (LR × 2)
   against the batch-32 run; which one reproduces it here is measured, not assumed.
5. Weight decay, decoupled or not, at the same strength λ: AdamW shrinks every weight by (1 - LR·λ) a step,
   whatever its gradient; Adam's `weight_decay` adds λ·p to the gradient (L2), so the adaptive denominator √v rescales
   the decay too: weights with small gradients decay far more than those with large ones, and multiplying the loss
   changes the run (Adam alone is invariant to it). And the no-decay group (biases and LayerNorm's gains and shifts,
   Day 6's `decay_groups`): which parameters it holds, and what decaying them too changes.

Run:    python day07_amp_accum/optim_lab.py                                 # writes to runs/day07_amp_accum/optim/
        python day07_amp_accum/optim_lab.py --out day07_amp_accum/results   # refresh the committed figures
Gates:  python day07_amp_accum/check.py
"""
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import torch
import torch.nn.functional as F

from day04_mlp_mnist.main import MLP, evaluate
from day06_ckpt_resume.main import decay_groups, warmup_cosine
from day06_ckpt_resume.report import write_results
from day07_amp_accum.report import plot_optim, write_optim_table
from sprint import runs_dir
from sprint.cli import arg, parse, progress, run, validate
from sprint.data import mnist_split
from sprint.device import pick_device

CLIP_ORDERS = ("unscale, then clip", "clip, then unscale")


@dataclass
class LabConfig:
    subset: int = arg(8192, "training images (one epoch per run)", gt=0, le=55000)
    hidden: int = arg(256, "hidden units of the MLP", gt=0)
    batch: int = arg(128, "batch size of the warmup and clipping runs", gt=0)
    high_lr: float = arg(3e-2, "peak LR of the warmup comparison (15x Day 6's default)", gt=0)
    warmup_steps: int = arg(13, "warmup steps of the warmup run (of 64 at the default subset and batch)", gt=0)
    clip: float = arg(1.0, "max_norm of clip_grad_norm_", gt=0)
    sgd_lr: float = arg(0.1, "SGD (momentum 0.9) LR of the clipping-order runs", gt=0)
    adamw_lr: float = arg(2e-3, "AdamW LR of the clipping-order runs", gt=0)
    base_batch: int = arg(32, "batch of the LR-scaling base run; the others use 4x", gt=0)
    base_lr: float = arg(1e-3, "AdamW LR of the LR-scaling base run", gt=0)
    seeds: tuple[int, ...] = arg((0, 1), "seeds of the warmup, LR-scaling and no-decay-group comparisons", ge=0)
    weight_decay: float = arg(0.05, "weight decay λ of the AdamW / Adam + L2 comparison (Day 6's default); the "
                              "no-decay-group comparison also runs 10λ", gt=0)
    loss_scale: float = arg(100.0, "factor on the loss in the decay comparison's scaled runs", gt=0)
    device: str = arg("cpu", "cpu, cuda, cuda:N or mps (fp16 autocast runs on each)")

    def __post_init__(self):
        validate(self)


@dataclass
class Run:
    """One training run of the MLP: one epoch of the subset, then the validation split."""
    val_loss: float
    val_acc: float
    losses: list[float]  # training loss at every step
    post_clip_norm: float | None  # mean global gradient norm the optimizer was handed (clipping runs only)


@dataclass
class ClipFacts:
    """clip_grad_norm_ on one batch's gradients, once above max_norm and once below."""
    max_norm: float
    returned: float  # what clip_grad_norm_ returned
    norm_before: float  # global norm computed by hand before the call
    norm_after: float
    cosine_before_after: float  # direction kept?
    small_returned: float  # the same gradients scaled below max_norm
    small_unchanged: bool  # ... are left bit for bit as they were


@dataclass
class DecayRun:
    """One epoch of the MLP (no Dropout) in the weight-decay comparison."""
    val_loss: float
    fc1_norm: float  # ||fc1.weight|| after the epoch
    gain_mean: float  # mean LayerNorm gain after it (1 at the start)


@dataclass
class DecayFacts:
    weight_decay: float  # λ, the same for AdamW and Adam
    loss_scale: float
    groups: dict[str, list[str]]  # "decay" / "no decay": the parameter names Day 6's decay_groups puts in each
    runs: dict[str, DecayRun]  # "no decay", "AdamW", "Adam + L2", and each with the loss times loss_scale
    decoupled_factor: float  # prod(1 - LR_t λ) over the epoch: what AdamW's decay alone leaves of a weight
    shrink: dict[str, list[float]]  # optimizer -> ||fc1 half|| / the same half's without decay, for the weights
    #   whose second moment v (in the run without decay) is above the median, then for those below it
    scale_change: dict[str, float]  # optimizer -> largest relative change of the final weights when the loss is scaled
    ablation: list[dict]  # per λ and seed: val loss and mean LayerNorm gain with the no-decay group, and with decay
    #   on every parameter


@dataclass
class Lab:
    config: LabConfig
    schedule_lr: list[float]  # the LR warmup_cosine gives at every step of a 64-step run, peak 1
    warmup: dict[str, list[Run]]  # "no warmup" / "warmup": one run per seed
    clip: ClipFacts
    clip_order: dict[str, dict[str, Run]]  # optimizer -> order -> run
    scaling: dict[str, list[Run]]  # "batch 32" / "batch 128, same LR" / "... LR x2 (square root)" / "... x4 (linear)"
    scaling_closest: list[str]  # per seed: the batch-128 run whose validation loss is nearest the batch-32 run's
    decay: DecayFacts


def global_norm(grads) -> float:
    """The norm of all gradients taken together, as clip_grad_norm_ measures it."""
    return torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item()


def train_mlp(cfg: LabConfig, data, *, lr: float, batch: int, warmup: int, seed: int, optimizer: str = "adamw",
              clip_order: str | None = None) -> Run:
    """One epoch of the MLP with warmup + cosine. With `clip_order`: fp16 autocast, a GradScaler at 2^16 and
    clip_grad_norm_ before or after unscale_."""
    (x, y), (x_val, y_val) = data
    device = x.device
    torch.manual_seed(seed)
    model = MLP(784, cfg.hidden, 10, dropout=0.0).to(device)
    opt = (torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0) if optimizer == "adamw"
           else torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9))
    scheduler = warmup_cosine(opt, warmup, math.ceil(len(x) / batch), min_ratio=0.05)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0 ** 16, enabled=clip_order is not None)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed)).to(device)
    losses, norms = [], []
    for idx in order.split(batch):
        with torch.autocast(device.type, dtype=torch.float16, enabled=clip_order is not None):
            loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if clip_order == "unscale, then clip":
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        elif clip_order == "clip, then unscale":  # the mistake: the threshold meets the scaled gradients
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
            scaler.unscale_(opt)
        if clip_order:
            norms.append(global_norm(p.grad for p in model.parameters()))
        scaler.step(opt)
        scaler.update()
        scheduler.step()
        losses.append(loss.item())
    ev = evaluate(model, x_val, y_val)
    return Run(ev["loss"], ev["acc"], losses, sum(norms) / len(norms) if norms else None)


def schedule_lr(warmup: int, total: int, min_ratio: float = 0.05) -> list[float]:
    """The LR of every step of a `total`-step run under Day 6's warmup_cosine, peak LR 1."""
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    scheduler, lrs = warmup_cosine(opt, warmup, total, min_ratio), []
    for _ in range(total):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    return lrs


def clip_facts(cfg: LabConfig, data) -> ClipFacts:
    """Gradients of one batch (the loss scaled up so their norm exceeds max_norm), clipped by clip_grad_norm_."""
    (x, y), _ = data
    torch.manual_seed(0)
    model = MLP(784, cfg.hidden, 10, dropout=0.0).to(x.device)
    (100 * F.cross_entropy(model(x[:cfg.batch]), y[:cfg.batch])).backward()
    before = [p.grad.clone() for p in model.parameters()]
    norm_before = global_norm(before)
    returned = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip).item()
    after = [p.grad.clone() for p in model.parameters()]
    flat = [torch.cat([g.flatten() for g in grads]).double() for grads in (before, after)]
    for p in model.parameters():  # a tenth of max_norm: clip_grad_norm_ must leave them alone
        p.grad.mul_(0.1)
    small = [p.grad.clone() for p in model.parameters()]
    small_returned = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip).item()
    unchanged = all(torch.equal(a, p.grad) for a, p in zip(small, model.parameters()))
    return ClipFacts(cfg.clip, returned, norm_before, global_norm(after),
                     F.cosine_similarity(*flat, dim=0).item(), small_returned, unchanged)


def decay_run(cfg: LabConfig, data, *, optimizer: str, weight_decay: float, seed: int, loss_scale: float = 1.0,
              decay_all: bool = False) -> tuple[torch.nn.Module, torch.optim.Optimizer, list[float]]:
    """One epoch of the MLP, AdamW at the clipping runs' LR with warmup + cosine: "AdamW" decays the weight matrices
    (decay_groups) by LR·λ·p a step; "Adam + L2" is torch.optim.Adam with the same groups, which adds λ·p to their
    gradients. `decay_all`: the biases and LayerNorm parameters decayed too. Returns the model, the optimizer and the
    LR of every step."""
    (x, y), _ = data
    torch.manual_seed(seed)
    model = MLP(784, cfg.hidden, 10, dropout=0.0).to(x.device)
    groups = decay_groups(model, weight_decay)
    if decay_all:
        groups[1]["weight_decay"] = weight_decay
    opt = {"AdamW": torch.optim.AdamW, "Adam + L2": torch.optim.Adam}[optimizer](groups, lr=cfg.adamw_lr)
    scheduler = warmup_cosine(opt, cfg.warmup_steps, math.ceil(len(x) / cfg.batch), min_ratio=0.05)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed)).to(x.device)
    lrs = []
    for idx in order.split(cfg.batch):
        loss = F.cross_entropy(model(x[idx]), y[idx]) * loss_scale
        opt.zero_grad(set_to_none=True)
        loss.backward()
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    return model, opt, lrs


def decay_run_count(cfg: LabConfig) -> int:
    """The trainings part 5 makes with its default ablation: no decay; AdamW and Adam + L2, each plain and with the
    loss scaled; decay on the group and on every parameter at λ and 10λ on each seed, less the group at λ on the
    first seed, which is the plain AdamW run."""
    return 1 + 2 * 2 + 2 * 2 * len(cfg.seeds) - 1


@torch.no_grad()
def decay_lab(cfg: LabConfig, data, ablation_decays=None, ablation_seeds=None, on_run=None) -> DecayFacts:
    """Part 5: AdamW against Adam + L2 at the same λ (and with the loss scaled), then the no-decay group against decay
    on every parameter at λ and 10λ (`ablation_decays`), on each seed (`ablation_seeds`). `on_run()` is called after
    each training."""
    (_, _), (x_val, y_val) = data
    lam, scale, seed = cfg.weight_decay, cfg.loss_scale, cfg.seeds[0]
    models = {}

    def trained(optimizer: str, weight_decay: float, seed: int, loss_scale: float = 1.0, decay_all: bool = False):
        key = (optimizer, weight_decay, seed, loss_scale, decay_all)
        if key not in models:
            with torch.enable_grad():
                models[key] = decay_run(cfg, data, optimizer=optimizer, weight_decay=weight_decay, seed=seed,
                                        loss_scale=loss_scale, decay_all=decay_all)
            if on_run:
                on_run()
        return models[key]

    def figures(model) -> DecayRun:
        return DecayRun(evaluate(model, x_val, y_val)["loss"], model.fc1.weight.norm().item(),
                        model.norm.weight.mean().item())

    base, base_opt, lrs = trained("AdamW", 0.0, seed)
    names = {p: n for n, p in base.named_parameters()}
    groups = dict(zip(("decay", "no decay"), ([names[p] for p in g["params"]] for g in base_opt.param_groups)))
    v = base_opt.state[base.fc1.weight]["exp_avg_sq"]  # each weight's mean squared gradient, as Adam tracks it
    halves = (v >= v.median(), v < v.median())
    runs, shrink, change = {"no decay": figures(base)}, {}, {}
    for name in ("AdamW", "Adam + L2"):
        model, scaled = trained(name, lam, seed)[0], trained(name, lam, seed, scale)[0]
        runs[name], runs[f"{name}, loss x{scale:g}"] = figures(model), figures(scaled)
        shrink[name] = [(model.fc1.weight[h].norm() / base.fc1.weight[h].norm()).item() for h in halves]
        change[name] = max(((a - b).abs().max() / b.abs().max()).item()
                           for a, b in zip(scaled.parameters(), model.parameters()))
    ablation = []
    for weight_decay in ablation_decays or (lam, 10 * lam):
        for s in ablation_seeds or cfg.seeds:
            group, every = (trained("AdamW", weight_decay, s, decay_all=all_)[0] for all_ in (False, True))
            (g, e) = (figures(group), figures(every))
            ablation.append({"weight_decay": weight_decay, "seed": s, "group_val_loss": g.val_loss,
                             "all_val_loss": e.val_loss, "group_gain_mean": g.gain_mean, "all_gain_mean": e.gain_mean})
    return DecayFacts(lam, scale, groups, runs, math.prod(1 - lr * lam for lr in lrs), shrink, change, ablation)


def run_lab(cfg: LabConfig) -> Lab:
    device = pick_device(cfg.device)
    (x, y), (x_val, y_val) = mnist_split(5000, train_subset=cfg.subset)
    data = ((x.to(device), y.to(device)), (x_val.to(device), y_val.to(device)))
    n_runs = 2 * len(cfg.seeds) + 4 + 4 * len(cfg.seeds) + decay_run_count(cfg)
    bar = progress(total=n_runs, unit="run")

    def train(**kwargs) -> Run:
        result = train_mlp(cfg, data, **kwargs)
        bar.update()
        return result

    warmup = {name: [train(lr=cfg.high_lr, batch=cfg.batch, warmup=w, seed=s) for s in cfg.seeds]
              for name, w in (("no warmup", 0), (f"warmup {cfg.warmup_steps} steps", cfg.warmup_steps))}
    clip_order = {opt: {order: train(lr=lr, batch=cfg.batch, warmup=cfg.warmup_steps, seed=cfg.seeds[0],
                                     optimizer=opt, clip_order=order) for order in CLIP_ORDERS}
                  for opt, lr in (("adamw", cfg.adamw_lr), ("sgd", cfg.sgd_lr))}
    big, steps = 4 * cfg.base_batch, math.ceil(cfg.subset / cfg.base_batch)
    scaling = {f"batch {cfg.base_batch}, LR {cfg.base_lr:g}": [
        train(lr=cfg.base_lr, batch=cfg.base_batch, warmup=steps // 20, seed=s) for s in cfg.seeds]}
    for name, factor in (("same LR", 1), ("LR x2 (square root)", 2), ("LR x4 (linear)", 4)):
        scaling[f"batch {big}, {name}"] = [train(lr=cfg.base_lr * factor, batch=big, warmup=steps // 80, seed=s)
                                           for s in cfg.seeds]
    decay = decay_lab(cfg, data, on_run=bar.update)
    bar.close()
    base = next(iter(scaling.values()))
    closest = [min(list(scaling)[1:], key=lambda k: abs(scaling[k][i].val_loss - base[i].val_loss))
               for i in range(len(cfg.seeds))]
    total = math.ceil(cfg.subset / cfg.batch)
    return Lab(cfg, schedule_lr(cfg.warmup_steps, total), warmup, clip_facts(cfg, data), clip_order, scaling,
               closest, decay)


def main(argv=None) -> Lab:
    cfg, out = parse(LabConfig, argv, __doc__, out=runs_dir(__file__, "optim"))
    t0 = time.perf_counter()
    lab = run_lab(cfg)
    for name, runs in lab.warmup.items():
        print(f"peak LR {cfg.high_lr:g}, {name}: validation loss "
              + ", ".join(f"{r.val_loss:.4f}" for r in runs) + f" (seeds {cfg.seeds})")
    c = lab.clip
    print(f"clip_grad_norm_ returned {c.returned:.4f} (global norm before: {c.norm_before:.4f}); after: "
          f"{c.norm_after:.6f} <= {c.max_norm:g}")
    for opt, runs in lab.clip_order.items():
        print(f"{opt}: " + "; ".join(f"{order}: gradient norm handed to the optimizer {r.post_clip_norm:.3g}, "
                                     f"validation loss {r.val_loss:.4f}" for order, r in runs.items()))
    for name, runs in lab.scaling.items():
        print(f"{name}: validation loss " + ", ".join(f"{r.val_loss:.4f}" for r in runs))
    print(f"closest to the batch-{cfg.base_batch} run, per seed: {lab.scaling_closest}")
    d = lab.decay
    for name, shrink in d.shrink.items():
        print(f"{name} at weight decay {d.weight_decay:g}: fc1 kept {shrink[0]:.3f} of its norm where gradients are "
              f"large, {shrink[1]:.3f} where they are small; loss x{d.loss_scale:g} changes the weights by up to "
              f"{d.scale_change[name]:.2g}")
    write_results(out, "optim", lab, write_optim_table, plot_optim, t0)
    return lab


if __name__ == "__main__":
    run(main)
