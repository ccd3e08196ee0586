"""doctor.py — the symptom checklists and the data checklist as a decision path, run on a config's model and data.

    python doctor.py --config configs/mnist_mlp.toml --symptom nan         # NaN or inf loss
    python doctor.py --config configs/mnist_mlp.toml --symptom loss        # loss not decreasing
    python doctor.py --config configs/mnist_mlp.toml --symptom exploding   # exploding or vanishing gradients
    python doctor.py --config configs/mnist_mlp.toml --symptom gpu         # low GPU utilisation
    python doctor.py --config configs/shakespeare_cpu.toml --symptom data  # suspect data: text hygiene (or images)
    python doctor.py --config configs/mnist_mlp.toml --symptom all --set model.mlp.depth=4
    python doctor.py --config configs/mnist_mlp.toml --symptom nan --fault sqrt_neg@blocks.0.0   # watch it find a bug

The checks run cheapest first (troubleshoot/checklists.py) on a fresh model built from the config, or on the
weights of checkpoint.init_from / the checkpoint checkpoint.resume points to. Each finding says what was measured,
the checklist items it answers and, unless it is fine, the fix. --fault puts a known bug in (faults.py: breaks).
Files: <run.out_dir>/doctor/ (report.txt: what it printed; report.md: the same, its findings as a table; findings.json;
lr_range.png and .csv; text_data.md, the text checks as a table), or --out.
Exit codes: 0 no problem found; 3 problems found; 1 data or checkpoint error; 2 bad config or flag.
"""
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # as train.py: deterministic cuBLAS, set before CUDA

import json
import sys
from pathlib import Path

import torch

from . import checkpoint, config, data, models, runlog, train
from .troubleshoot.faults import Faults, parse_breaks
from .troubleshoot.case import Case
from .troubleshoot.checklists import CHECKS, ITEMS, SYMPTOMS, items_of, markdown_cell, plan
from .troubleshoot.checks import diagnose


def main(argv=None) -> int:
    parser = config.argument_parser(__doc__)
    parser.add_argument("--symptom", choices=[*SYMPTOMS, "all"], default="all", help="which checklist to run")
    parser.add_argument("--fault", action="append", default=[], metavar="KIND[@MODULE|=VALUE]",
                        help="put a known bug in first (faults.py), e.g. nan@blocks.0.1, leak=100")
    parser.add_argument("--out", help="folder for report.txt, findings.json and the LR plot (default: "
                                      "<run.out_dir>/doctor)")
    parser.add_argument("--checklists", action="store_true", help="print the checklists and exit")
    args = parser.parse_args(argv)
    if args.checklists:
        for symptom, (title, checks) in SYMPTOMS.items():
            print(f"{title} (--symptom {symptom}; checks: {', '.join(checks)})")
            print("\n".join(f"  {k:<7} {ITEMS[k]}" for k in items_of(symptom)))
        print("the checks, cheapest first:\n" + "\n".join(f"  {k:<13} {v}" for k, v in CHECKS.items()))
        return 0
    try:
        cfg = config.load(args.config, args.set)
        faults = Faults(breaks="+".join(args.fault))
        parse_breaks(faults.breaks)
        out = Path(args.out or Path(cfg.run.out_dir) / "doctor")
        case = Case(cfg, faults, out)
    except (config.ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (data.DataError, checkpoint.CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    lines = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    title = SYMPTOMS[args.symptom][0] if args.symptom != "all" else "every checklist"
    machine = torch.cuda.get_device_name(case.device) if case.device.type == "cuda" else runlog.cpu_name()
    say(f"doctor: {cfg.model.name} ({models.count_params(case.model()):,} parameters) on {cfg.data.dataset} ("
        + " / ".join(f"{len(s):,} {n}" for n, s in vars(case.splits).items() if n != "info" and s is not None)
        + f") | {case.device} ({machine}), torch {torch.__version__} | weights: "
        + f"{case.weights or f'fresh (seed {cfg.run.seed})'}"
        + (f" | faults: {faults.breaks}" if faults.breaks else ""))
    say(f"symptom: {title}; checks, cheapest first: {', '.join(plan(args.symptom))}\n")
    findings, seconds = diagnose(case, args.symptom, say)
    problems = sum(f.status == "PROBLEM" for f in findings)
    say(f"\nseconds per check: {', '.join(f'{k} {v:.2f}' for k, v in seconds.items())}")
    made = [f.name for check, pattern in (("lr_range", "lr_range.*"), ("data", "text_data.md")) if check in seconds
            for f in out.glob(pattern)]  # the files this run's checks wrote
    say(f"{problems} problem(s), {sum(f.status == 'note' for f in findings)} note(s) in {len(findings)} findings; "
        f"written: {out}/ ({', '.join(['report.txt', 'report.md', 'findings.json', *sorted(made)])})")
    out.mkdir(parents=True, exist_ok=True)
    record = {"symptom": args.symptom, "config": config.to_dict(cfg), "faults": faults.breaks, "machine": machine,
              "device": str(case.device), "seconds": seconds, "findings": [vars(f) for f in findings]}
    (out / "findings.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    (out / "report.txt").write_text("\n".join(lines) + "\n")
    write_markdown(lines, findings, out / "report.md")
    return 3 if problems else 0


def write_markdown(lines: list[str], findings: list, path: Path) -> None:
    """report.md: what report.txt says, its findings as one table (to paste into an issue or a pull request)."""
    table = ["| # | check | status | items | finding | fix |", "|---:|---|---|---|---|---|"]
    table += [f.markdown_row(i) for i, f in enumerate(findings, 1)]
    head = [markdown_cell(line.strip()) for line in lines[:2]]  # the config, model and machine; the symptom
    tail = [markdown_cell(line.strip()) for line in lines[-2:]]  # seconds per check; the counts
    path.write_text("\n\n".join([*head, "\n".join(table), *tail]) + "\n")


def cli() -> None:
    """`python doctor.py` at the template's root, and the `template-doctor` command of `pip install -e .`."""
    train.exit_with(main)
