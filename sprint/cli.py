"""Command lines built from a config dataclass, every value checked before any work starts.

    @dataclass
    class Config:
        epochs: int = arg(8, "passes over the training set", gt=0)
        amp: str = arg("bf16", "autocast dtype", choices=("off", "bf16", "fp16"))
        def __post_init__(self):
            validate(self)                       # the same checks for code and command line

    cfg, out = parse(Config, argv, __doc__, out=runs_dir(__file__))

A bad value ends in `parser.error`: one line naming the flag, exit code 2, nothing created. `run(main)` turns an
expected failure (`UserError`: missing data, an existing run, an unreadable checkpoint) into one line, exit code 1;
anything unexpected keeps its traceback.
"""
import argparse
import dataclasses
import math
import operator
import os
import sys
import types
import typing
from pathlib import Path

BOUNDS = (("gt", operator.gt, ">"), ("ge", operator.ge, ">="), ("lt", operator.lt, "<"), ("le", operator.le, "<="))


class UserError(Exception):
    """An expected failure the user can fix; `run` prints its message as one line and exits with code 1."""


def arg(default, help: str, *, gt=None, ge=None, lt=None, le=None, choices=None):
    """A dataclass field with its help text and allowed values (bounds apply to each element of a tuple)."""
    return dataclasses.field(default=default, metadata={"help": help, "gt": gt, "ge": ge, "lt": lt, "le": le,
                                                        "choices": choices})


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def validate(cfg) -> None:
    """Raise ValueError naming the first field whose value is not finite, out of its bounds or not a choice."""
    for f in dataclasses.fields(cfg):
        value, meta = getattr(cfg, f.name), f.metadata
        for x in value if isinstance(value, (tuple, list)) else (value,):
            if x is None or isinstance(x, bool):
                continue
            if isinstance(x, float) and not math.isfinite(x):
                raise ValueError(f"{flag(f.name)} must be a finite number, got {x!r}")
            for key, op, word in BOUNDS:
                if meta.get(key) is not None and not op(x, meta[key]):
                    raise ValueError(f"{flag(f.name)} must be {word} {meta[key]}, got {x!r}")
            if meta.get("choices") and x not in meta["choices"]:
                raise ValueError(f"{flag(f.name)} must be one of {', '.join(map(str, meta['choices']))}; got {x!r}")


def _flag_type(hint):
    """(element type, nargs) for an annotation: int, float, str, Path, bool, X | None, tuple[X, ...]."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (tuple, list):
        return typing.get_args(hint)[0], "+"
    return hint, None


def add_flags(parser: argparse.ArgumentParser, cls, skip=()) -> None:
    """One `--flag` per field of the dataclass `cls` (bools get `--x/--no-x`), help and choices from `arg`."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        kind, nargs = _flag_type(hints[f.name])
        kwargs = {"dest": f.name, "default": f.default, "help": f.metadata.get("help", " ")}
        if kind is bool:
            parser.add_argument(flag(f.name), action=argparse.BooleanOptionalAction, **kwargs)
        else:
            choices = f.metadata.get("choices")
            metavar = None if choices else kind.__name__.upper()  # argparse lists the choices itself
            parser.add_argument(flag(f.name), type=kind, nargs=nargs, choices=choices, metavar=metavar, **kwargs)


def from_args(cls, args: argparse.Namespace, parser: argparse.ArgumentParser):
    """Build `cls` from parsed flags; its validation error becomes a usage error (exit 2)."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    try:
        cfg = cls(**values)
        if hasattr(cfg, "device"):
            from sprint.device import pick_device

            pick_device(cfg.device)  # `--device cuda` on a machine without CUDA fails here, not after loading data
    except ValueError as exc:
        parser.error(str(exc))
    return cfg


def unwritable(path: Path) -> str | None:
    """Why `path` cannot become an output folder, or None if it can. Creates nothing."""
    existing = Path(path).resolve()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line (`prog: error: ...`, exit code 2), without the usage block above them."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (all flags: --help)\n")


def parser_for(cls, doc: str, out: Path | None = None) -> argparse.ArgumentParser:
    """A parser with defaults shown in --help, one flag per config field and, with `out`, an `--out` folder."""
    parser = OneLineParser(description=doc.strip().splitlines()[0],
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_flags(parser, cls)
    if out is not None:
        parser.add_argument("--out", type=Path, default=out,
                            help="output folder (runs/ is git-ignored; --out <day>/results refreshes the committed "
                                 "figures)")
    return parser


def parse(cls, argv, doc: str, out: Path | None = None):
    """(config, out folder) from the command line; any bad value exits 2 with one line before work starts."""
    parser = parser_for(cls, doc, out)
    args = parser.parse_args(argv)
    cfg = from_args(cls, args, parser)
    if out is not None and (why := unwritable(args.out)):
        parser.error(f"--out {args.out}: {why}")
    return cfg, getattr(args, "out", None)


def run(main, argv=None) -> None:
    """Script entry point: `main(argv)`; a UserError or running out of memory prints `error: <message>` and exits 1,
    Ctrl-C exits 130."""
    try:
        main(sys.argv[1:] if argv is None else argv)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
    except (MemoryError, RuntimeError) as exc:  # torch's CPU allocator and CUDA's OutOfMemoryError are RuntimeErrors
        first_line = (str(exc) or type(exc).__name__).splitlines()[0]
        if not isinstance(exc, MemoryError) and not any(s in first_line for s in ("out of memory", "allocate memory")):
            raise
        print(f"error: out of memory ({first_line}); try smaller sizes (batch, model, --n) or fewer workers",
              file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


def progress(iterable=None, **kwargs):
    """A tqdm bar on a terminal; silent under pytest and when stderr is not a terminal."""
    from tqdm import tqdm

    quiet = True if "PYTEST_CURRENT_TEST" in os.environ else None  # None: tqdm hides itself off a terminal
    return tqdm(iterable, disable=quiet, dynamic_ncols=True, leave=False, **kwargs)

