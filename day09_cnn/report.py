"""Day 9's report: the comparison table, the generated "10-line conclusion", the plot, the state_dict notes
and the residual connection's gradient table (`results/residual.md`).

Every sentence of the conclusion is chosen by the measured figures, so it stays true when the ResNet wins, loses or
ties (a shorter run, another seed, another machine).
"""
import json
from pathlib import Path

from sprint import machine, markdown_table
from sprint.plots import save, subplots


SCHEDULE_NAMES = {"onecycle": "one-cycle", "linear": "linear-decay", "constant": "constant-LR"}


def times(a: float, b: float, more: str = "more", fewer: str = "fewer") -> str:
    """`a` relative to `b` as a ratio of at least 1: "2.4x fewer", "1.3x more" or "as many"."""
    if a == b:
        return "as many"
    return f"{max(a, b) / min(a, b):.1f}x {more if a > b else fewer}"


def epochs(n: int) -> str:
    return f"{n} epoch{'s' if n != 1 else ''}"


def conclusion(res: dict, mlp: dict, grads: dict) -> list[str]:
    """The curriculum's "10-line conclusion", written from the measured figures (nothing typed in advance)."""
    n_test, err_res, err_mlp = res["n_test"], res["test_errors"], mlp["test_errors"]
    outcome = "win" if err_res < err_mlp else "loss" if err_res > err_mlp else "tie"
    points = 100 * (res["test_acc"] - mlp["test_acc"])
    ep_res, ep_mlp = res["wall_s"] / res["epochs"], mlp["wall_s"] / mlp["epochs"]
    deep = grads["depths"].index(max(grads["depths"]))
    g_res, g_plain = min(grads["residual"][deep]), max(grads["plain"][deep])
    errors = {"win": f"{times(err_res, err_mlp)} errors for the CNN" if err_res else "no error at all for the CNN",
              "loss": f"{times(err_res, err_mlp)} errors for the CNN: the MLP wins this run",
              "tie": "the same number: a tie"}[outcome]
    val = ", ".join(f"{h['val_acc']:.2%}" for h in res["history"])
    cost = ("fewer parameters is not less compute: each conv weight works at every position"
            if ep_res > ep_mlp else "here the smaller model was also the cheaper one")
    bias = {"win": "Inductive bias beats width: locality and weight sharing are built into the convolution, while "
                   "the MLP must learn them from the data.",
            "loss": f"Width won this run ({-points:.2f} points): the convolution's built-in locality and weight "
                    f"sharing did not pay off in {epochs(res['epochs'])} on these images.",
            "tie": "Neither bias nor width decided this run: both made the same number of errors."}[outcome]
    verdict = {"win": "for images pick the architecture before the width",
               "loss": "this run favours the MLP; train the ResNet longer or on more images before concluding",
               "tie": "a tie on the test set"}[outcome]
    return [
        f"1. ResNet: {res['test_acc']:.2%} test accuracy with {res['params']:,} parameters, "
        f"{epochs(res['epochs'])} in {res['wall_s']:.0f} s.",
        f"2. MLP (Day 4): {mlp['test_acc']:.2%} with {mlp['params']:,} parameters, {epochs(mlp['epochs'])} in "
        f"{mlp['wall_s']:.0f} s.",
        f"3. On the {n_test:,} test images the ResNet gets {err_res} wrong, the MLP {err_mlp}: {errors}.",
        f"4. The ResNet has {times(res['params'], mlp['params'])} parameters: one 3x3 kernel is shared by every "
        f"position, where the MLP pays a weight per pixel per hidden unit.",
        f"5. A ResNet epoch took {ep_res:.1f} s vs {ep_mlp:.1f} s for the MLP "
        f"({times(ep_res, ep_mlp, 'longer', 'shorter')}); {cost}.",
        f"6. ResNet validation accuracy after each epoch: {val} ({res['n_val']:,} training images held out; the "
        f"schedule was chosen on them, the test set was scored once, at the end).",
        f"7. {bias}",
        f"8. BatchNorm plus a {SCHEDULE_NAMES[res['config']['schedule']]} schedule (peak LR {res['config']['lr']:g}, "
        f"SGD + Nesterov); "
        f"the whole ResNet run took {times(res['wall_s'], mlp['wall_s'], 'more', 'less')} wall time than the MLP's.",
        f"9. Residual connections: in a {grads['depths'][deep]}-layer Linear+ReLU stack the first layer's gradient "
        f"norm is >= {g_res:.1e} with the identity path, <= {g_plain:.1e} without ({len(grads['seeds'])} seeds).",
        f"10. Verdict: {verdict}: {times(res['params'], mlp['params'])} parameters, {points:+.2f} accuracy points, "
        f"{times(res['wall_s'], mlp['wall_s'], 'more', 'less')} training time for the ResNet.",
    ]


def comparison_table(res: dict, mlp: dict) -> str:
    lines = ["| model | test accuracy | test errors | parameters | epochs | wall time (s) | s / epoch |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in (("ResNet (this day)", res), ("MLP (Day 4 `train()`, default Config)", mlp)):
        lines.append(f"| {name} | {r['test_acc']:.2%} | {r['test_errors']} | {r['params']:,} | {r['epochs']} | "
                     f"{r['wall_s']:.1f} | {r['wall_s'] / r['epochs']:.1f} |")
    return "\n".join(lines)


def plot(res: dict, mlp: dict, grads: dict, path: Path) -> None:
    fig, (ax1, ax2) = subplots(1, 2, figsize=(11, 4))
    ax1.plot([h["elapsed_s"] for h in res["history"]], [100 * h["val_acc"] for h in res["history"]], "o-",
             label="ResNet, validation, per epoch")
    for name, r, marker in (("ResNet", res, "*"), ("MLP (Day 4)", mlp, "s")):
        ax1.plot([r["wall_s"]], [100 * r["test_acc"]], marker, ms=10,
                 label=f"{name}, test, end of training ({r['params']:,} params)")
    ax1.axhline(99, color="gray", ls="--", label="99% gate")
    ax1.set(title="MNIST accuracy vs wall time", xlabel="seconds since the start of training", ylabel="accuracy (%)")
    ax1.legend(fontsize=8)
    for name, key, marker in (("with residual", "residual", "o-"), ("plain stack", "plain", "s-")):
        median = [sorted(v)[len(v) // 2] for v in grads[key]]
        ax2.plot(grads["depths"], median, marker, label=name)
    ax2.set(yscale="log", title="first-layer gradient norm (median of seeds)", xlabel="depth (Linear+ReLU layers)",
            ylabel="||dL/dW1||")
    ax2.legend()
    save(fig, path)


def reconciliation_text(demo: dict) -> str:
    p, s, b = demo["prefixed"], demo["stripped"], demo["backbone_only"]
    return "\n".join([
        f"- strict load of a `module.`-prefixed state_dict: `{demo['strict_error']}`",
        f"- strict=False: {p['missing']} missing (e.g. {p['example_missing']}), {p['unexpected']} unexpected "
        f"(e.g. {p['example_unexpected']}); nothing was loaded",
        f"- after stripping `module.`: missing {s['missing']}, unexpected {s['unexpected']}; "
        f"max |logit difference| vs the source model = {s['max_logit_diff']:.1e}",
        f"- backbone only into a 5-class model (strict=False): missing {b['missing']}, unexpected {b['unexpected']}",
        f"- the full state_dict into the 5-class model, even with strict=False: `{demo['shape_error']}`",
    ])


def write_report(out: Path, result: dict, demo: dict) -> list[str]:
    """Print the table, the conclusion and the state_dict notes; write them with the plot and summary.json."""
    res, mlp, grads = result["resnet"], result["mlp"], result["residual"]
    table, lines = comparison_table(res, mlp), conclusion(res, mlp, grads)
    print("\n" + table + "\n\nConclusion (generated from the figures above):\n" + "\n".join(lines))
    print("\nstate_dict reconciliation:\n" + reconciliation_text(demo))
    out.mkdir(parents=True, exist_ok=True)
    plot(res, mlp, grads, out / "comparison.png")
    (out / "comparison.md").write_text(table + "\n\n" + "\n".join(lines) + "\n")
    (out / "state_dict.md").write_text(reconciliation_text(demo) + "\n")
    summary = {"machine": machine()}
    summary |= {name: {k: v for k, v in r.items() if k != "model"} for name, r in (("resnet", res), ("mlp", mlp))}
    summary |= {"residual": grads, "state_dict": demo}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "residual.md").write_text(residual_table(summary["residual"]))
    print(f"wrote {out}/comparison.png, comparison.md, state_dict.md, residual.md, summary.json")
    return lines


def residual_table(res: dict) -> str:
    """The first-layer gradient norm of the deepest plain and residual stacks, one row per seed (`residual.md`)."""
    depth, plain, resid = res["depths"][-1], res["plain"][-1], res["residual"][-1]
    rows = [[seed, f"{p:.1e}", f"{r:.1e}", f"{r / p:.1e}"] for seed, p, r in zip(res["seeds"], plain, resid)]
    return markdown_table(["seed", f"plain stack, depth {depth}: first-layer gradient norm", "residual stack",
                           "residual ÷ plain"], rows, "rrrr") + "\n"

