"""loop_walk.py — the files a reader of Day 12's training loop jumps to, measured on one tiny run.

    python scripts/loop_walk.py            # the calls that take the run's config (or a part of it, or a holder of it)
    python scripts/loop_walk.py --all      # every call out of train.py

It runs the template tests' tiny run (tests/helpers.py: TINY, one process) and records each function of another
template file that a function in train.py calls, in the order first called (a function counted once: a reader reads
it once). Consecutive functions of one file are one stay; a return is a stay in a file already left. Run it at two
commits to compare their layouts (issue 45's closing note did so at 2eacdad and after it).
"""
import argparse
import sys
import tempfile
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent.parent / "day12_template" / "template"
PACKAGE = TEMPLATE / "train_template"
LOOP = str(PACKAGE / "train.py")
sys.path.insert(0, str(TEMPLATE))
sys.path.insert(0, str(TEMPLATE / "tests"))

from train_template import train
from helpers import TINY, cfg_of

SECTIONS = ("run", "data", "model", "optim", "train", "checkpoint", "profile")


def config_parts(cfg) -> list:
    """The config, its sections and their tables: what "a part of the config" is."""
    sections = [getattr(cfg, name) for name in SECTIONS]
    return [cfg, *sections, *(t for s in sections for t in getattr(s, "tables", {}).values())]


def takes_config(frame, parts: list) -> bool:
    """Whether the called function got the config, a part of it or an object holding it (`.cfg`) as an argument."""
    code = frame.f_code
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    values = [frame.f_locals.get(name) for name in names]
    return any(any(v is p for p in parts) or getattr(v, "cfg", None) is parts[0] for v in values)


def walk(only_config: bool) -> list[tuple[str, str]]:
    """(file, function) for each call out of train.py, in the order first made."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = cfg_of({**TINY, "checkpoint.every_steps": 0}, Path(tmp) / "run")
        parts, calls = config_parts(cfg), []

        def on_call(frame, event, arg):
            code = frame.f_code
            caller = frame.f_back.f_code.co_filename if frame.f_back else ""
            if event != "call" or caller != LOOP or code.co_filename == LOOP:
                return
            if not code.co_filename.startswith(str(PACKAGE)):
                return
            call = (str(Path(code.co_filename).relative_to(PACKAGE)), code.co_qualname)
            if call not in calls and (not only_config or takes_config(frame, parts)):
                calls.append(call)

        sys.setprofile(on_call)
        try:
            train.run(cfg)
        finally:
            sys.setprofile(None)
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="every call out of train.py, not only the config's")
    calls = walk(only_config=not parser.parse_args().all)
    stays: list[tuple[str, list[str]]] = []
    for file, function in calls:
        if stays and stays[-1][0] == file:
            stays[-1][1].append(function)
        else:
            stays.append((file, [function]))
    returns = sum(file in {f for f, _ in stays[:i]} for i, (file, _) in enumerate(stays))
    for file, functions in stays:
        print(f"{file}: {', '.join(functions)}")
    print(f"{len(calls)} functions in {len({f for f, _ in stays})} files: {len(stays)} stays, {returns} returns to "
          f"a file already left")


if __name__ == "__main__":
    main()
