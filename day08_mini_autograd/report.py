"""Day 8's report: the experiments' answers in words, and what `main.py` writes: the plot, the summary file and its
tables (`results/summary.md`: the four self-check questions, then MNIST by epoch)."""
from sprint import machine, markdown_table, write_results
from sprint.plots import save, subplots


def print_experiments(r):
    print(f"(1) '=' instead of '+=': d(x*x)/dx at x={r['probe_x']:g} is {r['square_grad_overwrite']:g} instead of "
          f"{r['square_grad_correct']:g} (the second path overwrites the first);")
    print(f"    XOR final loss {r['xor_overwrite']['final_loss']:.4f} instead of {r['xor']['final_loss']:.4f}")
    print(f"(2) no gradient reset: gradients pile up step after step; XOR final loss "
          f"{r['xor_no_zero_grad']['final_loss']:.4f} (min along the way "
          f"{min(r['xor_no_zero_grad']['losses']):.4f}) instead of {r['xor']['final_loss']:.4f}")
    print(f"(3) no topological order: on the diamond y=(u+1)*(2u), u=x*x, dy/dx at x={r['probe_x']:g} is "
          f"{r['diamond_grad_no_topological']:g}; in topological order {r['diamond_grad_topological']:g} "
          f"(exact {r['diamond_grad_exact']:g})")
    print(f"(4) the same net in torch: every gradient within rtol + atol of torch's, the worst using "
          f"{r['torch_grad_tolerance_used_init']:.1e} of its tolerance at the start and "
          f"{r['torch_grad_tolerance_used_trained']:.1e} after training")


def plot(experiments, mnist, path):
    fig, (ax1, ax2) = subplots(1, 2, figsize=(11, 4))
    for key, label in [("xor", "correct"), ("xor_overwrite", "(1) '=' instead of '+='"),
                       ("xor_no_zero_grad", "(2) no gradient reset")]:
        ax1.semilogy(experiments[key]["losses"], label=label)
    ax1.axhline(0.01, color="gray", ls="--", label="gate: 0.01")
    ax1.set(title="XOR, 2-2-1 tanh net, scalar engine", xlabel="step", ylabel="MSE (log scale)")
    ax1.legend()
    epochs = [h["epoch"] for h in mnist["history"]]
    ax2.plot(epochs, [100 * h["test_acc"] for h in mnist["history"]], "o-")
    ax2.axhline(97, color="gray", ls="--", label="gate: 97%")
    ax2.set(title=f"MNIST, 784-{mnist['hidden']}-10 MLP, NumPy Tensor engine", xlabel="epoch",
            ylabel="test accuracy (%)", xticks=epochs)
    ax2.legend()
    save(fig, path)


def write_day(out, experiments, mnist):
    """`day08.png` and `summary.json` (every figure of the README's Day 8 tables, with the machine that ran them) with
    those tables (`summary.md`)."""
    out.mkdir(parents=True, exist_ok=True)
    plot(experiments, mnist, out / "day08.png")
    summary = {"machine": machine()} | {k: v for k, v in experiments.items() if not isinstance(v, dict)}
    summary |= {f"{k}_final_loss": experiments[k]["final_loss"] for k in ("xor", "xor_overwrite", "xor_no_zero_grad")}
    summary["xor_no_zero_grad_min_loss"] = min(experiments["xor_no_zero_grad"]["losses"])
    summary["mnist"] = mnist
    print(f"wrote {out / 'day08.png'}")
    write_results(out, "summary", f"{xor_table(summary)}\n\n{mnist_table(summary)}", summary)


def xor_table(d: dict) -> str:
    """The four self-check questions, from the summary."""
    x = f"{d['probe_x']:.0f}"
    return markdown_table(["question", "experiment", "measured", "gate"], [
        ["—", "correct engine: XOR final MSE", f"**{d['xor_final_loss']:.5f}**", "< 0.01"],
        ["(1) `=` instead of `+=`", f"d(x·x)/dx at x = {x}",
         f"**{d['square_grad_overwrite']:.0f}** instead of {d['square_grad_exact']:.0f}: the second path overwrites "
         "the first", "gap > 10%"],
        ["", "XOR final MSE",
         f"**{d['xor_overwrite_final_loss']:.3f}**: each weight keeps only its last contribution", "> 0.1"],
        ["(2) no gradient reset", "XOR final MSE", f"**{d['xor_no_zero_grad_final_loss']:.3f}**, never below "
         f"{d['xor_no_zero_grad_min_loss']:.3f}: every step replays all past gradients", "> 0.1"],
        ["(3) no topological order", f"diamond `y = (u+1)·(2u)`, `u = x·x`, dy/dx at x = {x}",
         f"**{d['diamond_grad_no_topological']:.0f}** instead of {d['diamond_grad_exact']:.0f}: `u` passed its "
         "gradient on before its second consumer added to it", "gap > 10%"],
        ["(4) same net in PyTorch", "worst gradient error vs `torch.autograd`, float64, as a share of its tolerance",
         f"**{d['torch_grad_tolerance_used_init']:.1e}** at the start, "
         f"**{d['torch_grad_tolerance_used_trained']:.1e}** after training", "≤ 1"],
    ])


def mnist_table(d: dict) -> str:
    """MNIST, one row per epoch of the summary's `mnist.history`."""
    history = d["mnist"]["history"]
    return markdown_table(["epoch", "train loss", "test accuracy"],
                          [[r["epoch"], f"{r['train_loss']:.3f}", f"{r['test_acc']:.2%}"] for r in history])
