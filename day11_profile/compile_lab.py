"""Day 11, the last stage — torch.compile: its cost, its steady-state step, recompiles and the _orig_mod. prefix.

  1. compile time and steady state, in one run: the optimised pipeline's training step (Day 4's MLP, batch 256,
     AdamW) eager and with `torch.compile(model)` (the inductor backend). The first compiled step includes compiling,
     once into an empty cache (what a fresh machine pays) and once more from the on-disk cache; then the median step
     of each. Inductor is told to draw dropout masks as eager does (`fallback_random`), so the two runs can be
     compared number for number;
  2. recompiles: the batch sizes an epoch produces (full batches of 256, then a smaller last one; 96 when training on
     all 60,000 images) through `dynamic=None` (the default: recompiles once, then treats the batch dimension as
     symbolic), `dynamic=False` (one graph per size), `dynamic=True` (one symbolic graph) and `drop_last` (one size).
     Graphs are counted by a counting backend: recompiles are decided by Dynamo's guards, before any backend runs;
  3. `_orig_mod.`: the compiled module's state_dict keys, why a plain model refuses them, and the fix.

Run:   python day11_profile/compile_lab.py                                  (writes runs/day11_profile/compile/)
       python day11_profile/compile_lab.py --out day11_profile/results      (refreshes the committed figures)
"""
import contextlib
import copy
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import torch
import torch.nn.functional as F

from day04_mlp_mnist.main import MLP
from day11_profile.main import prepared
from sprint import machine, runs_dir, write_results
from sprint.cli import UserError, arg, parse, run, validate
from sprint.measure import median_seconds

SIZES = (256, 256, 216, 256, 96)  # full batches; the last of 55,000 images (216); the last of 60,000 (96)


def train_step(model, optimizer, x, y) -> float:
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.item()


def inductor_unavailable() -> str | None:
    """Why the inductor backend cannot build on this machine (no C++ compiler, ...), or None when it can."""
    try:
        torch.compile(lambda t: t * 2 + 1)(torch.ones(3))
    except Exception as exc:  # any failure to build means: skip, and say why
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def compile_cost(cfg, x: torch.Tensor, y: torch.Tensor) -> dict:
    """Eager vs compiled on the same batch: the first step (compiling included), the steady-state step, the losses."""
    import torch._inductor.config as inductor_config
    from torch._inductor.utils import fresh_cache

    torch.manual_seed(cfg.seed)
    start = MLP(hidden=cfg.hidden)  # every run below starts from these weights
    result = {"first_step_s": {}, "steady_step_s": {}, "losses": {}}
    # fallback_random: inductor draws dropout masks as eager does, so losses can be compared number for number.
    with inductor_config.patch(fallback_random=True), (fresh_cache() if cfg.cold else contextlib.nullcontext()):
        for kind in ["cold", "warm"] if cfg.cold else ["shared cache"]:  # an empty cache, then read back from it
            torch._dynamo.reset()  # forget the compiled code held in memory: the next call compiles
            compiled = torch.compile(copy.deepcopy(start))
            optimizer = torch.optim.AdamW(compiled.parameters(), lr=1e-3)
            torch.manual_seed(cfg.seed)
            t0 = time.perf_counter()
            first = train_step(compiled, optimizer, x, y)
            result["first_step_s"][f"compiled, {kind}"] = time.perf_counter() - t0
        # The same steps from the same weights and RNG state, eager: the losses must agree.
        result["losses"]["compiled"] = [first, *(train_step(compiled, optimizer, x, y)
                                                 for _ in range(cfg.check_steps - 1))]
        eager = copy.deepcopy(start)
        eager_optimizer = torch.optim.AdamW(eager.parameters(), lr=1e-3)
        torch.manual_seed(cfg.seed)
        result["losses"]["eager"] = [train_step(eager, eager_optimizer, x, y) for _ in range(cfg.check_steps)]
        for model, opt, name in ((eager, eager_optimizer, "eager"), (compiled, optimizer, "compiled")):
            result["steady_step_s"][name] = median_seconds(lambda: train_step(model, opt, x, y), repeat=cfg.repeat,
                                                           warmup=2)
    result["max_loss_diff"] = max(abs(a - b) for a, b in zip(*result["losses"].values()))
    return result


@contextlib.contextmanager
def recompile_log():
    """Collect Dynamo's "Recompiling ... triggered by ..." messages (torch._logging) instead of printing them."""
    messages, dynamo_logger = [], logging.getLogger("torch._dynamo")  # where set_logs puts its stderr handler

    class Collect(logging.Handler):
        def emit(self, record):
            if "recompiles" in record.name:
                messages.append(record.getMessage().splitlines()[-1].strip(" -"))

    torch._logging.set_logs(recompiles=True)
    saved, dynamo_logger.handlers = dynamo_logger.handlers, [Collect()]
    try:
        yield messages
    finally:
        dynamo_logger.handlers = saved
        torch._logging.set_logs()


def count_graphs(model, sizes, dynamic, x: torch.Tensor) -> dict:
    """Call `torch.compile(model, dynamic=dynamic)` on batches of these sizes; the graphs Dynamo compiled."""
    graphs = []

    def counting_backend(gm, example_inputs):
        symbolic = [n.name for n in gm.graph.nodes
                    if n.op == "placeholder" and isinstance(n.meta.get("example_value"), torch.SymInt)]
        graphs.append("symbolic batch" if symbolic else f"batch {len(example_inputs[0])}")
        return gm.forward  # run the captured graph as it is: no code generation, so this costs milliseconds

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=counting_backend, dynamic=dynamic)
    with recompile_log() as reasons:
        for n in sizes:
            compiled(x[torch.arange(n)])  # a fresh tensor per batch, as indexing a dataset gives
    return {"graphs": len(graphs), "compiled": graphs, "reasons": reasons}


def orig_mod_prefix(seed: int, hidden: int, x: torch.Tensor) -> dict:
    """A compiled module's state_dict: every key gains `_orig_mod.`; a plain model refuses it; the fix."""
    torch.manual_seed(seed)
    compiled = torch.compile(MLP(hidden=hidden), backend="eager")
    state = compiled.state_dict()
    try:
        MLP(hidden=hidden).load_state_dict(state)
        refused = ""
    except RuntimeError as exc:
        refused = " ".join(str(exc).split())[:140] + "..."
    fixed = MLP(hidden=hidden)
    fixed.load_state_dict(compiled._orig_mod.state_dict())  # the fix: save the module inside the wrapper
    fixed.eval(), compiled.eval()
    with torch.no_grad():
        same = torch.equal(fixed(x), compiled(x))
    return {"keys": list(state), "prefixed": sum(k.startswith("_orig_mod.") for k in state) / len(state),
            "plain_load_error": refused, "fixed_outputs_equal": same}


@dataclass
class Config:
    hidden: int = arg(512, "hidden units of Day 4's MLP", gt=0)
    batch_size: int = arg(256, "the optimised pipeline's batch size", gt=0)
    cold: bool = arg(True, "also compile into an empty cache first (what a fresh machine pays)")
    repeat: int = arg(20, "timed steps for the steady-state median", gt=0)
    check_steps: int = arg(3, "steps compared loss for loss, eager vs compiled", gt=0)
    seed: int = arg(0, "seed of the initial weights", ge=0)

    def __post_init__(self):
        validate(self)


def run_lab(cfg: Config, inductor: bool = True) -> dict:
    """Every figure of the lab; `inductor=False` leaves out part 1, the only one that builds code (a C++ compiler)."""
    images, labels = prepared(train=True)
    x, y = images[:cfg.batch_size], labels[:cfg.batch_size]
    torch.manual_seed(cfg.seed)
    model = MLP(hidden=cfg.hidden)
    result = {"machine": machine(), "torch": torch.__version__, "config": vars(cfg).copy(),
              "compile": compile_cost(cfg, x, y) if inductor else None, "sizes": list(SIZES),
              "recompiles": {name: count_graphs(model, sizes, dynamic, images)
                             for name, sizes, dynamic in (("dynamic=None (default)", SIZES, None),
                                                          ("dynamic=False", SIZES, False),
                                                          ("dynamic=True", SIZES, True),
                                                          ("drop_last=True", [n for n in SIZES if n == 256], None))},
              "orig_mod": orig_mod_prefix(cfg.seed, cfg.hidden, x)}
    torch._dynamo.reset()
    return result


def report(r: dict) -> str:
    c, cfg = r["compile"], r["config"]
    eager, compiled = c["steady_step_s"]["eager"], c["steady_step_s"]["compiled"]
    kinds = list(c["first_step_s"])
    lines = [f"Measured on {r['machine']}, torch {r['torch']}: Day 4's MLP (hidden {cfg['hidden']}), batch "
             f"{cfg['batch_size']}, AdamW; one step = forward + backward + optimizer step.", "",
             "| | eager | compiled |", "|---|---:|---:|",
             f"| steady-state step, median of {cfg['repeat']} (ms) | {1e3 * eager:.2f} | {1e3 * compiled:.2f} |"]
    lines += [f"| first step, {kind} (s) | | {c['first_step_s'][kind]:.2f} |" for kind in kinds]
    lines += ["", f"- compiled / eager steady-state step: x{compiled / eager:.2f}. Compiling ({kinds[0]}) took as long "
              f"as {c['first_step_s'][kinds[0]] / compiled:,.0f} compiled steps"
              + (f"; from the cache, {c['first_step_s'][kinds[1]] / compiled:,.0f}." if len(kinds) > 1 else "."),
              f"- losses of the first {cfg['check_steps']} steps, eager vs compiled (same weights, same dropout "
              f"masks): max |difference| {c['max_loss_diff']:.2g}.", "",
              f"Recompiles on the batch sizes {', '.join(map(str, r['sizes']))} (a counting backend; Dynamo's reason "
              "for each recompile):", "", "| torch.compile | graphs compiled | what they cover | why it recompiled |",
              "|---|---:|---|---|"]
    for name, g in r["recompiles"].items():
        lines.append(f"| {name} | {g['graphs']} | {', '.join(g['compiled'])} | {'; '.join(g['reasons']) or '-'} |")
    o = r["orig_mod"]
    lines += ["", f"`_orig_mod.`: {o['prefixed']:.0%} of the compiled module's state_dict keys carry the prefix "
              f"(e.g. `{o['keys'][0]}`). A plain MLP refuses them: `{o['plain_load_error']}`. Saving "
              "`compiled._orig_mod.state_dict()` instead loads, and gives identical outputs: "
              f"{o['fixed_outputs_equal']}."]
    return "\n".join(lines)


def main(argv=None) -> dict:
    cfg, out = parse(Config, argv, __doc__, out=runs_dir(__file__, "compile"))
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)  # no "No CUDA runtime" warning on CPUs
    if why := inductor_unavailable():
        raise UserError(f"torch.compile's inductor backend cannot build here ({why}); on Linux it needs a C++ "
                        "compiler (gcc or clang)")
    result = run_lab(cfg)
    text = report(result)
    print(text + "\n")
    write_results(out, "compile", text, result)
    return result


if __name__ == "__main__":
    run(main)
