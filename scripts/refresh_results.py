"""Re-make every committed `dayNN_*/results/` file from its command at the default settings, then the README
figures that quote them (`scripts/report.py --readme`).

Runs alone only: the figures include timings, so run it on a quiet machine (nothing else busy) and commit what changed
together with the READMEs. Everyday runs write to the git-ignored `runs/` instead.

Run:  python scripts/refresh_results.py                 (every day; each command prints its own time)
      python scripts/refresh_results.py --only 4 9      (some days)
      python scripts/refresh_results.py --list          (the commands, run nothing)
"""
import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AVX2 = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}  # a CPU without native bf16/fp16 (most laptops)

# day -> the commands (script and flags, extra environment) that write its results folder, in order.
STEPS: dict[int, list[tuple[str, list[str], dict]]] = {
    1: [("day01_env_and_tensors/main.py", [], {})],
    2: [("day02_autograd/main.py", [], {})],
    3: [("day03_linreg/main.py", [], {})],
    4: [("day04_mlp_mnist/main.py", [], {}), ("day04_mlp_mnist/tune.py", [], {}),
        ("day04_mlp_mnist/init_lab.py", [], {}), ("day04_mlp_mnist/bench.py", [], {})],
    5: [("day05_dataloader/main.py", [], {})],
    6: [("day06_ckpt_resume/prove_resume.py", [], {}), ("day06_ckpt_resume/overfit_lab.py", [], {})],
    7: [("day07_amp_accum/main.py", [], {}), ("day07_amp_accum/main.py", ["--out", "day07_amp_accum/results/avx2"], AVX2),
        ("day07_amp_accum/optim_lab.py", [], {})],
    8: [("day08_mini_autograd/main.py", [], {}), ("day08_mini_autograd/bench.py", [], {})],
    9: [("day09_cnn/main.py", [], {}), ("day09_cnn/norms_lab.py", [], {}), ("day09_cnn/transfer_lab.py", [], {}),
        ("day09_cnn/bench.py", ["--tune"], {}),
        ("day09_cnn/bench.py", [], {})],
    10: [("day10_bigbatch_ckpt/main.py", [], {}),
         ("day10_bigbatch_ckpt/main.py", ["--out", "day10_bigbatch_ckpt/results/avx2"], AVX2),
         ("day10_bigbatch_ckpt/levers_lab.py", [], {})],
    11: [("day11_profile/main.py", [], {}), ("day11_profile/compile_lab.py", [], {})],
    12: [("day12_template/main.py", [], {}), ("day12_template/bench.py", [], {}),
         ("day12_template/zero_lab.py", [], {}), ("day12_template/muon_lab.py", [], {}),
         ("day12_template/drills_lab.py", [], {}),
         ("day12_template/template/doctor.py", ["--config", "day12_template/template/configs/shakespeare_cpu.toml",
                                                "--symptom", "data",
                                                "--out", "day12_template/results/doctor/shakespeare_data"], {})],
}
FOUND = {"day12_template/template/doctor.py": 3}  # an exit code that reports what the script found (problems), not a failure


def command(script: str, flags: list[str]) -> list[str]:
    """The script with `--out <its day>/results` unless the flags name another folder."""
    out = [] if "--out" in flags else ["--out", str(Path(script).parent / "results")]
    return [sys.executable, script, *flags, *out]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", type=int, nargs="+", choices=sorted(STEPS), metavar="DAY", help="days to refresh")
    parser.add_argument("--list", action="store_true", help="print the commands and run nothing")
    args = parser.parse_args(argv)
    for day in args.only or sorted(STEPS):
        for script, flags, env in STEPS[day]:
            cmd = command(script, flags)
            shown = " ".join([*(f"{k}={v}" for k, v in env.items()), "python", *cmd[1:]])
            if args.list:
                print(shown)
                continue
            print(f"==> {shown}", flush=True)
            t0 = time.perf_counter()
            done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env})
            print(f"    exit {done.returncode} after {time.perf_counter() - t0:.0f} s", flush=True)
            if done.returncode not in (0, FOUND.get(script)):
                return done.returncode
    if not args.list:  # the READMEs quote the results: bring them in line
        return subprocess.run([sys.executable, "scripts/report.py", "--readme"], cwd=ROOT).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
