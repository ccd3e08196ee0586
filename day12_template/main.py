"""Day 12 — the reusable training template, shown on every config it ships.

What you keep is the template/ folder (its README.md says how to adapt it). This demo runs its loop on the configs in
template/configs/: MNIST + MLP and the GPT on Shakespeare to the end (G0: > 98% test accuracy; then a sample of what
the GPT writes), the other image configs capped at --max-steps optimizer steps, an image folder made of MNIST digits
for configs/imagefolder.toml; the GPU and GPT-2 configs are listed, not run. Not here: tokens_cpu.toml (it trains on
your token files) and shakespeare_modern.toml (modern_lab.py trains it, beside shakespeare_cpu.toml, on two seeds).
Then one table: what each config reached, how fast, where. Last, the troubleshooting doctor (doctor.py) on
configs/mnist_mlp.toml: clean, then with one known bug per symptom.

Run:    python day12_template/main.py                 (~2 min on a 2-core CPU; runs in day12_template/runs/demo)
        python day12_template/main.py --quick         (every config capped at 20 steps: seconds each; no doctor)
        python day12_template/main.py --out day12_template/results      (refresh the committed summary)
        python day12_template/main.py --make-digits runs/digits         (only write an example image folder)
Gates:  python day12_template/check.py
"""
import argparse
import json
import shutil
import sys
import time
from pathlib import Path


HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "template"  # what a learner copies: the package train_template, its scripts and configs
sys.path.insert(0, str(TEMPLATE))

import torch

from train_template import config, data, doctor, memory, models, sample, text, train
from train_template.troubleshoot.checklists import markdown_cell

CONFIGS = ["synthetic_smoke", "mnist_mlp", "mnist_resnet", "fashion_mnist_resnet", "imagefolder", "shakespeare_cpu",
           "shakespeare_gpu", "shakespeare_25m", "gpt2_124m"]
FULL = {"synthetic_smoke", "mnist_mlp", "shakespeare_cpu"}  # trained to the end; the others are capped or not run
NOT_ON_CPU = {"shakespeare_gpu": "a GPU config (nanoGPT's baby GPT, context 256): seconds per step on a CPU",
              "shakespeare_25m": "a GPU config (8 x 8 x 512, context 256): seconds per step on a CPU",
              "gpt2_124m": "needs your token files (data.root) and a GPU"}
DOCTOR = {"clean": ("all", ""), "nan_sqrt_neg": ("nan", "sqrt_neg@blocks.0.0"),  # run -> (symptom, fault put in)
          "loss_detach": ("loss", "detach@blocks.0"), "exploding_head": ("exploding", "explode@head"),
          "gpu_slow_data": ("gpu", "slow_data=0.02")}


def make_digits(root: Path, per_class: dict | None = None, mnist_root: str = "") -> Path:
    """An image folder in the layout train.py expects (root/<split>/<class>/<n>.png), cut from MNIST."""
    from PIL import Image

    per_class = per_class or {"train": 100, "test": 20}
    x, y, x_test, y_test = data.load_idx("mnist", mnist_root)
    for split, n in per_class.items():
        images, labels = (x, y) if split == "train" else (x_test, y_test)
        for digit in range(10):
            folder = root / split / str(digit)
            folder.mkdir(parents=True, exist_ok=True)
            for j, i in enumerate((labels == digit).nonzero().flatten()[:n].tolist()):
                Image.fromarray(images[i, 0].numpy()).save(folder / f"{j:05d}.png")
    return root


def run_config(name: str, runs: Path, max_steps: int, digits: Path, mnist_root: str = "") -> dict:
    """Train one shipped config (capped unless it is a FULL one); a missing dataset becomes a note, not a crash."""
    path = str(TEMPLATE / "configs" / f"{name}.toml")
    overrides = [o for o in (f"run.out_dir={runs / name}", f"data.root={digits}" if name == "imagefolder" else None,
                             f"train.max_steps={max_steps}" if max_steps else None) if o]
    cfg = config.load(path, overrides)
    if mnist_root and cfg.data.dataset == "mnist":  # --data-root
        cfg = config.load(path, overrides + [f"data.root={mnist_root}"])
    shutil.rmtree(runs / name, ignore_errors=True)
    row = {"config": name, "dataset": cfg.data.dataset, "model": cfg.model.name, "capped_at": max_steps or None}
    if name in NOT_ON_CPU and not torch.cuda.is_available():
        return {**row, **cuda_estimate(cfg), "skipped": NOT_ON_CPU[name]}
    t0 = time.perf_counter()
    try:
        result = train.run(cfg)
    except data.DataError as exc:
        return {**row, "skipped": str(exc)}
    records = [json.loads(line) for line in (runs / name / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in records if r["kind"] == "val"][-1]
    splits = data.build(cfg.data, cfg.run.seed)
    row["capped_at"] = max_steps if result["stopped_by"] == "max_steps" else None
    row.update({k: v for k, v in val.items() if k.startswith("val_")})
    row.update({k: v for k, v in result.items() if k.startswith("test_")})
    return {**row, "params": models.count_params(models.build(cfg.model, splits.info, device="meta")), "steps": result["step"],
            "epochs_run": val["epoch"] + 1, "wall_s": time.perf_counter() - t0, "test_acc": result.get("test_acc"),
            "samples_per_s": max((r["samples_per_s"] for r in records if r["kind"] == "train"), default=None)}


def cuda_estimate(cfg: config.Config) -> dict:
    """What `python memory.py --config ...` says of a config this demo does not train on a CPU: its parameters and
    its peak on a CUDA card at the config's micro-batch (fake tensors: no data trained, no memory taken)."""
    estimate = memory.estimate(cfg, memory.info_of(cfg), device="cuda")
    return {"params": estimate["params"], "cuda_peak_gib": estimate["peak"] / 2**30,
            "micro_batch": estimate["micro_batch"]}


def headline(row: dict, split: str) -> str:
    """A split's figure for the table: accuracy for a classifier, nats and bits per byte for a language model."""
    if row.get(f"{split}_acc") is not None:
        return f"{100 * row[f'{split}_acc']:.2f}%"
    if row.get(f"{split}_loss") is not None:
        return f"{row[f'{split}_loss']:.3f} nats ({row[f'{split}_bpb']:.3f} bits/byte)"
    return "—"


def write_sample(runs: Path, name: str = "shakespeare_cpu", tokens: int = 300) -> str:
    """What the GPT writes after `ROMEO:` (sample.py's defaults: temperature 0.8, top-k 50, seed 0)."""
    model, cfg, _ = sample.load_model(runs / name / "best.pt")
    tokenizer = text.tokenizer(cfg.data.dataset, cfg.data.root)
    written, seconds = sample.generate(model, tokenizer, "ROMEO:", tokens, 0.8, 50, 0)
    return (f"`python sample.py --run runs/{name} --prompt \"ROMEO:\" --tokens {tokens}` ({tokens / seconds:,.0f} "
            f"tokens/s with the KV cache):\n\n```text\n{written}\n```")


def skipped_params(row: dict) -> str:
    if "params" in row:
        return f"{row['params']:,}"
    return "—"


def skipped_note(row: dict) -> str:
    """Why a config was not trained, and for a GPU config memory.py's peak on a CUDA card."""
    if "cuda_peak_gib" in row:
        return (f"{row['skipped']}; `memory.py`: {row['cuda_peak_gib']:.2f} GiB at its micro-batch of "
                f"{row['micro_batch']} on a CUDA card")
    return row["skipped"]


def table(rows: list[dict]) -> str:
    lines = ["| config | dataset | model | parameters | optimizer steps | val | test (best.pt) | wall s |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['config']} | {r['dataset']} | {r['model']} | {skipped_params(r)} | — | — | "
                         f"skipped: {skipped_note(r)} | — |")
            continue
        epochs = f"{r['epochs_run']} epoch{'s' if r['epochs_run'] > 1 else ''}"
        steps = f"{r['steps']} ({epochs})"
        if r["capped_at"]:
            steps = f"{r['steps']} (capped)"
        elif r["dataset"] in ("shakespeare", "tokens"):
            steps = f"{r['steps']} (the whole schedule)"
        lines.append(f"| {r['config']} | {r['dataset']} | {r['model']} | {r['params']:,} | {steps} | "
                     f"{headline(r, 'val')} | {headline(r, 'test')} | {r['wall_s']:.1f} |")
    return "\n".join(lines)


def doctor_demo(out: Path) -> str:
    """doctor.py on configs/mnist_mlp.toml, clean (every checklist) and with one known bug per symptom: a table of
    what each run found (the full reports: out/doctor/<run>/report.txt)."""
    lines = ["| doctor run (report) | flags | exit | problems found |", "|---|---|---:|---|"]
    for name, (symptom, fault) in DOCTOR.items():
        flags = ["--symptom", symptom] + (["--fault", fault] if fault else [])
        print(f"\n== doctor.py {' '.join(flags)}", flush=True)
        code = doctor.main(["--config", str(TEMPLATE / "configs/mnist_mlp.toml"), *flags, "--out", str(out / name)])
        found = json.loads((out / name / "findings.json").read_text())["findings"]
        problems = "<br>".join(markdown_cell(f"{f['check']}: {f['text']}") for f in found
                               if f["status"] == "PROBLEM") or "none"
        lines.append(f"| [{name}](doctor/{name}/report.txt) | `{' '.join(flags)}` | {code} | {problems} |")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--runs", type=Path, default=HERE / "runs" / "demo", help="where the runs go (wiped first)")
    parser.add_argument("--out", type=Path, default=None, help="where summary.md/json go (default: --runs)")
    parser.add_argument("--max-steps", type=int, default=150, help="cap for the configs not trained to the end")
    parser.add_argument("--quick", action="store_true", help="cap every config at 20 steps")
    parser.add_argument("--make-digits", type=Path, metavar="DIR", help="only write an example image folder")
    parser.add_argument("--data-root", default="", metavar="DIR", help="folder holding MNIST's four *-ubyte[.gz] "
                        "files (or torchvision's MNIST/raw): data.root of the mnist configs and the digits' source "
                        "(default: the repo's bundle)")
    args = parser.parse_args(argv)
    if args.max_steps < 1:
        parser.error(f"--max-steps must be >= 1, got {args.max_steps}")
    try:
        digits = make_digits(args.make_digits or args.runs / "digits", mnist_root=args.data_root)
    except data.DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
    if args.make_digits:
        print(f"wrote {digits}/{{train,test}}/<digit>/*.png")
        return []
    out = args.out or args.runs
    rows = []
    for name in CONFIGS:
        cap = 20 if args.quick else (0 if name in FULL else args.max_steps)
        print(f"\n== {name}" + (f" (capped at {cap} steps)" if cap else ""), flush=True)
        rows.append(run_config(name, args.runs, cap, digits, args.data_root))
    report = table(rows)
    written = None
    if not args.quick and (args.runs / "shakespeare_cpu" / "best.pt").exists():
        written = write_sample(args.runs)
    machine = train.runlog.cpu_name() if not torch.cuda.is_available() else torch.cuda.get_device_name()
    note = (f"\nMeasured by `python day12_template/main.py{' --quick' if args.quick else ''}` on {machine}, torch "
            f"{torch.__version__}, {torch.get_num_threads()} thread(s); all configs in one process, one after "
            f"another.\n")
    if not args.quick:
        report += "\n\n" + doctor_demo(out / "doctor")
    print("\n" + report + note)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(report + "\n" + note)
    (out / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    if written:
        print("\n" + written)
        (out / "sample.md").write_text(written + "\n")
    print(f"wrote {out / 'summary.md'}, summary.json" + (" and sample.md" if written else ""))
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
