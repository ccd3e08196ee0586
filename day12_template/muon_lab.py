"""muon_lab.py — Muon against AdamW on the template's GPT (shakespeare_cpu.toml: 4 layers x 4 heads x 128), measured
at equal steps and at equal training time, two seeds, each optimizer at a learning rate chosen on validation.

    python muon_lab.py --out results            # results/muon.json, muon.md and muon.png

Muon (torch.optim.Muon) updates a weight matrix with its momentum orthogonalised by a few Newton-Schulz iterations
(every singular value pushed towards 1), so that no direction of the update dominates. It is defined for matrices
only, so the blocks' 2-D weights go to Muon and everything else (the token embedding, tied to the output layer; the
position embedding; LayerNorm gains) stays with AdamW, at the learning rate AdamW's own sweep chose: nanochat's
split, simplified (nanochat also gives the embedding and the output layer AdamW rates of their own, and Muon
separate q, k and v matrices; here the fused c_attn matrix is orthogonalised whole). Both follow the template's
warmup + cosine schedule. Weight decay is equal per step: torch's Muon shrinks weights by lr * weight_decay, so its
decay is optim.weight_decay * (AdamW's lr / Muon's lr), and each matrix shrinks as much as AdamW would shrink it.

The protocol, on seed 0: sweep AdamW's learning rate, then Muon's (for the matrices; the rest at AdamW's choice),
each choice the lowest validation loss after STEPS steps (validation: VAL_WINDOWS windows spread evenly over the
held-out works' validation windows). Then both at their choices on seed 1 (another init and data order). Equal
time: the optimizer whose step costs more (median ms per step over all its runs) is run again, on both seeds, for as
many steps as the other's STEPS take (its own warmup + cosine over them). The head-to-head figures are test losses
(the test split's works, touched only by these final runs), so that the choice of learning rate on validation does
not flatter either side. Training time counts the steps only (evaluations left out).

torch's Muon runs its Newton-Schulz iterations in bf16, which GPUs and CPUs with native bf16 (AMX, AVX512-BF16)
multiply faster than fp32; an AVX2-only CPU multiplies bf16 some 25x slower than fp32, and a Muon step of this GPT
took seconds there. So where runlog's matmul throughput (the figure MFU divides by) is lower in bf16 than in fp32,
the lab runs `Fp32Muon`, the same update with the iteration in fp32 (`newton_schulz_dtype`; the results say which).
"""
import dataclasses
import functools
import statistics
import sys
from operator import itemgetter
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "template"  # what a learner copies: the package train_template, its scripts and configs
sys.path.insert(0, str(TEMPLATE))
sys.path.insert(0, str(HERE))  # lab_training.py, however this file is loaded

import torch

from lab_training import bf16_matmul_is_faster, mean_loss, spread, start, train_lm
from train_template import config, models, optimizers, runlog, tasks

CONFIG = TEMPLATE / "configs" / "shakespeare_cpu.toml"
STEPS, EVAL_EVERY, VAL_WINDOWS = 240, 40, 256
ADAMW_LRS = (1e-3, 2e-3, 3e-3, 4.5e-3)
MUON_LRS = (0.02, 0.05, 0.1)  # Muon's step is a unit-scale matrix: its learning rates sit 1-2 decades above AdamW's


def lab_optimizers(model, cfg: config.Config, name: str, lr: float, adamw_lr: float) -> list[torch.optim.Optimizer]:
    """AdamW as the template builds it (decay on matrices only), or Muon for the blocks' matrices beside AdamW for
    the rest (the template's optim.name=muon, with the Newton-Schulz precision this lab measures)."""
    if name == "adamw":
        return [optimizers.build(model, dataclasses.replace(cfg.optim, lr=lr))]
    matrices, rest = optimizers.muon_split(model)
    adamw = optimizers.adamw(rest, dataclasses.replace(cfg.optim, lr=adamw_lr))
    # adjust_lr_fn "original": a rectangular matrix's step scaled by sqrt(max(1, fan_out / fan_in)), Keller Jordan's
    decay = cfg.optim.weight_decay * adamw_lr / lr  # lr * decay per step, as AdamW's
    muon = muon_class()(matrices, lr=lr, weight_decay=decay, adjust_lr_fn="original")
    return [muon, adamw]


@functools.cache
def newton_schulz_dtype() -> torch.dtype:
    """bf16 (torch's choice) where this CPU multiplies bf16 matrices faster than fp32 ones, else fp32."""
    return torch.bfloat16 if bf16_matmul_is_faster() else torch.float32


def muon_class() -> type[torch.optim.Muon]:
    return torch.optim.Muon if newton_schulz_dtype() == torch.bfloat16 else optimizers.Fp32Muon


def run(cfg: config.Config, splits, name: str, lr: float, adamw_lr: float, seed: int, steps: int = STEPS) -> dict:
    """One training run: the validation curve against steps and training seconds."""
    model = models.build(cfg.model, splits.info, seed)
    result = train_lm(model, lab_optimizers(model, cfg, name, lr, adamw_lr), cfg, splits, seed, steps, EVAL_EVERY,
                      VAL_WINDOWS)
    return {"optimizer": name, "lr": lr, "adamw_lr": adamw_lr, "seed": seed, "steps": steps, **result, "model": model}


def tested(result: dict, splits, task) -> dict:
    """The run's figures with its final model's test loss (the model itself dropped)."""
    model = result.pop("model")
    return {**result, "test_loss": mean_loss(model, task, spread(splits.test, VAL_WINDOWS))}


def compare(cfg: config.Config, splits, log=print) -> dict:
    """The sweeps on seed 0, then both choices on seed 1, then the slower one at equal time on both seeds."""
    def timed(name, lr, adamw_lr, seed, steps=STEPS):
        result = run(cfg, splits, name, lr, adamw_lr, seed, steps)
        log(f"{name} lr {lr:g} seed {seed}, {steps} steps: val loss {result['val_loss']:.4f}, "
            f"{result['ms_per_step']:.1f} ms/step")
        return result

    sweep = [timed("adamw", lr, lr, 0) for lr in ADAMW_LRS]
    adamw_lr = min(sweep, key=itemgetter("val_loss"))["lr"]
    sweep += [timed("muon", lr, adamw_lr, 0) for lr in MUON_LRS]
    chosen = {name: min((r for r in sweep if r["optimizer"] == name), key=itemgetter("val_loss"))
              for name in ("adamw", "muon")}
    task = tasks.for_dataset(cfg.data.dataset, splits.info)
    runs = {(name, 0): tested(r, splits, task) for name, r in chosen.items()}
    for name, r in chosen.items():
        runs[name, 1] = tested(timed(name, r["lr"], r["adamw_lr"], 1), splits, task)
    for r in sweep:
        r.pop("model", None)  # the models of the choices not made are never tested
    every = [*sweep, runs["adamw", 1], runs["muon", 1]]
    costs = {name: statistics.median(r["ms_per_step"] for r in every if r["optimizer"] == name) for name in chosen}
    faster, slower = sorted(costs, key=costs.get)
    equal_steps = round(STEPS * costs[faster] / costs[slower])
    short = {seed: tested(timed(slower, chosen[slower]["lr"], chosen[slower]["adamw_lr"], seed, equal_steps), splits,
                          task)
             for seed in (0, 1)}
    seeds = []
    for seed in (0, 1):
        at_time = {faster: runs[faster, seed], slower: short[seed]}
        seeds.append({"seed": seed, **{f"{name}_at_steps": runs[name, seed]["test_loss"] for name in chosen},
                      **{f"{name}_at_time": r["test_loss"] for name, r in at_time.items()},
                      **{f"{name}_seconds_at_time": r["seconds"] for name, r in at_time.items()}})
    return {"sweep": sweep, "chosen": {name: {"lr": r["lr"], "adamw_lr": r["adamw_lr"]} for name, r in chosen.items()},
            "ms_per_step": costs, "slower": slower, "equal_time_steps": equal_steps,
            "runs": [runs[key] for key in sorted(runs)], "equal_time_runs": list(short.values()), "seeds": seeds}


def markdown(res: dict) -> str:
    chosen = res["chosen"]
    lines = [f"`{res['config']}`'s GPT ({res['params']:,} parameters), {STEPS} steps of batch {res['batch']}, "
             f"warmup + cosine; validation on {VAL_WINDOWS} fixed windows of the held-out works; {res['machine']}, "
             f"torch {res['torch']}, {res['threads']} threads.", "",
             "Learning rates on seed 0 (validation loss after the last step; the lowest is chosen):", "",
             "| optimizer | lr (Muon: its matrices; the rest at AdamW's choice) | val loss | ms per step |",
             "|---|---:|---:|---:|"]
    for r in res["sweep"]:
        mark = " (chosen)" if r["lr"] == chosen[r["optimizer"]]["lr"] else ""
        lines.append(f"| {r['optimizer']} | {r['lr']:g}{mark} | {r['val_loss']:.4f} | {r['ms_per_step']:.1f} |")
    ms = res["ms_per_step"]
    lines += ["", f"Both at their choices, on two seeds, scored on the test split ({VAL_WINDOWS} windows of works "
              f"neither training nor the choice saw). A step costs {ms['muon']:.1f} ms with Muon, {ms['adamw']:.1f} "
              f"with AdamW (medians over all runs): at equal time {res['slower']} trains {res['equal_time_steps']} "
              f"steps instead of {STEPS}.", "",
              f"| seed | AdamW, test loss after {STEPS} steps | Muon | AdamW at equal time | Muon at equal time "
              "| training seconds at equal time (AdamW / Muon) |", "|---:|---:|---:|---:|---:|---:|"]
    for s in res["seeds"]:
        lines.append(f"| {s['seed']} | {s['adamw_at_steps']:.4f} | {s['muon_at_steps']:.4f} | "
                     f"{s['adamw_at_time']:.4f} | {s['muon_at_time']:.4f} | "
                     f"{s['adamw_seconds_at_time']:.1f} / {s['muon_seconds_at_time']:.1f} |")
    return "\n".join(lines) + "\n"


COLORS, SEED_LINES = {"adamw": "C0", "muon": "C1"}, {0: "-", 1: "--"}


def plot(res: dict, path: Path) -> None:
    plt = runlog.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5), sharey=True)
    for r in res["runs"]:
        style = {"color": COLORS[r["optimizer"]], "linestyle": SEED_LINES[r["seed"]]}
        label = f"{r['optimizer']} lr {r['lr']:g}, seed {r['seed']}"
        for ax, key in zip(axes, ("step", "seconds")):
            ax.plot([p[key] for p in r["curve"]], [p["val_loss"] for p in r["curve"]], label=label, **style)
    axes[0].set(xlabel="optimizer step", ylabel="validation loss (nats per character)")
    axes[1].set(xlabel="training seconds")
    axes[0].legend(fontsize=8)
    fig.suptitle("Muon (blocks' matrices) + AdamW (the rest) vs AdamW")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> dict:
    args, cfg, splits = start(__doc__, "muon_lab", CONFIG, argv)
    res = {"config": CONFIG.name, "params": models.count_params(models.build(cfg.model, splits.info, device="meta")),
           "batch": cfg.train.batch_size, "machine": runlog.cpu_name(), "torch": torch.__version__,
           "threads": torch.get_num_threads(), "newton_schulz_dtype": str(newton_schulz_dtype()).removeprefix("torch."),
           **compare(cfg, splits)}
    runlog.write_lab_results(args.out, "muon", res, markdown(res), plot)
    return res


if __name__ == "__main__":
    main()
