"""same_numbers.py — a refactor changes no number: do the shipped configs still train to the same records, bit for bit?

    python day12_template/same_numbers.py --write    # at the commit before a change: this machine's reference
    python day12_template/same_numbers.py            # after it: every case again, compared with that reference

A case is a shipped config cut short (`CASES`), run in one process and under torchrun with DDP and with FSDP2 (2 gloo
ranks), every process in one thread (the thread count changes a loss's last bits). Each record of metrics.jsonl is
compared field by field as float.hex: losses, learning rates, gradient norms, validation and test figures; the timing
fields are left out. Floating-point results differ between CPUs and torch builds, so the reference file holds one
entry per machine (`machine()`); where the machine has none there is nothing to compare with, and the script says so.
Day 12's gates run the same comparison on the first `GATE_STEPS` steps of every case (check.py).
Exit codes: 0 equal (or written); 1 a record differs (the first differences printed); 2 no reference for this machine.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "template"  # what a learner copies: the package train_template, its scripts and configs
sys.path.insert(0, str(TEMPLATE))

import torch

from train_template import runlog

REFERENCE = HERE / "same_numbers.json"  # {machine: {case/strategy: records}}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
STRATEGIES = ("single", "ddp", "fsdp")
GATE_STEPS = 30  # the gates' cut: every case's first 30 steps (3 train records) in a few seconds each

# name: (shipped config, what cuts it short). max_steps stops a run without changing its schedule, so a run cut
# shorter still is a prefix of the reference; log_every=10 records the training figures every 10 steps.
CASES = {
    "synthetic_smoke": ("synthetic_smoke", []),
    "mnist_mlp": ("mnist_mlp", ["train.max_steps=300"]),
    "shakespeare_cpu": ("shakespeare_cpu", ["train.max_steps=300", "train.eval_every=100"]),
}
COMMON = ["train.log_every=10", "train.progress=off"]


def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def machine() -> str:
    """What the bits depend on besides the code: the torch build, the CPU model and the instruction set torch uses."""
    return f"torch {torch.__version__}, {cpu_model()}, {torch.backends.cpu.get_cpu_capability()}"


def case_settings(name: str, strategy: str, max_steps: int | None = None) -> tuple[Path, list[str]]:
    """The config file and the --set values of one case (cut at `max_steps` when given)."""
    config_name, cut = CASES[name]
    values = [*cut, *COMMON]
    if strategy != "single":
        values.append(f"train.strategy={strategy}")
    if max_steps is not None:
        values.append(f"train.max_steps={max_steps}")
    return TEMPLATE / "configs" / f"{config_name}.toml", values


def records(run_dir: Path) -> list[dict]:
    """Every train, val and test record of a run, timing fields left out, each float as float.hex."""
    return [{k: v.hex() if isinstance(v, float) else v for k, v in record.items()}
            for record in runlog.reproducible_records(run_dir)]


def differences(reference: list[dict], run: list[dict], up_to: int | None = None) -> list[str]:
    """Where `run` differs from `reference`. With `up_to`, `run` is the same case cut at that step: its train records
    must be the reference's first ones, and its val and test records equal the reference's at the same step (the extra
    evaluation and test at the cut have none)."""
    if up_to is None:
        if len(run) != len(reference):
            return [f"{len(run)} records, the reference has {len(reference)}"]
        return [f"expected {r}\n     got {g}" for r, g in zip(reference, run) if r != g]
    by_step = {(r["kind"], r["step"]): r for r in reference}
    train_steps = [r["step"] for r in run if r["kind"] == "train"]
    expected_steps = [r["step"] for r in reference if r["kind"] == "train" and r["step"] <= up_to]
    if train_steps != expected_steps:
        return [f"train records at steps {train_steps}, the reference's first ones are at {expected_steps}"]
    return [f"expected {by_step[r['kind'], r['step']]}\n     got {r}" for r in run
            if (r["kind"], r["step"]) in by_step and by_step[r["kind"], r["step"]] != r]


def train_case(name: str, strategy: str, out: Path, max_steps: int | None = None) -> Path:
    """Run one case with train.py (under torchrun for DDP and FSDP2) into `out`; returns `out`."""
    config_file, values = case_settings(name, strategy, max_steps)
    launcher = [sys.executable] if strategy == "single" else TORCHRUN
    command = [*launcher, str(TEMPLATE / "train.py"), "--config", str(config_file),
               "--set", *values, f"run.out_dir={out}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}  # a crashed rank prints its stack
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:  # every rank's error output: torchrun's summary alone does not say where a rank died
        raise SystemExit(f"{name} ({strategy}) failed with exit {done.returncode}:\n{done.stderr}")
    return out


def reference_for(this_machine: str) -> dict | None:
    """This machine's entry of the reference file: {case/strategy: records}; None if it has none."""
    if not REFERENCE.exists():
        return None
    return json.loads(REFERENCE.read_text()).get(this_machine)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="record this machine's reference instead of comparing")
    args = parser.parse_args(argv)
    this_machine = machine()
    reference = None if args.write else reference_for(this_machine)
    if not args.write and reference is None:
        print(f"no reference for this machine ({this_machine}) in {REFERENCE.name}: run --write at the commit "
              "before your change first", file=sys.stderr)
        return 2
    measured, failed = {}, False
    with tempfile.TemporaryDirectory() as tmp:
        for name in CASES:
            for strategy in STRATEGIES:
                key = f"{name}/{strategy}"
                measured[key] = records(train_case(name, strategy, Path(tmp) / key))
                if reference is not None:
                    found = differences(reference[key], measured[key])
                    failed |= bool(found)
                    print(f"{key}: {len(measured[key])} records, " + ("bitwise equal" if not found else
                                                                      "DIFFERENT\n  " + "\n  ".join(found[:3])))
    if args.write:
        entries = json.loads(REFERENCE.read_text()) if REFERENCE.exists() else {}
        entries[this_machine] = measured
        REFERENCE.write_text(json.dumps(entries, indent=1) + "\n")
        print(f"wrote the reference of {len(measured)} cases for {this_machine} to {REFERENCE}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
