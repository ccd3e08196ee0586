"""rnn_to_attention_lab.py — from an RNN to attention, measured: an LSTM against the template's GPT on the bundled
Shakespeare, what each costs as the context grows, and the sequence-to-sequence result attention was invented for.

    python rnn_to_attention_lab.py --out results      # results/rnn_to_attention.json, .md and .png

1. Language model. A character-level LSTM (nn.LSTM: an embedding, LSTM_LAYERS layers, the output layer tied to the
   embedding as the GPT's is) sized to the GPT of shakespeare_cpu.toml (4 layers x 128) within 1% of its parameters,
   both trained the labs' way (lab_training.py: the same windows, batch, AdamW, warmup + cosine, clipping). Each gets
   the learning rate of LRS that is best on validation after STEPS steps on seed 0; then both at their choices on
   seed 1, and the slower one again on both seeds for as many steps as the faster one's STEPS take (equal training
   time, its own schedule over them). Scored on the test split's windows, which no choice saw.
2. Cost against the context length T. One layer of width WIDTH, forward + backward on BATCH sequences of T tokens:
   causal self-attention through F.scaled_dot_product_attention, on its math path (the T x T score matrix is built
   and kept for backward) and on its fused path (FlashAttention's blocked, online softmax: no T x T matrix kept),
   against one nn.LSTM layer. Time per token and the most the step allocates (memory.allocation_peak, torch.profiler's
   allocation tracking), with the exponent of a power law fitted over the longest contexts: the score matrix makes
   attention's cost per token grow with T and its math path's memory with T^2; the LSTM's cost per token does not
   grow, but its T steps run one after another.
3. Sequence to sequence: reverse a sequence of digits. An LSTM encoder-decoder that passes only its final state to
   the decoder, against the same with additive (Bahdanau) attention over the encoder's outputs, trained on lengths
   MIN_LENGTH-MAX_LENGTH, then decoded greedily at each of LENGTHS: without attention the fixed-size state must hold
   the whole sequence, and accuracy falls as sequences grow; with attention every output looks back at its input.
"""
import contextlib
import dataclasses
import statistics
import sys
from operator import itemgetter
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "template"  # what a learner copies: the package train_template, its scripts and configs
sys.path.insert(0, str(TEMPLATE))
sys.path.insert(0, str(HERE))  # lab_training.py, however this file is loaded
sys.path.insert(0, str(HERE.parent))  # repo root: sprint

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from lab_training import mean_loss, spread, start, train_lm
from sprint.measure import median_seconds
from train_template import config, memory, models, optimizers, runlog, tasks

CONFIG = TEMPLATE / "configs" / "shakespeare_cpu.toml"

# 1. the language models
STEPS, EVAL_EVERY, VAL_WINDOWS = 400, 50, 256
LRS = (1e-3, 3e-3, 1e-2)
LSTM_LAYERS = 2

# 2. cost against context length
CONTEXTS = (64, 128, 256, 512, 1024)
WIDTH, HEADS, BATCH, REPEATS = 128, 4, 4, 5
FITTED = 3  # the power law is fitted over the longest FITTED contexts

# 3. reversing sequences
DIGITS, BOS = 10, 10  # tokens 0-9; 10 starts the decoder's output
MIN_LENGTH, MAX_LENGTH, LENGTHS = 4, 32, (4, 8, 16, 24, 32)
SEQ_HIDDEN, SEQ_STEPS, SEQ_BATCH, SEQ_LR, SEQ_TESTED = 64, 1500, 64, 3e-3, 500


# -- 1. an LSTM against the GPT on Shakespeare ---------------------------------------------------------------------
class CharLSTM(nn.Module):
    """Characters in, next-character logits out, as the GPT: an embedding, `layers` LSTM layers of width `hidden`,
    and the output layer tied to the embedding."""

    def __init__(self, vocab_size: int, hidden: int, layers: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden)
        self.lstm = nn.LSTM(hidden, hidden, layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab_size, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(x))
        return self.head(out)


def lstm_params(vocab_size: int, hidden: int, layers: int) -> int:
    """The embedding (shared with the output layer), then per layer four gates: input and recurrent weights, two
    biases."""
    return vocab_size * hidden + layers * 4 * (2 * hidden * hidden + 2 * hidden)


def matched_hidden(vocab_size: int, target: int, layers: int = LSTM_LAYERS) -> int:
    """The LSTM width whose parameter count is nearest `target`."""
    widths = range(8, 4096)
    gaps = [abs(lstm_params(vocab_size, width, layers) - target) for width in widths]
    return widths[gaps.index(min(gaps))]


def build(name: str, cfg: config.Config, info, seed: int) -> nn.Module:
    """The GPT of the config, or the LSTM of (about) its parameters, initialised from `seed`."""
    if name == "gpt":
        return models.build(cfg.model, info, seed)
    gpt_params = models.count_params(models.build(cfg.model, info, device="meta"))
    with torch.random.fork_rng(devices=[]):  # PyTorch's default LSTM init, from `seed`; the global RNG untouched
        torch.manual_seed(seed)
        return CharLSTM(info.vocab_size, matched_hidden(info.vocab_size, gpt_params), LSTM_LAYERS)


def run(name: str, cfg: config.Config, splits, lr: float, seed: int, steps: int = STEPS) -> dict:
    """One training run of `name` (gpt or lstm); its model is kept for the test."""
    model = build(name, cfg, splits.info, seed)
    optimizer = optimizers.build(model, dataclasses.replace(cfg.optim, lr=lr))
    result = train_lm(model, [optimizer], cfg, splits, seed, steps, EVAL_EVERY, VAL_WINDOWS)
    tokens = cfg.train.batch_size * splits.info.block_size
    return {"model_name": name, "lr": lr, "seed": seed, "steps": steps, **result,
            "tokens_per_s": 1000 * tokens / result["ms_per_step"], "model": model}


def language_models(cfg: config.Config, splits, log=print) -> dict:
    """The sweeps on seed 0, both choices on seed 1, the slower model at equal time on both seeds; test losses."""
    task = tasks.for_dataset(cfg.data.dataset, splits.info)
    test = spread(splits.test, VAL_WINDOWS)

    def timed(name, lr, seed, steps=STEPS):
        result = run(name, cfg, splits, lr, seed, steps)
        log(f"{name} lr {lr:g} seed {seed}, {steps} steps: val loss {result['val_loss']:.4f}, "
            f"{result['ms_per_step']:.1f} ms/step")
        return result

    def tested(result):
        model = result.pop("model")
        return {**result, "test_loss": mean_loss(model, task, test)}

    sweep = [timed(name, lr, 0) for name in ("gpt", "lstm") for lr in LRS]
    chosen = {name: min((r for r in sweep if r["model_name"] == name), key=itemgetter("val_loss"))["lr"]
              for name in ("gpt", "lstm")}
    runs = {(r["model_name"], 0): tested(r) for r in sweep if r["lr"] == chosen[r["model_name"]]}
    runs.update({(name, 1): tested(timed(name, lr, 1)) for name, lr in chosen.items()})
    for r in sweep:
        r.pop("model", None)
    cost = {name: statistics.median(r["ms_per_step"] for r in [*sweep, runs[name, 1]] if r["model_name"] == name)
            for name in chosen}
    faster, slower = sorted(cost, key=cost.get)
    equal_steps = round(STEPS * cost[faster] / cost[slower])
    at_time = {seed: tested(timed(slower, chosen[slower], seed, equal_steps)) for seed in (0, 1)}
    seeds = [{"seed": seed, **{f"{name}_at_steps": runs[name, seed]["test_loss"] for name in chosen},
              f"{faster}_at_time": runs[faster, seed]["test_loss"], f"{slower}_at_time": at_time[seed]["test_loss"]}
             for seed in (0, 1)]
    return {"sweep": sweep, "chosen": chosen, "ms_per_step": cost, "slower": slower, "equal_time_steps": equal_steps,
            "tokens_per_s": {name: 1000 * cfg.train.batch_size * splits.info.block_size / ms
                             for name, ms in cost.items()},
            "runs": [runs[key] for key in sorted(runs)], "equal_time_runs": list(at_time.values()), "seeds": seeds}


# -- 2. the cost of a longer context --------------------------------------------------------------------------------
class CausalSelfAttention(nn.Module):
    """One attention layer: queries, keys and values from one matrix, `heads` heads, each position attending to itself
    and the positions before it, the heads' outputs projected back to the width."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = (t.view(batch, length, self.heads, width // self.heads).transpose(1, 2)
                   for t in self.qkv(x).split(width, dim=2))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(batch, length, width))


LAYERS = {  # name: (the layer, the SDPA backend it runs under: None for the LSTM)
    "attention, math path": (lambda: CausalSelfAttention(WIDTH, HEADS), SDPBackend.MATH),
    "attention, fused path": (lambda: CausalSelfAttention(WIDTH, HEADS), SDPBackend.FLASH_ATTENTION),
    "LSTM": (lambda: nn.LSTM(WIDTH, WIDTH, batch_first=True), None),
}


def training_step(name: str, length: int, batch: int = BATCH):
    """A function running one forward and backward of layer `name` on `batch` sequences of `length` tokens."""
    make, backend = LAYERS[name]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        layer, x = make(), torch.randn(batch, length, WIDTH, requires_grad=True)

    def step():
        with sdpa_kernel(backend) if backend else contextlib.nullcontext():
            out = layer(x)
        (out[0] if isinstance(out, tuple) else out).square().mean().backward()

    return step


def step_cost(name: str, length: int, batch: int = BATCH, repeats: int = REPEATS) -> dict:
    """Microseconds per token (median of `repeats` steps after one warm-up) and the MiB one step allocates."""
    step = training_step(name, length, batch)
    seconds = median_seconds(step, repeat=repeats)
    return {"us_per_token": 1e6 * seconds / (batch * length),
            "peak_mib": memory.allocation_peak(step) / 2**20}


def exponent(lengths, values) -> float:
    """k of the power law values ~ length^k, fitted (least squares on logarithms) over the longest FITTED lengths."""
    return float(np.polyfit(np.log(lengths[-FITTED:]), np.log(values[-FITTED:]), 1)[0])


def context_costs(log=print) -> dict:
    """Each layer's cost at each context length, and the fitted exponents."""
    out = {}
    for name in LAYERS:
        rows = [{"length": length, **step_cost(name, length)} for length in CONTEXTS]
        for r in rows:
            log(f"{name}, T={r['length']}: {r['us_per_token']:.2f} us per token, {r['peak_mib']:.1f} MiB")
        out[name] = {"rows": rows,
                     "time_exponent": exponent(CONTEXTS, [r["us_per_token"] for r in rows]),
                     "memory_exponent": exponent(CONTEXTS, [r["peak_mib"] for r in rows])}
    return out


# -- 3. reversing a sequence, with and without attention -----------------------------------------------------------
class AdditiveAttention(nn.Module):
    """Bahdanau's additive score, v . tanh(W_q s + W_k h_i), of each encoder output h_i for each decoder state s,
    softmaxed over i; the context of each state is the outputs' weighted sum."""

    def __init__(self, hidden: int):
        super().__init__()
        self.w_q = nn.Linear(hidden, hidden, bias=False)
        self.w_k = nn.Linear(hidden, hidden, bias=False)
        self.v = nn.Linear(hidden, 1, bias=False)

    def forward(self, states: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
        """states (B, T_out, H), outputs (B, T_in, H) -> contexts (B, T_out, H)."""
        scores = self.v(torch.tanh(self.w_q(states).unsqueeze(2) + self.w_k(outputs).unsqueeze(1))).squeeze(-1)
        return scores.softmax(dim=-1) @ outputs


class Seq2Seq(nn.Module):
    """An LSTM encoder and an LSTM decoder that starts from the encoder's final state and reads the previous output
    digit. Without attention each output is read from the decoder's state alone; with it, from the state and its
    context over the encoder's outputs (the score is Bahdanau's; the context is read beside the state, after the
    decoder's step, as Luong's attention does, so that training runs the decoder over all positions at once)."""

    def __init__(self, hidden: int, attention: bool):
        super().__init__()
        self.embed = nn.Embedding(DIGITS + 1, hidden)
        self.encoder = nn.LSTM(hidden, hidden, batch_first=True)
        self.decoder = nn.LSTM(hidden, hidden, batch_first=True)
        self.attention = AdditiveAttention(hidden) if attention else None
        self.out = nn.Linear(2 * hidden if attention else hidden, DIGITS)

    def readout(self, states: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
        if self.attention is None:
            return self.out(states)
        return self.out(torch.cat([states, self.attention(states, outputs)], dim=-1))

    def forward(self, source: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, DIGITS) for each output position: fed the true previous digits (`target`, in training: every
        position in one pass) or its own greedy choices (`target` None: one position at a time)."""
        outputs, state = self.encoder(self.embed(source))
        start = torch.full_like(source[:, :1], BOS)
        if target is not None:
            states, _ = self.decoder(self.embed(torch.cat([start, target[:, :-1]], dim=1)), state)
            return self.readout(states, outputs)
        token, logits = start, []
        for _ in range(source.size(1)):
            states, state = self.decoder(self.embed(token), state)
            logits.append(self.readout(states, outputs))
            token = logits[-1].argmax(dim=-1)
        return torch.cat(logits, dim=1)


def reversal_batch(batch: int, length: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    source = torch.randint(DIGITS, (batch, length), generator=generator)
    return source, source.flip(1)


def train_reverser(attention: bool, seed: int, steps: int = SEQ_STEPS, hidden: int = SEQ_HIDDEN,
                   max_length: int = MAX_LENGTH) -> Seq2Seq:
    """Adam on batches of one length each, drawn from MIN_LENGTH-`max_length`, with teacher forcing."""
    with torch.random.fork_rng(devices=[]):  # PyTorch's default init, from `seed`; the global RNG untouched
        torch.manual_seed(seed)
        model = Seq2Seq(hidden, attention)
    optimizer = torch.optim.Adam(model.parameters(), lr=SEQ_LR)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        length = int(torch.randint(MIN_LENGTH, max_length + 1, (1,), generator=g))
        source, target = reversal_batch(SEQ_BATCH, length, g)
        loss = F.cross_entropy(model(source, target).flatten(0, 1), target.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    return model


@torch.no_grad()
def accuracy(model: Seq2Seq, length: int, count: int = SEQ_TESTED) -> float:
    """The share of digits right when `model` reverses `count` new sequences of `length` digits, decoding greedily."""
    source, target = reversal_batch(count, length, torch.Generator().manual_seed(10_000 + length))
    return (model(source).argmax(dim=2) == target).float().mean().item()


def reversal(seeds=(0, 1), log=print) -> dict:
    rows = []
    for seed in seeds:
        for attention in (False, True):
            model = train_reverser(attention, seed)
            row = {"seed": seed, "attention": attention,
                   "accuracy": {str(length): accuracy(model, length) for length in LENGTHS}}
            scores = ", ".join(f"T={length} {share:.3f}" for length, share in row["accuracy"].items())
            log(f"seed {seed}, attention {attention}: {scores}")
            rows.append(row)
    return {"rows": rows}


# -- the report ------------------------------------------------------------------------------------------------------
def markdown(res: dict) -> str:
    lm = res["language_models"]
    lines = [f"{res['machine']}, torch {res['torch']}, {res['threads']} threads.", "",
             f"**1. Language model.** `{res['config']}`'s GPT ({res['params']['gpt']:,} parameters) against a "
             f"{LSTM_LAYERS}-layer LSTM of width {res['lstm_hidden']} ({res['params']['lstm']:,} parameters), "
             f"{STEPS} steps of batch {res['batch']} x {res['block_size']} characters, each at its learning rate "
             f"chosen on validation (seed 0):", "",
             "| model | lr | val loss after the last step | ms per step |", "|---|---:|---:|---:|"]
    for r in lm["sweep"]:
        mark = " (chosen)" if r["lr"] == lm["chosen"][r["model_name"]] else ""
        lines.append(f"| {r['model_name']} | {r['lr']:g}{mark} | {r['val_loss']:.4f} | {r['ms_per_step']:.1f} |")
    ms, tps = lm["ms_per_step"], lm["tokens_per_s"]
    lines += ["", f"Both at their choices, two seeds, test loss ({VAL_WINDOWS} windows of the test works). A step "
              f"costs {ms['gpt']:.1f} ms for the GPT ({tps['gpt']:,.0f} tokens/s) and {ms['lstm']:.1f} ms for the "
              f"LSTM ({tps['lstm']:,.0f} tokens/s), medians over all runs: at equal time the {lm['slower']} trains "
              f"{lm['equal_time_steps']} steps instead of {STEPS}.", "",
              f"| seed | GPT after {STEPS} steps | LSTM after {STEPS} steps | GPT at equal time | LSTM at equal time |",
              "|---:|---:|---:|---:|---:|"]
    for s in lm["seeds"]:
        lines.append(f"| {s['seed']} | {s['gpt_at_steps']:.4f} | {s['lstm_at_steps']:.4f} | {s['gpt_at_time']:.4f} "
                     f"| {s['lstm_at_time']:.4f} |")
    costs = res["contexts"]
    names = list(costs)
    lines += ["", f"**2. Cost against the context length T.** One layer of width {WIDTH} ({HEADS} heads), forward + "
              f"backward on {BATCH} sequences; microseconds per token (median of {REPEATS} steps) and MiB the step "
              "allocates:", "",
              "| T | " + " | ".join(f"{n}: us/token" for n in names) + " | " + " | ".join(f"{n}: MiB" for n in names)
              + " |", "|---:" * (1 + 2 * len(names)) + "|"]
    for i, length in enumerate(CONTEXTS):
        rows = [costs[n]["rows"][i] for n in names]
        lines.append(f"| {length} | " + " | ".join(f"{r['us_per_token']:.2f}" for r in rows) + " | "
                     + " | ".join(f"{r['peak_mib']:.1f}" for r in rows) + " |")
    lines.append(f"| fitted exponent k (cost ~ T^k, T = {', '.join(map(str, CONTEXTS[-FITTED:]))}) | "
                 + " | ".join(f"{costs[n]['time_exponent']:.2f}" for n in names) + " | "
                 + " | ".join(f"{costs[n]['memory_exponent']:.2f}" for n in names) + " |")
    rows = res["reversal"]["rows"]
    lines += ["", f"**3. Reversing {MIN_LENGTH}-{MAX_LENGTH} digits.** LSTM encoder-decoder, width {SEQ_HIDDEN}, "
              f"{SEQ_STEPS} Adam steps of {SEQ_BATCH} sequences; share of digits right, greedy decoding, "
              f"{SEQ_TESTED} new sequences per length:", "",
              "| seed | attention | " + " | ".join(f"T={length}" for length in LENGTHS) + " |",
              "|---:|---|" + "---:|" * len(LENGTHS)]
    for r in rows:
        lines.append(f"| {r['seed']} | {'additive' if r['attention'] else 'none'} | "
                     + " | ".join(f"{v:.3f}" for v in r["accuracy"].values()) + " |")
    return "\n".join(lines) + "\n"


def plot(res: dict, path: Path) -> None:
    plt = runlog.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for r in res["language_models"]["runs"]:
        style = {"color": "C0" if r["model_name"] == "gpt" else "C1", "linestyle": "-" if r["seed"] == 0 else "--"}
        axes[0].plot([p["seconds"] for p in r["curve"]], [p["val_loss"] for p in r["curve"]],
                     label=f"{r['model_name']} lr {r['lr']:g}, seed {r['seed']}", **style)
    axes[0].set(xlabel="training seconds", ylabel="validation loss (nats per character)", title="language model")
    for name, cost in res["contexts"].items():
        axes[1].loglog(CONTEXTS, [r["peak_mib"] for r in cost["rows"]], marker="o",
                       label=f"{name} (k = {cost['memory_exponent']:.2f})")
    axes[1].set(xlabel="context length T", ylabel="MiB per forward + backward", title="memory against context")
    for r in res["reversal"]["rows"]:
        axes[2].plot(LENGTHS, list(r["accuracy"].values()), marker="o", color="C2" if r["attention"] else "C3",
                     linestyle="-" if r["seed"] == 0 else "--",
                     label=f"{'attention' if r['attention'] else 'no attention'}, seed {r['seed']}")
    axes[2].set(xlabel="sequence length", ylabel="digits right", title="reversing a sequence", ylim=(0, 1.02))
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> dict:
    args, cfg, splits = start(__doc__, "rnn_to_attention_lab", CONFIG, argv)
    gpt_params = models.count_params(models.build(cfg.model, splits.info, device="meta"))
    hidden = matched_hidden(splits.info.vocab_size, gpt_params)
    res = {"config": CONFIG.name, "machine": runlog.cpu_name(), "torch": torch.__version__,
           "threads": torch.get_num_threads(), "batch": cfg.train.batch_size, "block_size": splits.info.block_size,
           "lstm_hidden": hidden,
           "params": {"gpt": gpt_params, "lstm": lstm_params(splits.info.vocab_size, hidden, LSTM_LAYERS)},
           "language_models": language_models(cfg, splits), "contexts": context_costs(), "reversal": reversal()}
    runlog.write_lab_results(args.out, "rnn_to_attention", res, markdown(res), plot)
    return res


if __name__ == "__main__":
    main()
