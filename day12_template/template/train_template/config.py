"""The run's configuration: dataclass sections, a TOML file, `--set section.key=value` overrides.

Every value is checked before any work starts: an unknown key (with the nearest valid one), a wrong type or an
impossible value raises `ConfigError` naming the field; `train.py` prints it and exits with code 2, having written
nothing. Each field carries its one-line *why*; `python train.py --help-config` prints them all.
"""
import argparse
import dataclasses
import difflib
import functools
import importlib.util
import json
import math
import operator
import os
import re
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path

BOUNDS = (("gt", operator.gt, ">"), ("ge", operator.ge, ">="), ("lt", operator.lt, "<"), ("le", operator.le, "<="))
INT64 = (-2**63, 2**63 - 1)  # every integer field: what torch and NumPy can hold (no C++ overflow further down)


class ConfigError(ValueError):
    """A value the run cannot start with; the message names the field (`optim.lr`)."""


def opt(default, why: str, *, gt=None, ge=None, lt=None, le=None, choices=None, safe: bool = False):
    """A field with its reason, its allowed values and whether a resumed run may change it (`safe`)."""
    return field(default=default, metadata={"why": why, "gt": gt, "ge": ge, "lt": lt, "le": le, "choices": choices,
                                            "safe": safe})


def registries() -> dict:
    """{"model": models.MODELS, "data": data.DATASETS}: the sections whose choice (model.name, data.dataset) is a
    registered entry with a table of its own fields. Imported on first use, not at the top, because models.py and
    data.py import this module for `opt` (each entry declares its own config table)."""
    from . import data, models

    return {"model": models.MODELS, "data": data.DATASETS}


def registered(section: str) -> tuple[str, ...]:
    """The entries registered for `section`: the values its choice may take."""
    return tuple(registries()[section])


def default_tables(section: str) -> dict:
    return {name: entry.table() for name, entry in registries()[section].items()}


class Tables:
    """A section with a table of fields for each registered entry, read as attributes (`cfg.model.gpt.n_layer`,
    `cfg.data.shakespeare.block_size`); `.chosen` names the chosen entry, `.table` is its table."""
    choice = ""  # the field naming the chosen entry

    def __getattr__(self, name: str):
        tables = self.__dict__.get("tables", {})
        if name in tables:
            return tables[name]
        raise AttributeError(f"{type(self).__name__.lower()} has no field or table {name!r}")

    @property
    def chosen(self) -> str:
        """The chosen entry's name: the value of the `choice` field (data.dataset, model.name)."""
        return getattr(self, self.choice)

    @property
    def table(self):
        """The chosen entry's table: `cfg.data.table` is `cfg.data.shakespeare` when data.dataset is shakespeare."""
        return self.tables[self.chosen]


@dataclass
class Run:
    seed: int = opt(0, "one seed for init, data order and dropout: same seed + same config + same device type = "
                    "the same run", ge=0, le=2**32 - 1)  # NumPy's seed range
    out_dir: str = opt("runs/template", "run folder for config, metrics, TensorBoard and checkpoints (relative to "
                       "the current folder)", safe=True)
    device: str = opt("auto", "auto = cuda -> mps -> cpu; or cpu, cuda, cuda:N, mps (torchrun: cuda:LOCAL_RANK)",
                      safe=True)
    deterministic: bool = opt(True, "deterministic kernels, cuDNN autotuner off: repeatable runs and exact resume "
                              "(a little slower on GPUs); an op with no deterministic kernel stops the run, naming "
                              "it", safe=True)
    tracker: str = opt("tensorboard", "where the metrics go besides metrics.jsonl: tensorboard (out_dir/tb/) | mlflow "
                       "(an MLflow store in out_dir/mlruns/, no server; pip install mlflow-skinny) | none",
                       choices=("tensorboard", "mlflow", "none"), safe=True)


@dataclass
class Data(Tables):
    """The fields every dataset has; each dataset's own fields are in its table, `[data.<name>]` (declared next to
    the dataset in data.py): `cfg.data.shakespeare.block_size`."""
    choice = "dataset"  # the field that picks the table
    dataset: str = opt("mnist", "which data: a dataset registered in data.py, its own fields in [data.<name>]",
                       choices=functools.partial(registered, "data"))
    root: str = opt("", "folder holding the files; '' = the dataset's own place (the repo's bundle), where it has "
                    "one", safe=True)
    subset: int = opt(0, "0 = all the training data; N = only the first N images or tokens (smoke runs)", ge=0)
    num_workers: int = opt(0, "DataLoader worker processes: in-memory datasets need none, image files want 2-8",
                           ge=0, le=256, safe=True)  # each one is a process: a million of them is an OOM kill
    pin_memory: bool = opt(True, "page-locked host batches for asynchronous copies to CUDA (ignored elsewhere)",
                           safe=True)
    tables: dict = field(default_factory=functools.partial(default_tables, "data"), repr=False)


@dataclass
class Model(Tables):
    """The fields every model has; each model's own hyperparameters are in its table, `[model.<name>]` (declared
    next to the model in models.py): `cfg.model.gpt.n_layer`."""
    choice = "name"  # the field that picks the table
    name: str = opt("mlp", "which model: a model registered in models.py, its hyperparameters in [model.<name>]",
                    choices=functools.partial(registered, "model"))
    channels_last: bool = opt(False, "NHWC memory layout: faster convolutions on tensor cores and CPUs", safe=True)
    activation_checkpointing: bool = opt(False, "recompute each block during backward instead of keeping its "
                                         "activations: less memory, ~30% more compute", safe=True)
    compile: bool = opt(False, "torch.compile the model: faster steps after a compile warm-up (needs a C++ "
                        "compiler; Triton on CUDA)", safe=True)
    tables: dict = field(default_factory=functools.partial(default_tables, "model"), repr=False)


@dataclass
class Optim:
    name: str = opt("adamw", "adamw | muon (torch.optim.Muon for the blocks' weight matrices, AdamW at optim.lr for "
                    "the rest: the speedrun records' optimizer; optimizers.py)", choices=("adamw", "muon"))
    lr: float = opt(3e-3, "peak learning rate, reached at the end of the warmup", gt=0)
    muon_lr: float = opt(0.05, "optim.name=muon: Muon's peak learning rate for the blocks' matrices (its update is "
                         "orthogonalised, of unit scale: rates 1-2 decades above AdamW's)", gt=0)
    weight_decay: float = opt(0.05, "AdamW's decoupled decay, on weight matrices only (not biases, norm gains or "
                              "embeddings' positions)", ge=0)
    betas: tuple[float, ...] = opt((0.9, 0.999), "AdamW's moment decay rates (first, second)", ge=0, lt=1)
    warmup_ratio: float = opt(0.05, "share of all optimizer steps spent ramping the LR up: early steps on random "
                              "weights are the unstable ones", ge=0, lt=1)
    min_lr_ratio: float = opt(0.0, "the cosine decays to lr * min_lr_ratio at the last step", ge=0, le=1)
    grad_clip: float = opt(1.0, "clip the global gradient norm to this (after unscale_); 0 = off", ge=0)


@dataclass
class Train:
    steps: int = opt(0, "optimizer steps of the whole run, the one horizon (the cosine spans them, as nanoGPT's "
                     "max_iters); text must set it; 0 = train.epochs passes over the training set (images)", ge=0,
                     safe=True)
    epochs: int = opt(8, "images, when train.steps is 0: passes over the training set, converted once into steps",
                      gt=0, safe=True)
    eval_every: int = opt(0, "optimizer steps between evaluations (each also checkpoints; the run's last step is "
                          "always evaluated); 0 = once per epoch of images, only at the end of text", ge=0,
                          safe=True)
    batch_size: int = opt(256, "samples (images or windows) per optimizer step over all ranks and micro-batches "
                          "(the global batch)", gt=0)
    grad_accum: int = opt(1, "micro-batches per optimizer step on each rank: one forward sees batch_size / "
                          "(grad_accum x world size) samples", gt=0, safe=True)
    amp: bool = opt(False, "autocast the forward pass to amp_dtype (weights, gradients, AdamW moments stay fp32); "
                    "turn on for GPUs", )
    amp_dtype: str = opt("bfloat16", "bfloat16 (fp32's range, no scaling) | float16 (GradScaler rescues small "
                         "gradients)", choices=("bfloat16", "float16"))
    strategy: str = opt("ddp", "under torchrun: ddp (one replica per rank, gradients all-reduced) | fsdp (FSDP2: "
                        "parameters, gradients, moments sharded)", choices=("ddp", "fsdp"), safe=True)
    early_stop_patience: int = opt(0, "stop after this many evaluations without a better validation loss; 0 = off",
                                   ge=0, safe=True)
    max_steps: int = opt(0, "0 = no cap; N = end after N optimizer steps in total, the schedule unchanged (smoke "
                         "runs)", ge=0, safe=True)
    log_every: int = opt(50, "optimizer steps between training records: each costs a host sync", gt=0, safe=True)
    progress: str = opt("auto", "auto = a tqdm bar on a terminal, one line per evaluation otherwise | bar | off",
                        choices=("auto", "bar", "off"), safe=True)


@dataclass
class Checkpoint:
    resume: str = opt("", "'' = fresh run; 'auto' = out_dir/last.pt when present; or a checkpoint path",
                      safe=True)
    init_from: str = opt("", "fine-tune: take only the model weights from this checkpoint (any strategy or world "
                         "size)")
    every_steps: int = opt(0, "also checkpoint every N optimizer steps, not only after evaluations (0 = off): what "
                           "a kill can cost", ge=0, safe=True)
    keep_last: int = opt(3, "step checkpoints kept besides best.pt; older ones are deleted", ge=1, safe=True)
    accept_new_data: bool = opt(False, "resume although the data differs from the checkpoint's (its fingerprint: "
                                "each split's size and content hash), e.g. continued pre-training on new text; "
                                "run.json records it", safe=True)
    format: str = opt("auto", "full: one file, gathered on rank 0 | sharded: a folder where every rank writes its "
                      "own shard (torch.distributed.checkpoint), loadable at any world size | auto: sharded under "
                      "FSDP (no rank holds the whole model), else full", choices=("auto", "full", "sharded"),
                      safe=True)
    async_save: bool = opt(False, "sharded checkpoints: copy the state, then write it in a background thread while "
                           "training goes on (torch.distributed.checkpoint.async_save); a second save waits for the "
                           "first", safe=True)


@dataclass
class Profile:
    enabled: bool = opt(False, "trace a few steps with torch.profiler into out_dir/profile/ (open in Perfetto)",
                        safe=True)
    start_step: int = opt(5, "optimizer steps skipped before tracing (warm-up, allocator, compile)", ge=0,
                          safe=True)
    steps: int = opt(3, "optimizer steps traced", gt=0, safe=True)


@dataclass
class Config:
    run: Run = field(default_factory=Run)
    data: Data = field(default_factory=Data)
    model: Model = field(default_factory=Model)
    optim: Optim = field(default_factory=Optim)
    train: Train = field(default_factory=Train)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    profile: Profile = field(default_factory=Profile)


# -- field table ------------------------------------------------------------------------------------------------
def _leaf_fields(prefix: str, cls):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name != "tables":
            yield f"{prefix}.{f.name}", f, hints[f.name]


@functools.cache
def fields() -> dict:
    """{dotted key: (dataclass field, type)} for every field: `optim.lr`, ..., each section followed by its tables
    (`data.shakespeare.block_size`, `model.gpt.n_layer`)."""
    table = {}
    for section in dataclasses.fields(Config):
        table.update((key, (f, hint)) for key, f, hint in _leaf_fields(section.name, section.default_factory))
        for name, entry in registries().get(section.name, {}).items():
            table.update((key, (f, hint)) for key, f, hint in _leaf_fields(f"{section.name}.{name}", entry.table))
    return table


def safe_on_resume() -> tuple[str, ...]:
    return tuple(k for k, (f, _) in fields().items() if f.metadata["safe"])


def describe() -> str:
    """Every field with its default and its reason (`--help-config`, and the README's table)."""
    rows = []
    for key, (f, _) in fields().items():
        rows.append(f"{key} = {to_toml(f.default)}\n    {f.metadata['why']}"
                    + ("  [may change on resume]" if f.metadata["safe"] else ""))
    return "\n".join(rows)


# -- checking one value ------------------------------------------------------------------------------------------
def _typename(hint) -> str:
    if typing.get_origin(hint) is tuple:
        return f"a list of {typing.get_args(hint)[0].__name__}s"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}[hint]


def coerce(key: str, value, hint):
    """`value` as the field's type, or ConfigError naming `key`. Ints pass as floats; bools never pass as ints."""
    if typing.get_origin(hint) is tuple:
        if not isinstance(value, (list, tuple)) or not value:
            raise ConfigError(f"{key} must be {_typename(hint)}, got {value!r}")
        return tuple(coerce(f"{key}[{i}]", v, typing.get_args(hint)[0]) for i, v in enumerate(value))
    ok = (isinstance(value, bool) if hint is bool else
          isinstance(value, int) and not isinstance(value, bool) if hint is int else
          isinstance(value, (int, float)) and not isinstance(value, bool) if hint is float else
          isinstance(value, str))
    if not ok:
        raise ConfigError(f"{key} must be {_typename(hint)}, got {value!r}")
    if hint is int and not INT64[0] <= value <= INT64[1]:
        raise ConfigError(f"{key} must fit in 64 bits ({INT64[0]} to {INT64[1]}), got {value!r}")
    if hint is float:
        value = float(value)
        if not math.isfinite(value):
            raise ConfigError(f"{key} must be a finite number, got {value!r}")
    return value


def check_bounds(key: str, value, meta) -> None:
    for x in value if isinstance(value, tuple) else (value,):
        for name, test, word in BOUNDS:
            if meta[name] is not None and not test(x, meta[name]):
                allowed = " and ".join(f"{w} {meta[n]}" for n, _, w in BOUNDS if meta[n] is not None)
                raise ConfigError(f"{key} must be {allowed}, got {value!r}")
        allowed = meta["choices"]() if callable(meta["choices"]) else meta["choices"]  # a registry's names
        if allowed and x not in allowed:
            raise ConfigError(f"{key} must be one of {' | '.join(map(str, allowed))}; got {x!r}"
                              f"{nearest(str(x), map(str, allowed))}")


def nearest(word: str, candidates) -> str:
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.5)
    return f" (did you mean `{close[0]}`?)" if close else ""


def unknown_key(key: str) -> ConfigError:
    """The fields of that name elsewhere (`lr` -> `optim.lr`; `block_size` -> each text dataset's), else the nearest
    name at the key's depth: a section for a section (`trian` -> `train`), a field for a field. A section given a
    value names its first field."""
    names = {}  # the sections and fields at the key's depth, each with its first field
    for k in fields():
        names.setdefault(".".join(k.split(".")[:key.count(".") + 1]), k)
    if key in names and names[key] != key:  # a section or a model's table
        return ConfigError(f"`{key}` is a section of the config, not a field: set one of its fields (e.g. "
                           f"`{names[key]}`; --help-config lists them)")
    by_leaf = [k for k in fields() if k.split(".")[-1] == key.split(".")[-1]]  # one per table that has it
    by_leaf = [f"`{k}`" for k in by_leaf if k.startswith(key.split(".")[0] + ".")] or [f"`{k}`" for k in by_leaf]
    hint = f" (did you mean {' or '.join(by_leaf)}?)" if by_leaf else nearest(key, names)
    return ConfigError(f"unknown config key `{key}`{hint}")


# -- building a Config -----------------------------------------------------------------------------------------
def flatten(table: dict, where: str = "") -> dict:
    """{"optim": {"lr": 1e-3}, "model": {"gpt": {"n_layer": 4}}} -> {"optim.lr": 1e-3, "model.gpt.n_layer": 4};
    a table that holds no field (`[optimizer]`) is an error."""
    flat = {}
    for name, value in table.items():
        key = f"{where}{name}"
        if isinstance(value, dict):
            if not any(k.startswith(key + ".") for k in fields()):
                raise unknown_key(key)
            flat.update(flatten(value, key + "."))
        else:
            flat[key] = value
    return flat


def owner(cfg: Config, key: str):
    """(the section or model table holding `key`, the field's name): `model.gpt.n_layer` -> (cfg.model.gpt,
    "n_layer")."""
    *path, name = key.split(".")
    obj = cfg
    for part in path:
        obj = getattr(obj, part)
    return obj, name


def parse_override(item: str) -> tuple[str, object]:
    """`optim.lr=1e-3` -> ("optim.lr", 0.001): the value is read as TOML (numbers, true, [16, 32]), else a string."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set expects key=value (e.g. optim.lr=1e-3), got {item!r}")
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text  # a bare word: dataset=mnist, out_dir=runs/x
    return key.strip(), value


def build(values: dict) -> Config:
    """A checked Config from dotted keys (file values first, overrides after)."""
    cfg = Config()
    for key, value in values.items():
        if key not in fields():
            raise unknown_key(key)
        f, hint = fields()[key]
        value = coerce(key, value, hint)
        check_bounds(key, value, f.metadata)
        setattr(*owner(cfg, key), value)
    check_combinations(cfg)
    return cfg


def check_combinations(cfg: Config, world_size: int | None = None) -> None:
    """Rules that involve several fields (and, once known, the number of ranks)."""
    world = world_size or int(os.environ.get("WORLD_SIZE", "1"))
    per_step = cfg.train.grad_accum * world
    if cfg.train.batch_size % per_step:
        raise ConfigError(f"train.batch_size={cfg.train.batch_size} must be divisible by train.grad_accum "
                          f"({cfg.train.grad_accum}) x world size ({world}) = {per_step}")
    if cfg.data.root and Path(cfg.run.out_dir).resolve().is_relative_to(Path(cfg.data.root).resolve()):
        raise ConfigError(f"run.out_dir {cfg.run.out_dir} is data.root {cfg.data.root} or inside it: put the run "
                          f"folder beside the data, not in it")
    check_task(cfg)
    if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", cfg.run.device):
        raise ConfigError(f"run.device must be auto, cpu, mps, cuda or cuda:N; got {cfg.run.device!r}")
    if cfg.optim.name == "muon" and cfg.train.strategy == "fsdp":
        raise ConfigError("optim.name=muon orthogonalises whole weight matrices, which train.strategy=fsdp shards: "
                          "use train.strategy=ddp (or optim.name=adamw)")
    if len(cfg.optim.betas) != 2:
        raise ConfigError(f"optim.betas must hold two numbers, got {list(cfg.optim.betas)}")
    if not cfg.run.out_dir:
        raise ConfigError("run.out_dir must name a folder")
    if cfg.run.tracker == "mlflow" and importlib.util.find_spec("mlflow") is None:
        raise ConfigError("run.tracker=mlflow needs MLflow's tracking client, which is not installed: pip install "
                          "mlflow-skinny (or pip install -r requirements.lock.txt in the repo)")
    if world_size and cfg.checkpoint.async_save and not sharded_checkpoints(cfg, world):  # the run's, once known
        raise ConfigError("checkpoint.async_save writes sharded checkpoints only: set checkpoint.format=sharded "
                          "(auto is sharded under FSDP only)")


def sharded_checkpoints(cfg: Config, world: int) -> bool:
    """checkpoint.format resolved: auto = sharded under FSDP (with more than one rank)."""
    if cfg.checkpoint.format == "auto":
        return cfg.train.strategy == "fsdp" and world > 1
    return cfg.checkpoint.format == "sharded"


def check_task(cfg: Config) -> None:
    """The model and the data must learn the same task, and text (windows drawn at random, no epochs) sets its
    length in steps; then the chosen dataset's and model's tables check themselves (`check()`, where they have
    one)."""
    models, datasets = registries()["model"], registries()["data"]
    task = datasets[cfg.data.dataset].task
    if models[cfg.model.name].task != task:
        raise ConfigError(f"model.name={cfg.model.name} learns the {models[cfg.model.name].task!r} task but "
                          f"data.dataset={cfg.data.dataset} is {task!r} data; models for it: "
                          + ", ".join(name for name, entry in models.items() if entry.task == task))
    if task == "lm" and not cfg.train.steps:
        raise ConfigError(f"train.steps: {cfg.data.dataset} is text, trained for a number of optimizer steps; set "
                          f"train.steps (and train.eval_every)")
    for table in (cfg.data.table, cfg.model.table):
        if hasattr(table, "check"):
            table.check(cfg)


def ignored(cfg: Config) -> str:
    """A warning for values the run accepts but does not use ('' if none): a train.epochs other than the default in a
    run with train.steps, and the table of a dataset or model the run does not use, set away from its defaults (an
    image config switched to text with --set, say: the dataset now chosen reads its own table). Not refused: then such
    a switch would have to set them back too."""
    unused = []
    default = fields()["train.epochs"][0].default
    if cfg.train.steps and cfg.train.epochs != default:
        unused.append(f"train.epochs={cfg.train.epochs} is ignored: train.steps={cfg.train.steps} sets the run's "
                      f"length in optimizer steps")
    for section in registries():
        part = getattr(cfg, section)
        for name, table in part.tables.items():
            changed = [f"{f.name}={to_toml(getattr(table, f.name))}" for f in dataclasses.fields(table)
                       if getattr(table, f.name) != f.default]
            if name != part.chosen and changed:
                unused.append(f"[{section}.{name}] ({', '.join(changed)}) is ignored: {section}.{part.choice} is "
                              f"{part.chosen}, which reads [{section}.{part.chosen}]")
    return "; ".join(unused)


def argument_parser(doc: str, inspect: bool = False) -> argparse.ArgumentParser:
    """A parser with --config and --set (and, if `inspect`, --print-config and --help-config); `doc`, the script's
    docstring: line 1 describes it, the rest is the epilog."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0], epilog="\n".join(doc.splitlines()[2:]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="a TOML file (see configs/); fields left out keep their defaults")
    parser.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                        help="override fields: --set optim.lr=1e-3 train.amp=true data.dataset=synthetic")
    if inspect:
        parser.add_argument("--print-config", action="store_true", help="print the effective config as TOML and exit")
        parser.add_argument("--help-config", action="store_true", help="list every field with its default and reason")
    return parser


def load(path: str | None, overrides: list[str]) -> Config:
    """The config file (TOML) with the `--set` overrides applied, checked."""
    values = {}
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")  # TOML files are UTF-8, whatever the locale says
        except OSError as exc:
            raise ConfigError(f"--config {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"--config {path} is not UTF-8 text (TOML must be): byte {exc.object[exc.start]:#04x} "
                              f"at offset {exc.start}") from None
        try:
            values = flatten(tomllib.loads(text))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"--config {path} is not valid TOML: {exc}") from None
    for item in overrides:
        key, value = parse_override(item)
        values[key] = value
    return build(values)


def to_dict(cfg: Config) -> dict:
    """{"run": {...}, "data": {"dataset": ..., "mnist": {...}, ...}, "model": {"name": ..., "mlp": {...}, ...}, ...}:
    the TOML layout."""
    out = dataclasses.asdict(cfg)
    for section in registries():
        out[section].update(out[section].pop("tables"))
    return out


def flat_values(cfg: Config) -> dict:
    """{dotted key: value} for every field."""
    return {key: getattr(*owner(cfg, key)) for key in fields()}


def from_dict(d: dict) -> Config:
    return build(flatten(d))


def to_toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(to_toml(v) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    return repr(value)


def dump_toml(cfg: Config) -> str:
    """The effective config as TOML, readable back by `--config`: every section, and the chosen dataset's and
    model's tables."""
    sections = []
    for section, values in to_dict(cfg).items():
        sections.append((section, values))
        if section in registries():
            chosen = getattr(cfg, section).chosen
            sections.append((f"{section}.{chosen}", values[chosen]))
    lines = []
    for section, values in sections:
        lines.append(f"[{section}]")
        lines += [f"{name} = {to_toml(value)}" for name, value in values.items() if not isinstance(value, dict)]
        lines.append("")
    return "\n".join(lines)


def _flat(table: dict, where: str = "") -> dict:
    """flatten() without the checks: for configs saved by other versions, whose keys may be gone."""
    flat = {}
    for name, value in table.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{where}{name}."))
        else:
            flat[f"{where}{name}"] = value
    return flat


def differences(saved: dict, now: Config) -> list[str]:
    """`key: saved -> now` for every field that differs, leaving out the ones safe to change on resume."""
    before = _flat(saved) if saved else {}
    after = flat_values(now)
    diffs = []
    for key in fields():
        if key in safe_on_resume():
            continue
        old, new = before.get(key), after[key]
        if isinstance(old, list):
            old = tuple(old)
        if old != new:
            diffs.append(f"{key}: {to_toml(old) if old is not None else '(absent)'} -> {to_toml(new)}")
    return diffs
