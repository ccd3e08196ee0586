"""compare_runs.py — several run folders side by side: what their configs change, and what each reached.

    python compare_runs.py runs/a runs/b runs/c                 # a Markdown table on stdout
    python compare_runs.py runs/lr-* --plot compare.png         # ... and the validation curves

One row per run: the config fields that differ between the runs (run.out_dir left out), the best validation loss
and its step, and the test figures (best.pt's). Runs whose configs differ only in `run.seed` form a group, and each
group gets one more row: the mean ± sample standard deviation of those figures over its seeds, which is the figure
to compare (one seed's difference is often noise). What it reads: each folder's config.toml and metrics.jsonl; a
run still going, or stopped before its test, shows "—" for the figures it has not reached. Fields that do not change
what is trained (logging, checkpointing, workers, profiling) and the tables of models and datasets a run does not
use are left out.
Exit codes: 0 done; 2 a folder without config.toml, metrics.jsonl or a validation record (one line naming it).
"""
import argparse
import statistics
import sys
from operator import itemgetter
from pathlib import Path

from . import config, runlog, train

# where a run lives, how it started, what it logs and saves: not what it trains
IGNORED = ("run.out_dir", "run.tracker", "checkpoint.", "train.progress", "train.log_every", "data.num_workers",
           "data.pin_memory", "profile.")


def read_run(run_dir: Path) -> dict:
    """A run folder's flattened config and its figures: best validation loss and step, test metrics."""
    if not (run_dir / "config.toml").is_file() or not (run_dir / "metrics.jsonl").is_file():
        raise config.ConfigError(f"{run_dir} is not a run folder of this template (no config.toml or metrics.jsonl)")
    loaded = config.load(str(run_dir / "config.toml"), [])
    cfg = config.flatten(config.to_dict(loaded))
    chosen = {f"{section}.{getattr(loaded, section).chosen}" for section in config.registries()}
    unused = [k for k in cfg if k.count(".") == 2 and k.rsplit(".", 1)[0] not in chosen]  # a table's field
    for key in unused:  # the tables of the models and datasets this run does not use
        del cfg[key]
    records = runlog.read_metrics(run_dir)
    val = [r for r in records if r["kind"] == "val"]
    if not val:
        raise config.ConfigError(f"{run_dir} has no validation record yet: nothing to compare")
    best = min(val, key=itemgetter("val_loss"))
    test = next((r for r in reversed(records) if r["kind"] == "test"), {})
    figures = {"best val loss": best["val_loss"], "best step": best["step"],
               **{k.replace("_", " "): v for k, v in test.items() if k.startswith("test_")}}
    return {"name": str(run_dir), "config": cfg, "figures": figures, "curve": [(r["step"], r["val_loss"]) for r in val]}


def differing(runs: list[dict]) -> list[str]:
    """The config fields whose values are not the same in every run."""
    keys = sorted(k for k in set().union(*(r["config"] for r in runs)) if not k.startswith(IGNORED))
    return [k for k in keys if len({repr(r["config"].get(k)) for r in runs}) > 1]


def groups(runs: list[dict], fields: list[str]) -> dict[tuple, list[dict]]:
    """Runs keyed by their values of `fields` other than run.seed."""
    out: dict[tuple, list[dict]] = {}
    for r in runs:
        out.setdefault(tuple(repr(r["config"].get(f)) for f in fields if f != "run.seed"), []).append(r)
    return out


def number(value) -> str:
    if value is None:
        return "—"
    return f"{value:,}" if isinstance(value, int) else f"{value:.4g}"


def mean_std(values: list) -> str:
    """The mean ± sample standard deviation, or the one value there is ("n=1"), or "—"."""
    if len(values) < 2:
        return f"{number(values[0])} (n=1)" if values else "—"
    return f"{number(statistics.mean(values))} ± {statistics.stdev(values):.2g}"


def table(runs: list[dict]) -> str:
    fields = differing(runs)
    figures = list(dict.fromkeys(name for r in runs for name in r["figures"]))
    lines = ["| run | " + " | ".join([*fields, *figures]) + " |",
             "|---|" + "---|" * len(fields) + "---:|" * len(figures)]
    for members in groups(runs, fields).values():
        for r in members:
            cells = [str(r["config"].get(f, "—")) for f in fields] + [number(r["figures"].get(n)) for n in figures]
            lines.append(f"| {r['name']} | " + " | ".join(cells) + " |")
        if len(members) > 1:
            cells = [str(members[0]["config"].get(f, "—")) for f in fields]
            if "run.seed" in fields:
                cells[fields.index("run.seed")] = f"{len(members)} seeds"
            cells += [mean_std([r["figures"][n] for r in members if n in r["figures"]]) for n in figures]
            lines.append("| **mean ± std** | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(runs: list[dict], path: Path) -> None:
    plt = runlog.pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for r in runs:
        steps, losses = zip(*r["curve"])
        ax.plot(steps, losses, marker="o", label=r["name"])
    ax.set(xlabel="optimizer step", ylabel="validation loss", title="Validation loss per run")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="\n".join(__doc__.splitlines()[2:]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (run.out_dir of each)")
    parser.add_argument("--plot", type=Path, help="also draw the validation curves into this PNG")
    args = parser.parse_args(argv)
    try:
        runs = [read_run(path) for path in args.runs]
    except config.ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(table(runs), end="")
    if args.plot:
        plot(runs, args.plot)
        print(f"wrote {args.plot}")
    return 0


def cli() -> None:
    """`python compare_runs.py` at the template's root runs this."""
    train.exit_with(main)
