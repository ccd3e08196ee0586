"""Day 3's table (`results/summary.md`, which the README includes): the fit against its gates."""
from sprint import markdown_table


def fit_table(summary: dict) -> str:
    rows = [["final MSE", f"{summary['mse']:.2e}", "< 1e-4"],
            ["w", f"{summary['w']:.5f}", "within 0.01 of 3"],
            ["b", f"{summary['b']:.5f}", "within 0.01 of 2"],
            ["max \\|SGD − least squares\\|",
             f"{max(abs(summary['w'] - summary['w_lstsq']), abs(summary['b'] - summary['b_lstsq'])):.1e}", "< 1e-4"],
            ["stability limit 2 / λ_max", f"{summary['lr_limit']:.3f}",
             "lr = 0.95 × limit converges (MSE < 1e-4); 1.05 × limit is stopped with the message"]]
    return (f"{summary['steps']} full-batch steps at lr {summary['lr']}:\n\n"
            + markdown_table(["figure", "measured", "gate"], rows) + "\n")
