"""modern_lab.py — which parts of a modern GPT shakespeare_modern.toml keeps, chosen on validation with the whole
recipe of shakespeare_cpu.toml (2,000 steps at its learning rate):

    python modern_lab.py --out results       # results/modern.json and modern.md

architecture_lab.py changes one part at a time for 300 steps at lr 3e-3. A config is a whole recipe, so the parts
that won there on every seed (rotary positions; QK-norm, at a high learning rate) are tried again here at the
recipe's own length and learning rate, with RMSNorm (mixed there), and so is Llama's whole block (RMSNorm, RoPE,
SwiGLU, an untied head: SwiGLU lost there at 300 steps), alone, with QK-norm, with its head tied, and with both. Every
candidate is the config plus `--set`s, trained by train.run exactly as `python train.py --config
configs/shakespeare_cpu.toml --set ...` trains it, on each seed; its figure is the validation loss after the last
step (the config's 1,024 windows of the held-out works). The choice: the lowest mean validation loss among the
candidates below the config on every seed (the config itself if none is). Every run ends, as train.py's do, with one
test evaluation of its best.pt; the choice never reads it, and the table shows it for the config and the chosen
candidate only. The runs go to runs/modern_lab/ (git-ignored) whatever --out says.
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "template"  # what a learner copies: the package train_template, its scripts and configs
sys.path.insert(0, str(TEMPLATE))

import torch

from lab_training import seed_cells, seed_header, seeds_command
from train_template import config, data, models, runlog, train

CONFIG = TEMPLATE / "configs" / "shakespeare_cpu.toml"
MODERN = TEMPLATE / "configs" / "shakespeare_modern.toml"
RUNS = HERE / "runs" / "modern_lab"
ROPE, QK_NORM, RMSNORM = "model.gpt.position=rope", "model.gpt.qk_norm=true", "model.gpt.norm=rmsnorm"
LLAMA = (RMSNORM, ROPE, "model.gpt.mlp=swiglu", "model.gpt.tie_embeddings=false")  # untied last
CANDIDATES = {
    "GPT-2 block (the config)": (),
    "RoPE": (ROPE,),
    "RoPE, QK-norm": (ROPE, QK_NORM),
    "RoPE, RMSNorm": (ROPE, RMSNORM),
    "RoPE, QK-norm, RMSNorm": (ROPE, QK_NORM, RMSNORM),
    "Llama's block (RMSNorm, RoPE, SwiGLU, untied)": LLAMA,
    "Llama's block, QK-norm": (*LLAMA, QK_NORM),
    "Llama's block, tied": LLAMA[:-1],
    "Llama's block, tied, QK-norm": (*LLAMA[:-1], QK_NORM),
}


def load(sets: tuple[str, ...], out: Path | None = None) -> config.Config:
    return config.load(str(CONFIG), [*sets, *([f"run.out_dir={out}"] if out else [])])


def train_candidate(sets: tuple[str, ...], seed: int, out: Path) -> dict:
    """The config with `sets`, trained from `seed` to the end of its schedule: its last validation loss, and the test
    loss of its best.pt."""
    cfg = load((*sets, f"run.seed={seed}", "train.progress=off"), out)
    result = train.run(cfg)
    val = [r for r in runlog.read_metrics(out) if r["kind"] == "val"][-1]
    return {"val_loss": val["val_loss"], "test_loss": result["test_loss"], "steps": result["step"]}


def choose(val_loss: dict[str, dict[str, float]]) -> str:
    """The candidate with the lowest mean validation loss among those below the config's on every seed; the config
    itself when none is."""
    base = next(iter(CANDIDATES))
    better = [name for name, losses in val_loss.items()
              if all(loss < val_loss[base][seed] for seed, loss in losses.items())]
    if not better:
        return base
    return min(better, key=lambda name: sum(val_loss[name].values()))


def modern_options() -> dict:
    """shakespeare_modern.toml's [model.gpt] values that differ from shakespeare_cpu.toml's."""
    modern, base = config.load(str(MODERN), []).model.gpt, load(()).model.gpt
    return {f"model.gpt.{k}": v for k, v in vars(modern).items() if v != getattr(base, k)}


def markdown(res: dict) -> str:
    (val_header, val_align), (test_header, test_align) = (seed_header(kind, res["seeds"]) for kind in ("val", "test"))
    lines = [f"{res['machine']}, torch {res['torch']}, {res['threads']} threads. `{CONFIG.name}`'s whole recipe "
             f"({res['steps']:,} steps, lr {res['lr']:g}) for each candidate; validation loss after the last step, "
             f"per seed (the config's {res['eval_windows']:,} windows of the held-out works). Chosen: the lowest "
             f"mean among the candidates below the config on every seed.", "",
             f"| candidate | `--set`s | parameters | {val_header} |", f"|---|---|---:|{val_align}"]
    for name, sets in CANDIDATES.items():
        losses = list(res["val_loss"][name].values())
        chosen = " (chosen)" if name == res["chosen"] else ""
        lines.append(f"| {name}{chosen} | {' '.join(f'`{s}`' for s in sets) or '(the config)'} | "
                     f"{res['params'][name]:,} | {seed_cells(losses)} |")
    lines += ["", "Test loss of each run's best.pt (the held-out test works), after the choice:", "",
              f"| run | {test_header} |", f"|---|{test_align}"]
    for name, losses in res["test_loss"].items():
        lines.append(f"| {name} | {seed_cells(list(losses.values()))} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    args = seeds_command(__doc__, RUNS, argv)
    val_loss, test_loss, steps = {}, {}, 0
    for i, (name, sets) in enumerate(CANDIDATES.items()):
        val_loss[name], test_loss[name] = {}, {}
        for seed in args.seeds:
            run = train_candidate(sets, seed, RUNS / f"candidate{i}-seed{seed}")
            val_loss[name][str(seed)], test_loss[name][str(seed)] = run["val_loss"], run["test_loss"]
            steps = run["steps"]
            print(f"{name}, seed {seed}: val loss {run['val_loss']:.4f} after {run['steps']} steps", flush=True)
    cfg = load(())
    info = data.build(cfg.data, cfg.run.seed).info
    res = {"config": CONFIG.name, "machine": runlog.cpu_name(), "torch": torch.__version__,
           "threads": torch.get_num_threads(), "steps": steps, "lr": cfg.optim.lr,
           "eval_windows": cfg.data.table.eval_windows, "seeds": args.seeds,
           "candidates": {name: list(sets) for name, sets in CANDIDATES.items()},
           "params": {name: models.count_params(models.build(load(sets).model, info, device="meta"))
                      for name, sets in CANDIDATES.items()},
           "val_loss": val_loss, "chosen": choose(val_loss)}
    res["test_loss"] = {name: test_loss[name] for name in (next(iter(CANDIDATES)), res["chosen"])}
    runlog.write_lab_results(args.out, "modern", res, markdown(res))
    return res


if __name__ == "__main__":
    main()
