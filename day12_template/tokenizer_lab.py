"""tokenizer_lab.py — characters against byte-level BPEs of two vocabulary sizes: the same GPT on the same text,
compared in bits per byte:

    python tokenizer_lab.py --out results      # results/tokenizers.json and tokenizers.md

The bundled corpus, split as the shakespeare dataset splits it (whole works held out), becomes token files with
prepare.py's own functions: characters (one token per distinct character), and BPEs of BPE_SIZES tokens learned from
the training works alone. Each trains tokens_cpu.toml's GPT (shakespeare_cpu.toml's shape and recipe, dropout 0 as
there) for the same STEPS steps of 12 windows of 64 tokens: the same work per step but for the embedding and the
output layer, which grow with the vocabulary (FLOPs per token in the table). A BPE window holds more text, so the BPE
runs see more of the corpus in the same steps. A loss per token cannot be compared across vocabularies, bits per byte
can: the validation loss summed over every window of the held-out works (val only; test is not written), divided by
their UTF-8 bytes and by ln 2. The token folders and runs go to runs/tokenizer_lab/ (git-ignored) whatever --out says.
"""
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "template"  # what a learner copies: the package train_template, its scripts and configs
sys.path.insert(0, str(TEMPLATE))

import numpy as np
import torch

from lab_training import seed_cells, seed_header, seeds_command
from train_template import config, data, models, prepare, runlog, text, train

CONFIG = TEMPLATE / "configs" / "tokens_cpu.toml"
RUNS = HERE / "runs" / "tokenizer_lab"
BPE_SIZES = (512, 2048)
STEPS = 2000


def token_folders(root: Path) -> dict[str, Path]:
    """The bundled corpus's train and val works as token files: characters, and a BPE of each of BPE_SIZES."""
    works = text.split_works(text.BUNDLE)
    raw = {split: b"".join(t + text.SEPARATOR for t in works[split].values()) for split in ("train", "val")}
    folders = {"characters": root / "characters"}
    prepare.write_folder(folders["characters"], *prepare.as_characters(raw), {})
    for size in BPE_SIZES:
        bpe = prepare.train_bpe(raw["train"].decode("utf-8"), size)
        folders[f"BPE {size}"] = root / f"bpe{size}"
        prepare.write_folder(folders[f"BPE {size}"], *prepare.as_bpe(bpe, raw), {prepare.BPE_FILE: bpe.to_str()})
    return folders


def load(folder: Path, seed: int, out: Path | None = None) -> config.Config:
    return config.load(str(CONFIG), [f"data.root={folder}", "data.tokens.eval_windows=0", "model.gpt.dropout=0.0",
                                     f"train.steps={STEPS}", f"train.eval_every={STEPS // 2}", f"run.seed={seed}",
                                     "train.progress=off", *([f"run.out_dir={out}"] if out else [])])


def describe(folder: Path) -> dict:
    """The tokenization's vocabulary, bytes per token of the training text, and the GPT's size on it."""
    cfg = load(folder, 0)
    splits = data.build(cfg.data, 0)
    info = splits.info
    train_ids = torch.from_numpy(np.asarray(splits.train.tokens, dtype=np.int64))
    model = models.build(cfg.model, info, device="meta")
    params = models.count_params(model)
    return {"vocab_size": info.vocab_size, "train_tokens": len(train_ids),
            "bytes_per_token": info.bytes_per_token[train_ids].sum().item() / len(train_ids),
            "params": params, "embedding_share": model.wte.weight.numel() / params,
            "flops_per_token": model.flops_per_token()}


def train_on(folder: Path, seed: int, out: Path) -> dict:
    """STEPS steps on the folder's tokens: the last validation record's bits per byte, and the training speed."""
    result = train.run(load(folder, seed, out))
    records = runlog.read_metrics(out)
    val = [r for r in records if r["kind"] == "val"][-1]
    speed = statistics.median(r["tokens_per_s"] for r in records if r["kind"] == "train")
    return {"val_bpb": val["val_bpb"], "val_loss": val["val_loss"], "steps": result["step"], "tokens_per_s": speed}


def markdown(res: dict) -> str:
    seeds = res["seeds"]
    header, align = seed_header("val bits/byte", seeds)
    lines = [f"{res['machine']}, torch {res['torch']}, {res['threads']} threads. `{CONFIG.name}`'s GPT, dropout 0, "
             f"{res['steps']:,} steps of {res['batch']} windows of {res['block_size']} tokens; the BPEs learned from "
             f"the training works alone. Bits per byte: the validation loss over every window of the held-out works "
             f"/ their bytes / ln 2 (lower is better), after the last step.", "",
             "| tokens | vocabulary | bytes per token | parameters | embedding's share | FLOPs per token | "
             f"tokens/s | text seen (MB) | {header} |", f"|---|---:|---:|---:|---:|---:|---:|---:|{align}"]
    for name, row in res["rows"].items():
        bpb = [row["val_bpb"][str(s)] for s in seeds]
        seen = res["steps"] * res["batch"] * res["block_size"] * row["bytes_per_token"] / 1e6
        lines.append(f"| {name} | {row['vocab_size']:,} | {row['bytes_per_token']:.2f} | {row['params']:,} | "
                     f"{row['embedding_share']:.1%} | {row['flops_per_token'] / 1e6:.2f} M | "
                     f"{row['tokens_per_s']:,.0f} | {seen:.1f} | {seed_cells(bpb)} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    args = seeds_command(__doc__, RUNS, argv)
    folders = token_folders(RUNS / "data")
    rows = {}
    for name, folder in folders.items():
        rows[name] = {**describe(folder), "val_bpb": {}, "val_loss": {}}
        speeds = []
        for seed in args.seeds:
            run = train_on(folder, seed, RUNS / f"{folder.name}-seed{seed}")
            rows[name]["val_bpb"][str(seed)], rows[name]["val_loss"][str(seed)] = run["val_bpb"], run["val_loss"]
            speeds.append(run["tokens_per_s"])
            print(f"{name}, seed {seed}: val {run['val_bpb']:.4f} bits per byte after {run['steps']} steps",
                  flush=True)
        rows[name]["tokens_per_s"] = statistics.median(speeds)
    cfg = load(folders["characters"], 0)
    res = {"config": CONFIG.name, "machine": runlog.cpu_name(), "torch": torch.__version__,
           "threads": torch.get_num_threads(), "steps": STEPS, "batch": cfg.train.batch_size,
           "block_size": cfg.data.table.block_size, "seeds": args.seeds, "rows": rows}
    runlog.write_lab_results(args.out, "tokenizers", res, markdown(res))
    return res


if __name__ == "__main__":
    main()
