"""architecture_lab.py — what each part of a modern GPT buys, measured: one change at a time from the GPT-2 block of
shakespeare_cpu.toml (4 layers x 4 heads x 128, windows of 64 characters), on several seeds, at equal steps and at
equal training time.

    python architecture_lab.py --out results                 # results/architecture.json, .md and .png
    python architecture_lab.py --out /tmp/arch --seeds 0 1 2 3

Each change is one or two `--set`s of train.py (`runs()`), so that any row can be rerun as a full training run.
Every run trains STEPS steps the labs' way (lab_training.py: the same windows, batch, AdamW, warmup + cosine,
clipping) at LR, the learning rate rnn_to_attention_lab's sweep chose for this GPT on validation, or where the row
says so at LOW_LR or HIGH_LR (ten times the config's: drills_lab measured the GPT-2 block training worse there). No
change gets a learning rate of its own, so a change that would want another one is judged at the reference's. The
figure is the validation loss (VAL_WINDOWS windows spread over the held-out works) after the last step, and each
change is set against its reference on the same seed (the same initial draws where the shapes agree, the same data
order):

- warmup: the GPT-2 block without its warmup;
- norm placement: post-norm (the 2017 Transformer) against pre-norm, with the warmup, without it, and at LOW_LR;
- RMSNorm against LayerNorm;
- rotary against learned positions, both against none at all (NoPE: a causal model still knows how many tokens came
  before each one), and the rotary model's loss on windows twice as long as it trained on (a learned position table
  has no row for position 64 or later: that model cannot run them at all);
- SwiGLU (8/3 x wide) and ReLU squared against GELU, at equal parameters;
- QK-norm and a logit soft-cap (SOFTCAP) at HIGH_LR, against the plain block there;
- an output layer of its own against one tied to the embedding;
- depth against width at equal parameters: DEPTHS layers, each at the width whose parameters are nearest the
  reference's.

Equal time: every architecture's milliseconds per step come from one interleaved benchmark (ROUNDS rounds, each
timing TIMED steps of every model in turn; the fastest step kept), so that a drift in the machine's speed hits all of
them alike. A change whose step costs more or less than its reference's by more than TOLERANCE trains again on every
seed, for as many steps as its reference's STEPS take (its own warmup and cosine over them); within TOLERANCE, equal
steps are equal time.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "template"  # what a learner copies: the package train_template, its scripts and configs
sys.path.insert(0, str(TEMPLATE))
sys.path.insert(0, str(HERE))  # lab_training.py, however this file is loaded

import torch
import torch.nn.functional as F

from lab_training import spread, train_lm
from train_template import config, data, models, optimizers, runlog, train

CONFIG = TEMPLATE / "configs" / "shakespeare_cpu.toml"
STEPS, EVAL_EVERY, VAL_WINDOWS = 300, 50, 256
LR, LOW_LR, HIGH_LR = 3e-3, 3e-4, 1e-2
SOFTCAP = 15.0  # modded-nanogpt's cap; Gemma 2's 30 hardly binds logits of a 65-character vocabulary
DEPTHS = (2, 8)
LONG = 128  # the rotary model's longer windows: twice the training context
ROUNDS, TIMED, TOLERANCE = 5, 10, 0.05

LOW, HIGH = f"optim.lr={LOW_LR}", f"optim.lr={HIGH_LR}"
POST = "model.gpt.norm_placement=post"
NO_WARMUP = "optim.warmup_ratio=0"
ROTARY = ("model.gpt.position=rope", f"model.gpt.block_size={LONG}")  # no parameters: room for the longer windows

# (change, reference, what the row asks); each name is a row of RUNS
COMPARISONS = [
    ("GPT-2 block, no warmup", "GPT-2 block", "the learning rate at full height from the first step"),
    ("post-norm", "GPT-2 block", "the norm after the residual addition"),
    ("post-norm, no warmup", "GPT-2 block, no warmup", "the same without warmup"),
    ("post-norm, lr 3e-4", "GPT-2 block, lr 3e-4", "the same at a tenth of the learning rate"),
    ("RMSNorm", "GPT-2 block", "RMSNorm for LayerNorm"),
    ("RoPE", "GPT-2 block", "rotary for learned positions"),
    ("no positions", "GPT-2 block", "the causal mask alone for learned positions"),
    ("RoPE", "no positions", "what the rotation adds"),
    ("SwiGLU", "GPT-2 block", "a gated MLP at equal parameters"),
    ("ReLU²", "GPT-2 block", "ReLU squared for GELU"),
    ("QK-norm, lr 1e-2", "GPT-2 block, lr 1e-2", "queries and keys normalised, at a high learning rate"),
    (f"soft-cap {SOFTCAP:g}, lr 1e-2", "GPT-2 block, lr 1e-2", "logits soft-capped, at a high learning rate"),
    ("untied", "GPT-2 block", "an output layer of its own"),
    *((f"{depth} layers", "GPT-2 block", "depth for width at equal parameters") for depth in DEPTHS),
]


def params(info, sets: tuple[str, ...] = ()) -> int:
    """The parameters of the config's model with `sets` (built on the meta device: shapes only)."""
    return models.count_params(models.build(load(sets).model, info, device="meta"))


def matched_width(info, n_layer: int) -> int:
    """The width (a multiple of the head count) at which `n_layer` blocks hold the parameters nearest the config's."""
    shape, target = load(()).model.table, params(info)
    widths = range(shape.n_head, 4 * shape.n_embd, shape.n_head)
    gaps = [abs(params(info, (f"model.gpt.n_layer={n_layer}", f"model.gpt.n_embd={width}")) - target)
            for width in widths]
    return widths[gaps.index(min(gaps))]


def runs(info) -> dict[str, tuple[str, ...]]:
    """Each run's `--set`s on top of the config (and the lab's learning rate)."""
    table = {
        "GPT-2 block": (),
        "GPT-2 block, no warmup": (NO_WARMUP,),
        "GPT-2 block, lr 3e-4": (LOW,),
        "GPT-2 block, lr 1e-2": (HIGH,),
        "post-norm": (POST,),
        "post-norm, no warmup": (POST, NO_WARMUP),
        "post-norm, lr 3e-4": (POST, LOW),
        "RMSNorm": ("model.gpt.norm=rmsnorm",),
        "RoPE": ROTARY,
        "no positions": ("model.gpt.position=none",),
        "SwiGLU": ("model.gpt.mlp=swiglu",),
        "ReLU²": ("model.gpt.mlp=relu2",),
        "QK-norm, lr 1e-2": ("model.gpt.qk_norm=true", HIGH),
        f"soft-cap {SOFTCAP:g}, lr 1e-2": (f"model.gpt.logit_softcap={SOFTCAP}", HIGH),
        "untied": ("model.gpt.tie_embeddings=false",),
    }
    for depth in DEPTHS:
        table[f"{depth} layers"] = (f"model.gpt.n_layer={depth}", f"model.gpt.n_embd={matched_width(info, depth)}")
    return table


def load(sets: tuple[str, ...]) -> config.Config:
    return config.load(str(CONFIG), [f"optim.lr={LR}", *sets])


def architecture(sets: tuple[str, ...]) -> tuple[str, ...]:
    """The `--set`s that shape the model (a learning rate or a warmup does not change what a step costs)."""
    return tuple(s for s in sets if s.startswith("model."))


# -- speed: one interleaved benchmark --------------------------------------------------------------------------------
def step_timer(cfg: config.Config, splits):
    """A function timing one training step (forward, backward, clipping, AdamW) of the config's model on a fixed
    batch, in seconds."""
    model = models.build(cfg.model, splits.info, cfg.run.seed)
    optimizer = optimizers.build(model, cfg.optim)
    x, y = splits.train.batch(0, torch.arange(cfg.train.batch_size))

    def timed() -> float:
        begin = time.perf_counter()
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - begin

    timed()  # warm-up: allocations, kernel choice, the optimizer's state
    return timed


def speeds(shapes: list[tuple[str, ...]], splits, log=print) -> dict[tuple[str, ...], float]:
    """Milliseconds per step of each architecture: the fastest of its ROUNDS x TIMED steps, timed in interleaved
    rounds (the median moved by 10% between two benchmarks here, the fastest by 3% at most)."""
    timers = {shape: step_timer(load(shape), splits) for shape in shapes}
    times = {shape: [] for shape in shapes}
    for _ in range(ROUNDS):
        for shape, timed in timers.items():
            times[shape] += [timed() for _ in range(TIMED)]
    out = {shape: 1000 * min(t) for shape, t in times.items()}
    for shape, ms in out.items():
        log(f"{' '.join(shape) or 'GPT-2 block'}: {ms:.1f} ms per step")
    return out


# -- training --------------------------------------------------------------------------------------------------------
def train_run(sets: tuple[str, ...], splits, seed: int, steps: int = STEPS,
              eval_every: int = EVAL_EVERY) -> tuple[dict, torch.nn.Module]:
    """One run of the config with `sets`, from `seed`: (train_lm's result, the trained model)."""
    cfg = load(sets)
    model = models.build(cfg.model, splits.info, seed)
    result = train_lm(model, [optimizers.build(model, cfg.optim)], cfg, splits, seed, steps, eval_every,
                      VAL_WINDOWS)
    return result, model


@torch.no_grad()
def loss_by_position(model, windows: tuple[torch.Tensor, torch.Tensor], split_at: int) -> tuple[float, float]:
    """Mean loss per token over `windows` at positions before `split_at` and from it on."""
    model.eval()
    x, y = windows
    nats = torch.cat([F.cross_entropy(model(xb).transpose(1, 2), yb, reduction="none")
                      for xb, yb in zip(x.split(64), y.split(64))])
    model.train()
    return nats[:, :split_at].mean().item(), nats[:, split_at:].mean().item()


def unigram_loss(splits) -> float:
    """The validation loss of a model that ignores its input and predicts every character with its frequency in the
    training split: the plateau a language model stalls on when it learns nothing from context."""
    counts = torch.bincount(torch.as_tensor(splits.train.tokens, dtype=torch.int64), minlength=splits.info.vocab_size)
    log_freq = (counts.double() + 1).log() - (counts.sum() + counts.numel()).double().log()  # add-one: no log(0)
    _, y = spread(splits.val, VAL_WINDOWS)
    return -log_freq[y].mean().item()


def longer_splits(seed: int):
    """The data cut into windows of LONG characters (the rotary model's config, which has room for them)."""
    return data.build(load((f"data.shakespeare.block_size={LONG}", *ROTARY)).data, seed)


def longer_context(model, long_splits, trained: int) -> dict:
    """The rotary model on windows of LONG characters: its loss at the positions it trained on and beyond them."""
    before, beyond = loss_by_position(model, spread(long_splits.val, VAL_WINDOWS), trained)
    return {"positions_trained": before, "positions_beyond": beyond}


def measure(table: dict, splits, long_splits, seeds, log=print) -> dict:
    """Every run on every seed; the rotary model also on the longer windows."""
    results = {}
    for name, sets in table.items():
        for seed in seeds:
            result, model = train_run(sets, splits, seed)
            if name == "RoPE":
                result["longer_context"] = longer_context(model, long_splits, splits.info.block_size)
            results[name, seed] = result
            log(f"{name}, seed {seed}: val loss {result['val_loss']:.4f} after {STEPS} steps")
    return results


def equal_time(table: dict, ms: dict, splits, seeds, log=print) -> dict:
    """{(change, reference): its steps in the reference's time, and its val loss after them on every seed} for each
    comparison whose change's step costs more or less than its reference's by over TOLERANCE."""
    out = {}
    for change, reference, _ in COMPARISONS:
        ratio = ms[architecture(table[change])] / ms[architecture(table[reference])]
        if abs(ratio - 1) <= TOLERANCE:
            continue
        steps = round(STEPS / ratio)
        losses = {seed: train_run(table[change], splits, seed, steps)[0]["val_loss"] for seed in seeds}
        scores = ", ".join(f"{v:.4f}" for v in losses.values())
        log(f"{change} at equal time with {reference} ({steps} steps): {scores}")
        out[change, reference] = {"steps": steps, "val_loss": losses}
    return out


def verdict(deltas: list[float]) -> str:
    if not any(deltas):
        return "equal on every seed"
    if all(d < 0 for d in deltas):
        return "better on every seed"
    if all(d > 0 for d in deltas):
        return "worse on every seed"
    return "mixed"


def compare(table: dict, results: dict, at_time: dict, ms: dict, counts: dict, seeds) -> list[dict]:
    """A row per comparison: the change's and the reference's val loss per seed, at equal steps and at equal time."""
    rows = []
    for change, reference, question in COMPARISONS:
        steps = {str(seed): results[change, seed]["val_loss"] - results[reference, seed]["val_loss"] for seed in seeds}
        timed = at_time.get((change, reference))
        by_time = steps if timed is None else {
            str(seed): timed["val_loss"][seed] - results[reference, seed]["val_loss"] for seed in seeds}
        rows.append({
            "change": change, "reference": reference, "question": question, "sets": list(table[change]),
            "params": counts[change], "reference_params": counts[reference],
            "ms_per_step": ms[architecture(table[change])], "reference_ms_per_step": ms[architecture(table[reference])],
            "val_loss": {str(seed): results[change, seed]["val_loss"] for seed in seeds},
            "reference_val_loss": {str(seed): results[reference, seed]["val_loss"] for seed in seeds},
            "delta_at_steps": steps, "verdict_at_steps": verdict(list(steps.values())),
            "equal_time_steps": STEPS if timed is None else timed["steps"],
            "delta_at_time": by_time, "verdict_at_time": verdict(list(by_time.values()))})
    return rows


# -- the report ------------------------------------------------------------------------------------------------------
def markdown(res: dict) -> str:
    seeds = res["seeds"]
    lines = [f"{res['machine']}, torch {res['torch']}, {res['threads']} threads. `{res['config']}`'s GPT "
             f"({res['params']['GPT-2 block']:,} parameters), {STEPS} steps of batch {res['batch']} x "
             f"{res['block_size']} characters at lr {LR:g} unless the row names another, seeds "
             f"{', '.join(map(str, seeds))}. Δ: the change's validation loss minus its reference's on the same seed "
             f"(negative: the change is better). Equal time: a change more than {TOLERANCE:.0%} faster or slower "
             f"per step than its reference trains the steps the reference's {STEPS} take. A model that ignores "
             f"its input and predicts each character's training frequency scores {res['unigram_loss']:.4f}.", "",
             "| change | against | parameters | tokens/s (reference's) | Δ at equal steps, per seed | "
             "at equal time: steps, Δ per seed |", "|---|---|---:|---:|---|---|"]
    tokens = res["batch"] * res["block_size"]
    for r in res["rows"]:
        at_steps = ", ".join(f"{d:+.4f}" for d in r["delta_at_steps"].values())
        at_time = "= equal steps" if r["equal_time_steps"] == STEPS else (
            f"{r['equal_time_steps']}: " + ", ".join(f"{d:+.4f}" for d in r["delta_at_time"].values()))
        speed = f"{1000 * tokens / r['ms_per_step']:,.0f} ({1000 * tokens / r['reference_ms_per_step']:,.0f})"
        lines.append(f"| {r['change']} | {r['reference']} | {r['params']:,} | {speed} | {at_steps} "
                     f"({r['verdict_at_steps']}) | {at_time} ({r['verdict_at_time']}) |")
    lines += ["", "Validation loss after the last step:", "",
              "| run | `--set`s | " + " | ".join(f"seed {s}" for s in seeds) + " |",
              "|---|---|" + "---:|" * len(seeds)]
    for name, sets in res["runs"].items():
        losses = " | ".join(f"{res['val_loss'][name][str(s)]:.4f}" for s in seeds)
        lines.append(f"| {name} | {' '.join(f'`{s}`' for s in sets) or '(the config)'} | {losses} |")
    rows = res["longer_context"]
    lines += ["", f"RoPE on windows of {LONG} characters, twice its training context (the learned table has no "
              f"row for position {res['block_size']}: that model cannot run them):", "",
              f"| seed | val loss, windows of {res['block_size']} | positions 0-{res['block_size'] - 1} of "
              f"{LONG} | positions {res['block_size']}-{LONG - 1} of {LONG} |", "|---:|---:|---:|---:|"]
    for seed, r in rows.items():
        lines.append(f"| {seed} | {r['val_loss']:.4f} | {r['positions_trained']:.4f} | {r['positions_beyond']:.4f} |")
    return "\n".join(lines) + "\n"


def plot(res: dict, path: Path) -> None:
    plt = runlog.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    rows = res["rows"]
    for i, r in enumerate(rows):
        deltas = list(r["delta_at_steps"].values())
        axes[0].barh(i, statistics.mean(deltas), color="C2" if max(deltas) < 0 else "C3" if min(deltas) > 0 else "C7")
        axes[0].plot(deltas, [i] * len(deltas), "k.", markersize=5)
    axes[0].axvline(0, color="k", linewidth=0.8)
    axes[0].set_yticks(range(len(rows)), [f"{r['change']} (vs {r['reference']})" for r in rows], fontsize=7)
    axes[0].invert_yaxis()
    axes[0].set(xlabel="Δ validation loss at equal steps (bar: mean; dots: seeds)", title="one change at a time")
    first = str(res["seeds"][0])
    for name in ("GPT-2 block", "post-norm", "GPT-2 block, lr 3e-4", "post-norm, lr 3e-4", "GPT-2 block, lr 1e-2",
                 "QK-norm, lr 1e-2"):
        curve = res["curves"][name][first]
        axes[1].plot([p["step"] for p in curve], [p["val_loss"] for p in curve], label=name)
    axes[1].axhline(res["unigram_loss"], color="k", linestyle=":", label="character frequencies alone")
    axes[1].set(xlabel="step", ylabel="validation loss", title=f"norm placement and learning rate, seed {first}")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "runs" / "architecture_lab")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args = parser.parse_args(argv)
    cfg = load(())
    train.seed_everything(cfg.run.seed, deterministic=False)
    splits = data.build(cfg.data, cfg.run.seed)
    long_splits = longer_splits(cfg.run.seed)
    table = runs(splits.info)
    counts = {name: params(splits.info, sets) for name, sets in table.items()}
    ms = speeds(sorted({architecture(sets) for sets in table.values()}), splits)
    results = measure(table, splits, long_splits, args.seeds)
    at_time = equal_time(table, ms, splits, args.seeds)
    res = {"config": CONFIG.name, "machine": runlog.cpu_name(), "torch": torch.__version__,
           "threads": torch.get_num_threads(), "batch": cfg.train.batch_size, "block_size": splits.info.block_size,
           "seeds": args.seeds, "unigram_loss": unigram_loss(splits),
           "runs": {name: list(sets) for name, sets in table.items()}, "params": counts,
           "val_loss": {name: {str(s): results[name, s]["val_loss"] for s in args.seeds} for name in table},
           "curves": {name: {str(s): results[name, s]["curve"] for s in args.seeds} for name in table},
           "rows": compare(table, results, at_time, ms, counts, args.seeds),
           "longer_context": {str(s): {"val_loss": results["RoPE", s]["val_loss"],
                                       **results["RoPE", s]["longer_context"]} for s in args.seeds}}
    runlog.write_lab_results(args.out, "architecture", res, markdown(res), plot)
    return res


if __name__ == "__main__":
    main()
