"""Day 9's report: the comparison table, the generated "10-line conclusion", the plot and the state_dict notes."""
from pathlib import Path


def first_reach(history: list[dict], target: float):
    """(epoch, seconds) of the first evaluation at or above `target`, or None."""
    return next(((r["epoch"], r["elapsed_s"]) for r in history if r["test_acc"] >= target), None)


def epochs(run: dict) -> str:
    n = len(run["history"])
    return f"{n} epoch{'s' if n != 1 else ''}"


def conclusion(res: dict, mlp: dict, grads: dict) -> list[str]:
    """The curriculum's "10-line conclusion", written from the measured figures (nothing typed in advance)."""
    n_test = res["n_test"]
    err_res, err_mlp = round((1 - res["test_acc"]) * n_test), round((1 - mlp["test_acc"]) * n_test)
    p_ratio = mlp["params"] / res["params"]
    t_ratio = res["wall_s"] / mlp["wall_s"]
    ep_res, ep_mlp = res["wall_s"] / len(res["history"]), mlp["wall_s"] / len(mlp["history"])
    reach = first_reach(res["history"], mlp["test_acc"])
    deep = grads["depths"].index(max(grads["depths"]))
    g_res = min(grads["residual"][deep])
    g_plain = max(grads["plain"][deep])
    better = res["test_acc"] > mlp["test_acc"]
    cost = ("fewer parameters is not less compute, each conv weight works at every position" if ep_res > ep_mlp
            else "here the smaller model was also the cheaper one")
    return [
        f"1. ResNet: {res['test_acc']:.2%} test accuracy with {res['params']:,} parameters, "
        f"{epochs(res)} in {res['wall_s']:.0f} s.",
        f"2. MLP (Day 4): {mlp['test_acc']:.2%} with {mlp['params']:,} parameters, {epochs(mlp)} in "
        f"{mlp['wall_s']:.0f} s.",
        f"3. On the {n_test:,} test images the ResNet gets {err_res} wrong, the MLP {err_mlp}: "
        f"{err_mlp / max(err_res, 1):.1f}x {'fewer' if err_res <= err_mlp else 'more'} errors for the CNN.",
        f"4. It does so with {p_ratio:.1f}x {'fewer' if p_ratio >= 1 else 'more'} parameters: one 3x3 kernel is "
        f"shared by every position, where the MLP pays a weight per pixel per hidden unit.",
        f"5. A ResNet epoch took {ep_res:.1f} s vs {ep_mlp:.1f} s for the MLP ({ep_res / ep_mlp:.1f}x); "
        f"{cost}.",
        f"6. After one epoch: ResNet {res['history'][0]['test_acc']:.2%}, MLP {mlp['history'][0]['test_acc']:.2%}; "
        + (f"the ResNet passed the MLP's final accuracy at epoch {reach[0]} ({reach[1]:.0f} s)." if reach else
           "the ResNet never reached the MLP's final accuracy."),
        f"7. {'Inductive bias beats width' if better else 'Here width won'}: locality and weight sharing are "
        f"built into the convolution, while the MLP must learn them from {mlp['n_train']:,} images.",
        f"8. BatchNorm plus a one-cycle schedule (peak LR {res['config']['lr']:g}, SGD + Nesterov) got the CNN "
        f"there in {epochs(res)}; the whole run cost {t_ratio:.1f}x the MLP's wall time.",
        f"9. Residual connections: in a {grads['depths'][deep]}-layer Linear+ReLU stack the first layer's gradient "
        f"norm is >= {g_res:.1e} with the identity path, <= {g_plain:.1e} without ({len(grads['seeds'])} seeds).",
        f"10. Verdict: {'for images pick the architecture before the width' if better else 'this run favours the MLP'}"
        f": {p_ratio:.0f}x fewer parameters, {100 * (res['test_acc'] - mlp['test_acc']):+.2f} accuracy points, "
        f"{t_ratio:.1f}x the training time.",
    ]


def comparison_table(res: dict, mlp: dict) -> str:
    lines = ["| model | test accuracy | parameters | epochs | wall time (s) | s / epoch |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, r in (("ResNet (this day)", res), ("MLP (Day 4 `train()`, default Config)", mlp)):
        n = len(r["history"])
        lines.append(f"| {name} | {r['test_acc']:.2%} | {r['params']:,} | {n} | {r['wall_s']:.1f} | "
                     f"{r['wall_s'] / n:.1f} |")
    return "\n".join(lines)


def plot(res: dict, mlp: dict, grads: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, r, marker in (("ResNet", res, "o-"), ("MLP (Day 4)", mlp, "s-")):
        ax1.plot([h["elapsed_s"] for h in r["history"]], [100 * h["test_acc"] for h in r["history"]], marker,
                 label=f"{name}, {r['params']:,} params")
    ax1.axhline(99, color="gray", ls="--", label="99% gate")
    ax1.set(title="MNIST test accuracy vs wall time", xlabel="seconds since start", ylabel="accuracy (%)")
    ax1.legend()
    for name, key, marker in (("with residual", "residual", "o-"), ("plain stack", "plain", "s-")):
        median = [sorted(v)[len(v) // 2] for v in grads[key]]
        ax2.plot(grads["depths"], median, marker, label=name)
    ax2.set(yscale="log", title="first-layer gradient norm (median of seeds)", xlabel="depth (Linear+ReLU layers)",
            ylabel="||dL/dW1||")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


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
