"""The doctor's checks: each runs one tool of the kit on a `Case` and returns findings (troubleshoot/checklists.py).

A check never stops the diagnosis: a model broken enough to make a check fail is reported as a finding of that
check. `diagnose` runs a symptom's checks cheapest first and prints each finding as it comes.
"""
import contextlib
import functools
import io
import itertools
import math
import tempfile
import time
from pathlib import Path

import torch

from .. import config, data, memory, runlog, text, train
from . import lr_range
from .case import Case
from .checklists import Finding, markdown_cell, plan
from .data_checks import check_data
from .gradients import EXPLODE_RATIO, EXPLODE_TOTAL, VANISH_RATIO, gradient_norms
from .lr_range import lr_range_test
from .nonfinite import NonFinite, backward_nan_op, first_nonfinite_module
from .overfit import overfit_one_batch
from .speed import HostSyncs, data_vs_step
from .text_checks import MAX_WORDS, MIN_WORDS, TextCheck, text_hygiene

SHORT_RUN = 30  # optimizer steps of the short run


def steps_total(case: Case) -> int:
    t = case.cfg.train
    return t.steps or t.epochs * (len(case.splits.train) // t.batch_size)


# -- the checks: each returns findings ------------------------------------------------------------------------------
def check_config(case: Case) -> list[Finding]:
    o, t, d = case.cfg.optim, case.cfg.train, case.cfg.data
    fp16 = t.amp and t.amp_dtype == "float16"
    out = [Finding("config", "note" if fp16 else "ok", "precision: " + (f"autocast {t.amp_dtype}" if t.amp else "fp32")
                   + (" with a GradScaler" if fp16 else ""), ["nan-4"],
                   "fp16 overflows above 65504: prefer train.amp_dtype=bfloat16 (fp32's range) where the GPU has it")]
    steps, warm = steps_total(case), int(steps_total(case) * o.warmup_ratio)
    out.append(Finding("config", "ok" if o.grad_clip and warm else "note",
                       f"optim.grad_clip={o.grad_clip:g}, warmup {warm:,} of {steps:,} steps, peak lr {o.lr:g}",
                       ["nan-1", "grad-1"], "keep optim.grad_clip on (1.0) and a warmup (optim.warmup_ratio 0.05-0.2): "
                       "AdamW's first steps on random weights are the unstable ones"))
    model = case.model()
    optimizer = case.optimizer(model)
    given = {id(p) for g in optimizer.param_groups for p in g["params"]}
    trainable = [p for p in model.parameters() if p.requires_grad]
    left_out = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in given]
    rate = train.warmup_cosine(optimizer, steps, o).lr_lambdas[0]
    zero = [s + 1 for s in range(steps - 1) if rate(s) <= 0]  # the last step may reach 0
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    out.append(Finding("config", "PROBLEM" if left_out or zero or not trainable else "ok",
                       f"{sum(p.numel() for p in trainable):,} trainable parameters ({frozen:,} frozen), "
                       + (f"not in the optimizer: {left_out}" if left_out else "all in the optimizer")
                       + (f"; the schedule's rate is 0 at steps {zero[:3]}..." if zero else
                          "; the schedule's rate stays above 0 until the last step"), ["loss-7"],
                       "hand every trainable parameter to the optimizer (optimizers.build) and keep the rate above 0; "
                       "a model with nothing trainable cannot learn (requires_grad_(False) everywhere?)"))
    files = isinstance(getattr(case.splits.train, "inner", case.splits.train), data.ImageFolderData)  # under a break
    issues = [w for w, bad in [
        ("image files decoded in the main process: set data.num_workers=4-8", files and not d.num_workers),
        ("data.pin_memory=false: copies to the GPU cannot overlap compute", not d.pin_memory),
        (f"{case.micro} samples per forward: too few to fill a GPU (raise train.batch_size)", case.micro < 32),
        ("train.amp=false: on a GPU, bf16 autocast is several times faster (tensor cores)", not t.amp),
        (f"train.log_every={t.log_every}: each record costs a host sync", t.log_every < 10)] if bad]
    out.append(Finding("config", "note" if issues else "ok",
                       f"data.num_workers={d.num_workers} ({'image files' if files else 'in memory: none needed'}"
                       f"), pin_memory={str(d.pin_memory).lower()}, {case.micro} per forward, amp "
                       f"{'on' if t.amp else 'off'}, log every {t.log_every} steps; workers persist between epochs",
                       ["gpu-1", "gpu-2", "gpu-5", "gpu-9", "gpu-10"], "; ".join(issues)))
    return out


DATA_ITEMS = {"nonfinite": ("nan-5", "find where they are made (a division by zero in a normalisation, a corrupt "
                            "file); assert torch.isfinite(x).all() where the data is built"),
              "labels": ("loss-2", "check the labels: every class present, in range; weigh the loss "
                         "(F.cross_entropy(weight=...)) or resample a rare class"),
              "normalisation": ("loss-8", "normalise inputs to mean 0, std 1 with the training set's statistics, "
                                "and the same transform for val/test"),
              "leak": ("loss-9", "remove the duplicates from the training split (dedupe by hash) before trusting "
                       "validation or test figures")}


def check_splits(case: Case) -> list[Finding]:
    """The data check: images sample by sample, text document by document."""
    if case.task.name == "classify":
        return check_image_data(case)
    return check_text_data(case)


def check_image_data(case: Case) -> list[Finding]:
    limit = 20_000 if case.cfg.data.dataset == "imagefolder" else None
    report = check_data(case.splits, case.splits.info.num_classes, limit)
    problems = report.problems()
    s = report.splits
    measured = {
        "nonfinite": f"{sum(v.nonfinite for v in s.values()):,} NaN/Inf input values in "
                     f"{sum(v.n for v in s.values()):,} samples" + (f" (first {limit:,} per split)" if limit else ""),
        "labels": "; ".join(f"{k} {v.n:,}: {min(v.counts):,}-{max(v.counts):,} per class, imbalance "
                            f"{v.imbalance:.2f}x" for k, v in s.items()),
        "normalisation": "inputs mean/std: " + ", ".join(f"{k} {v.mean:.3f}/{v.std:.3f}" for k, v in s.items()),
        "leak": "exact duplicates: " + ", ".join(f"{k} {v:,}" for k, v in report.duplicates.items())}
    out = []
    for kind, (item, fix) in DATA_ITEMS.items():
        found = [line for k, line in problems if k == kind]
        out.append(Finding("data", "PROBLEM" if found else "ok", "; ".join(found) or measured[kind], [item], fix,
                           {"measured": measured[kind]}))
    return out


TEXT_ITEMS = {  # kind of text check -> (the checklist items it answers, the fix)
    "utf8": (["data-5"], "decode with the encoding the file really has (often cp1252 or latin-1) and write UTF-8: "
                         "a byte-level model learns the stray bytes as text"),
    "markup": (["data-3"], "extract the text properly: unescape the entities (html.unescape) and strip the tags with "
                           "an HTML parser, where the text is made"),
    "control": (["data-3"], "delete them where the text is made (text_checks.CONTROL.sub(b'', raw), C1 included): "
                            "invisible bytes the model would learn as text"),
    "length": (["data-4"], f"drop documents under {MIN_WORDS} words (stubs, titles, error pages); look at those over "
                           f"{MAX_WORDS:,} (documents run together?)"),
    "exact": (["data-1"], "keep one copy of each (dedupe by hash): a copy weighs double in training, and a copy "
                          "across splits is a leak (remove it from train)"),
    "near": (["data-2"], "keep one document of each pair (across splits: remove the training one): a near copy is "
                         "memorised like an exact one"),
    "lines": (["data-1"], "strip the boilerplate lines (headers, footers, licences) before tokenising: the model "
                          "learns to repeat them"),
    "tokens": (["data-6"], ""),
    "leak": (["loss-9"], "remove the shared passages from train (or hold their documents out): a model evaluated on "
                         "text it trained on is measured on memory"),
}


@functools.lru_cache(maxsize=2)
def corpus_hygiene(folder: Path) -> list[TextCheck]:
    """The text checks of a corpus folder's splits, once per process and folder (as text.load_corpus reads it)."""
    return text_hygiene(text.split_works(folder))


def check_text_data(case: Case) -> list[Finding]:
    if case.cfg.data.dataset != "shakespeare":
        return [Finding("data", "not measured", f"{case.cfg.data.dataset}: token files hold ids, not the text and its "
                        "document boundaries; prepare.py prints this report when it makes token files from text files "
                        "(or run troubleshoot.text_checks.text_hygiene on the documents before tokenising)",
                        list(dict.fromkeys(item for items, _ in TEXT_ITEMS.values() for item in items)))]
    folder = text.corpus_folder(case.cfg.data.root)
    found = [Finding("data", c.status, c.text, *TEXT_ITEMS[c.kind], {"kind": c.kind, **c.figures})
             for c in corpus_hygiene(folder)]
    counts = ", ".join(f"{len(works)} {split}" for split, works in text.split_works(folder).items())
    name = "the bundled Shakespeare (data/shakespeare)" if folder == text.BUNDLE else str(folder)
    write_text_report(found, case.out / "text_data.md", f"Text hygiene of {name}: one document per work ({counts})")
    return found


def write_text_report(findings: list[Finding], path: Path, title: str) -> None:
    """The text checks as a Markdown table (HTML in the text escaped, so that `&egrave;` shows as written)."""
    rows = [title + ".", "", "| check | status | item | measured |", "|---|---|---|---|"]
    for f in findings:
        rows.append(f"| {f.figures['kind']} | {f.status} | {', '.join(f.items)} | {markdown_cell(f.text)} |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(rows) + "\n")


def check_forward(case: Case) -> list[Finding]:
    model = case.model()
    batches = list(itertools.islice(case.batches(), 4))
    where = first_nonfinite_module(model, batches, case.autocast)
    out = [Finding("forward", "PROBLEM" if where else "ok",
                   f"first module with a non-finite output: {where}" if where else
                   f"every module's output is finite on {len(batches)} batches of {case.micro}",
                   ["nan-2", "nan-3", "nan-4"], f"look at what {where} computes: log/sqrt/division need an eps or a "
                   "clamp, exp needs the max subtracted (use F.log_softmax / F.cross_entropy), fp16 tops out at "
                   "65504 (use bfloat16)")]
    with torch.no_grad(), case.autocast():
        logits = model(batches[0][0]).float()
    if not torch.isfinite(logits).all():
        return out
    sums = logits.sum(-1)
    probs = bool((logits >= 0).all()) and torch.allclose(sums, torch.ones_like(sums), atol=1e-3)
    out.append(Finding("forward", "PROBLEM" if probs else "ok", "the outputs are probabilities (non-negative, rows "
                       "sum to 1)" if probs else "the outputs are logits (not softmax probabilities)", ["loss-4"],
                       "return logits: drop the final softmax, F.cross_entropy applies log_softmax itself"))
    if case.weights is None:
        loss0, uniform = case.task.loss(logits, batches[0][1]).item(), math.log(case.task.classes)
        out.append(Finding("forward", "ok" if loss0 < 2 * uniform else "PROBLEM",
                           f"first loss {loss0:.3f} vs ln({case.task.classes}) = {uniform:.3f} "
                           f"(a uniform guess)", ["loss-6"], "initial weights too large: the logits start far from "
                           "uniform (a smaller init std, or a normalisation layer)", {"loss": loss0}))
    return out


def check_gradients(case: Case) -> list[Finding]:
    report = gradient_norms(case.model(), next(case.batches()), case.task.loss, case.autocast)
    norms, median = {k: v for k, v in report.norms.items() if math.isfinite(v)}, report.median
    top = max(norms, key=norms.get) if norms else None
    big = [f"{n} {report.norms[n]:.2g} ({report.norms[n] / median:.0f}x)" for n in report.exploding]
    exploding = bool(big) or report.total > EXPLODE_TOTAL
    low = min(norms, key=norms.get) if norms else None
    return [
        Finding("gradients", "PROBLEM" if exploding else "ok",
                (f"exploding: {', '.join(big) or 'every layer'}; median layer {median:.2g}, global norm "
                 f"{report.total:.3g}" if exploding else
                 f"global norm {report.total:.3g} over {len(norms)} layers; largest {top} {norms.get(top, 0):.2g}, "
                 f"median {median:.2g} (none above {EXPLODE_RATIO:.0f}x the median)"), ["grad-1"],
                "lower optim.lr and keep optim.grad_clip on; in the named layer look for a missing normalisation, "
                "a scaled loss or a custom backward", {"norms": report.norms, "total": report.total}),
        Finding("gradients", "PROBLEM" if report.no_gradient or report.vanishing else "ok",
                "; ".join(filter(None, [
                    report.no_gradient and f"no gradient reaches: {', '.join(report.no_gradient)}",
                    report.vanishing and f"vanishing (below 1/{1 / VANISH_RATIO:.0f} of the median layer "
                                         f"{median:.2g}): {', '.join(report.vanishing)}"]))
                or f"every layer gets a gradient (smallest: {low} {norms.get(low, 0):.2g}, median {median:.2g})",
                ["loss-3", "grad-2"], "a .detach(), torch.no_grad() or a NumPy round trip in forward cuts the graph; "
                "requires_grad_(False) freezes; a layer the loss does not use gets nothing" if report.no_gradient else
                "vanishing: add residual connections or normalisation, check the activations (saturated sigmoid/tanh)"
                ),
        Finding("gradients", "PROBLEM" if report.nonfinite else "ok",
                f"NaN/inf gradients in: {', '.join(report.nonfinite)}" if report.nonfinite else
                "every gradient is finite", ["nan-6"], "the anomaly check names the backward op that made them")]


def check_anomaly(case: Case) -> list[Finding]:
    found = backward_nan_op(case.model(), list(itertools.islice(case.batches(), 2)), case.task.loss, case.autocast)
    return [Finding("anomaly", "PROBLEM" if found else "ok",
                    f"NaN first produced in backward by {found}" if found else
                    "no backward op produced a NaN on 2 batches (anomaly mode checks NaN, not inf)", ["nan-2", "nan-6"],
                    f"`{found.op if found else ''}` got an input where its derivative is not finite (0 or below for "
                    "sqrt/log, a zero denominator), even if torch.where hid the forward value: clamp the input "
                    "(x.clamp_min(1e-12).sqrt()). If the forward check named a module, the NaN began there")]


def check_overfit(case: Case) -> list[Finding]:
    """Memorising 8 samples is a test of the code, so dropout is off: it fights memorisation by design
    (the shipped shakespeare_gpu config's 0.2 holds 8 windows above loss 1 for 200 steps)."""
    model = case.model(dropout=False)
    r = overfit_one_batch(model, case.optimizer(model), next(case.batches(8)), loss_fn=case.task.loss,
                          autocast=case.autocast)
    if r.error:
        text, fix = f"cannot train: {r.error}", "make the loss depend on the weights (requires_grad, no detach)"
    elif r.unchanged:
        text = (f"{'memorised' if r.memorised else 'not memorised'} in {r.steps} steps, but these layers never "
                f"changed: {', '.join(r.unchanged)}")
        fix = ("no gradient reaches them (a .detach() in forward) or the optimizer does not update them: "
               "learning rate 0, parameters not handed to the optimizer")
    else:
        text = (f"{'memorised' if r.memorised else 'NOT memorised'} 8 samples: loss {r.first_loss:.3f} -> "
                f"{r.last_loss:.4f} in {r.steps} steps" + dropout_note(case))
        fix = ("a bug between inputs, labels and loss (print a few (x, y) pairs), or the lr: try 10x lower and "
               "higher")
    return [Finding("overfit", "PROBLEM" if r.flagged else "ok", text, ["loss-1", "loss-3", "loss-7"], fix,
                    {"steps": r.steps, "first_loss": r.first_loss, "last_loss": r.last_loss})]


def dropout_note(case: Case) -> str:
    dropout = getattr(getattr(case.cfg.model, case.cfg.model.name), "dropout", 0)
    return f" (dropout off for this check; the config's is {dropout:g})" if dropout else ""


def check_data_vs_step(case: Case) -> list[Finding]:
    cfg, device = case.cfg, case.device
    model = case.model()
    optimizer = case.optimizer(model)
    pin = cfg.data.pin_memory and device.type == "cuda"
    sampler = data.ResumableSampler(len(case.splits.train), case.micro, case.micro, 0, 1, cfg.run.seed)
    batches = itertools.chain.from_iterable(itertools.repeat(data.loader(case.splits.train, sampler,
                                                                         cfg.data.num_workers, pin)))

    def next_batch():
        x, y = next(batches)
        return x.to(device, non_blocking=pin), y.to(device, non_blocking=pin)

    def step(batch):
        with case.autocast():
            loss = case.task.loss(model(batch[0]), batch[1])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip or math.inf)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    r = data_vs_step(next_batch, step, device)
    rate = case.micro / r["data_s"]
    text = (f"data {1e3 * r['data_s']:.2f} ms vs step {1e3 * r['step_s']:.2f} ms per batch of {case.micro} "
            f"(data.num_workers={cfg.data.num_workers}): {100 * r['ratio']:.1f}% -> {r['band']}; the loader alone "
            f"delivers {rate:,.0f} samples/s")
    if device.type == "cpu":
        text += (" (the CPU is the device here: a GPU step is many times faster, so the same loader takes a larger "
                 f"share; a GPU needing more than {rate:,.0f} samples/s would wait for data)")
    status = {"compute-bound": "ok", "mostly compute-bound": "note", "data-bound": "PROBLEM"}[r["band"]]
    return [Finding("data_vs_step", status, text, ["gpu-1", "gpu-3", "gpu-4"],
                    "more data.num_workers (4-8), pin_memory, lighter CPU augmentation (or on the GPU), in-memory "
                    "tensors or a faster storage format", r)]


def short_run(case: Case, lr: float, syncs: HostSyncs | None = None) -> tuple[list[dict], str | None]:
    """The first SHORT_RUN optimizer steps of train.py (its own loop, eager: counting host syncs under
    torch.compile would trace the counter) in a temporary folder: (train records, the NaN message or None)."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = config.build({**config.flatten(config.to_dict(case.cfg)), "run.out_dir": tmp, "optim.lr": lr,
                            "train.max_steps": SHORT_RUN, "train.log_every": 1, "train.progress": "off",
                            "checkpoint.every_steps": 0, "checkpoint.resume": "", "model.compile": False,
                            "checkpoint.init_from": str(case.weights.resolve()) if case.weights else ""})
        error = None
        with contextlib.redirect_stdout(io.StringIO()), syncs or contextlib.nullcontext():
            try:
                train.run(cfg, [case.faults])
            except NonFinite as exc:
                error = str(exc).split(". That step")[0]
        return [r for r in runlog.read_metrics(tmp) if r["kind"] == "train"], error


def check_short_run(case: Case) -> list[Finding]:
    lr, clip = case.cfg.optim.lr, case.cfg.optim.grad_clip
    syncs = HostSyncs(case.device)
    records, error = short_run(case, lr, syncs)
    out = []
    if error:
        _, again = short_run(case, lr / 10)
        verdict = ("at lr / 10 it is finite: the learning rate is too high" if not again else
                   "at lr / 10 as well: not the learning rate, see the data and module findings")
        out.append(Finding("short_run", "PROBLEM", f"{error}; {verdict}", ["nan-1"],
                           f"--set optim.lr={lr / 10:g}" if not again else "follow the other NaN findings"))
    else:
        out.append(Finding("short_run", "ok", f"the first {len(records)} steps of train.py stay finite "
                           f"(lr up to {max(r['lr'] for r in records):.2g})", ["nan-1"]))
    if len(records) >= 10:
        first = sum(r["loss"] for r in records[:5]) / 5
        last = sum(r["loss"] for r in records[-5:]) / 5
        out.append(Finding("short_run", "ok" if last < 0.95 * first else "PROBLEM",
                           f"loss {first:.3f} -> {last:.3f} (means of the first and last 5 of {len(records)} steps; "
                           f"the schedule took lr from {records[0]['lr']:.2g} to {records[-1]['lr']:.2g})", ["loss-5"],
                           "the loss does not fall: check the overfit and LR range findings", {"losses": [
                               r["loss"] for r in records]}))
        norms = [r["grad_norm"] for r in records]
        clipped = sum(n > clip for n in norms) / len(norms) if clip else 0.0
        status = "PROBLEM" if max(norms) > EXPLODE_TOTAL else "note" if clipped >= 0.9 else "ok"
        out.append(Finding("short_run", status, f"gradient norm {norms[0]:.3g} at step 1, max {max(norms):.3g}, "
                           f"last {norms[-1]:.3g}; above optim.grad_clip={clip:g} at {100 * clipped:.0f}% of steps",
                           ["grad-1", "grad-3"], "norms above 1e3 explode: lower optim.lr, keep clipping on" if
                           status == "PROBLEM" else "clipped at nearly every step, the run is speed-limited; the first "
                           "steps often are: if grad_norm in metrics.jsonl stays above the clip later on, lower the lr "
                           "or raise optim.grad_clip", {"grad_norms": norms}))
    accum = case.cfg.train.grad_accum
    typical, mean = syncs.per_step(accum)
    sites = ", ".join(f"{s} x{k:.2g}" for s, k in syncs.sites(accum).items()) or "none"
    scope = "GPU tensors" if case.device.type == "cuda" else "every tensor (on a CPU: an upper bound)"
    out.append(Finding("short_run", "PROBLEM" if typical > 1 else "ok",
                       f"{typical:g} host sync(s) in a typical optimizer step, {mean:.2f} on average with logging, "
                       f"evaluation and checkpoints (per step: {sites}; counted on {scope})", ["gpu-7"],
                       "keep .item()/.cpu()/.tolist()/print(tensor) out of the step: accumulate on the device and read "
                       "once per log_every steps", {"typical": typical, "mean": mean, "sites": syncs.sites(accum)}))
    return out


def check_lr_range(case: Case) -> list[Finding]:
    model = case.model()
    r = lr_range_test(model, case.optimizer(model), case.batches(), loss_fn=case.task.loss, autocast=case.autocast)
    files = lr_range.save(r, case.out, case.cfg.optim.lr)
    lr = case.cfg.optim.lr
    status = "PROBLEM" if lr >= r.best_lr else "note" if lr < r.suggestion / 30 else "ok"
    return [Finding("lr_range", status, f"suggested lr {r.suggestion:.2g} (lowest loss at {r.best_lr:.2g}, steepest "
                    f"fall at {r.steepest_lr:.2g}" + (f", diverged at {r.diverged_at:.2g}" if r.diverged_at else "")
                    + f"); optim.lr {lr:g} is {lr / r.suggestion:.2g}x the suggestion"
                    + ("" if lr >= r.suggestion else " (before raising it, compare both in two short runs: a sweep of "
                       "100 steps from fresh weights favours high rates)") + f"; plot: {files[-1]}",
                    ["nan-1", "loss-5", "grad-1"], f"--set optim.lr={r.suggestion:.2g} (at or past the valley "
                    "bottom the loss oscillates or diverges; far below it, it barely moves)",
                    {"suggestion": r.suggestion, "best_lr": r.best_lr, "steepest_lr": r.steepest_lr})]


def check_gpu_only(case: Case) -> list[Finding]:
    items = ["gpu-6", "gpu-8", "gpu-11", "gpu-12"]
    if case.device.type != "cuda":
        return [Finding("gpu_only", "not measured", "no GPU here: GPU utilisation, the host-to-device copies (and "
                        "what pin_memory saves), kernel-launch and Python overhead of a small model, memory near "
                        "the limit and other processes on the GPU can only be measured on one", items,
                        "on the GPU machine: rerun this doctor, watch `nvidia-smi` (utilisation, memory, other "
                        "processes) and trace a few steps with --set profile.enabled=true")]
    free, total = torch.cuda.mem_get_info(case.device)
    outside = total - free - torch.cuda.memory_reserved(case.device)  # this process's CUDA context included
    others = max(0.0, outside / 2**30 - memory.CONTEXT_GIB)
    peak = torch.cuda.max_memory_allocated(case.device) / total
    return [Finding("gpu_only", "note" if peak > 0.9 or others > 1 else "ok",
                    f"peak memory {100 * peak:.0f}% of {total / 2**30:.0f} GiB; in use outside this process's "
                    f"tensors: {outside / 2**30:.1f} GiB, of which this process's CUDA context takes about "
                    f"{memory.CONTEXT_GIB} GiB, so other processes hold about {others:.1f} GiB; utilisation: watch "
                    "`nvidia-smi` during a real run", items,
                    "near the limit the allocator churns: a smaller micro-batch + train.grad_accum; free the GPU of "
                    "other jobs")]


RUN = {"config": check_config, "data": check_splits, "forward": check_forward, "gradients": check_gradients,
       "anomaly": check_anomaly, "overfit": check_overfit, "data_vs_step": check_data_vs_step,
       "short_run": check_short_run, "lr_range": check_lr_range, "gpu_only": check_gpu_only}


def diagnose(case: Case, symptom: str, say=print) -> tuple[list[Finding], dict[str, float]]:
    """Run `symptom`'s checks cheapest first; print each finding that concerns it as it comes. Returns the findings
    and the seconds each check took."""
    findings, seconds = [], {}
    for name in plan(symptom):
        t0 = time.perf_counter()
        try:
            found = RUN[name](case)
        except (RuntimeError, ValueError) as exc:  # a broken model can break a check: that is a finding too
            found = [Finding(name, "PROBLEM", f"the check could not run: {' '.join(str(exc).split())[:300]}",
                             [], "the model or the data is broken: see the findings above")]
        seconds[name] = time.perf_counter() - t0
        for f in found:
            if f.concerns(symptom):
                findings.append(f)
                say(f.render(len(findings)))
    return findings, seconds
