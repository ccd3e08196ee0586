"""Day 2's table (`results/summary.md`, which the README includes): each lesson's measured figure."""
from sprint import markdown_table


def lessons_table(lessons: dict) -> str:
    hand, leaves = lessons["hand_vs_autograd"], lessons["leaves"]
    detach, accumulation = lessons["detach_vs_no_grad"], lessons["accumulation"]
    second, custom = lessons["second_backward"], lessons["custom_function"]
    exact = [op for op, row in hand.items() if row["max_abs_diff"] == 0]
    inexact = {op: row["max_abs_diff"] for op, row in hand.items() if row["max_abs_diff"] != 0}
    rows = [
        [f"max \\|hand − autograd\\|: {', '.join(exact)}", "0.0"],
        *[[f"max \\|hand − autograd\\|: {op}", f"{diff:.1e}"] for op, diff in inexact.items()],
        [f"`(w*x+b)**2`: max \\|hand − w.grad\\|, {lessons['linear_square_float32']['trials']:,} float32 triples",
         lessons["linear_square_float32"]["max_abs_diff"]],
        ["`y.grad` of a non-leaf without `retain_grad`",
         f"{'None' if leaves['y_grad_is_none'] else 'a tensor'} + {leaves['warning']}"],
        ["max \\|retained `y.grad` − 2y\\|", leaves["retained_grad_minus_2y"]],
        ["max \\|grad of `w*w.detach()` − w\\|; of `w*w` − 2w",
         f"{detach['grad_of_w_times_detached_w_minus_w']}; {detach['grad_of_w_times_w_minus_2w']}"],
        ["bytes saved for backward: with grad / under `no_grad`",
         f"{detach['saved_bytes_with_grad']:,} / {detach['saved_bytes_under_no_grad']:,}"],
        ["max \\|grad after 2 backward − 2 × after 1\\|; after `zero_()`",
         f"{accumulation['two_backward_minus_twice_one']}; {accumulation['after_zero']}"],
        ["second backward", f"{second['error']['type']} \"{second['error']['message'].split(' (')[0]} ...\""],
        ["second backward after `retain_graph=True`",
         f"{'no error' if second['error_with_retain_graph'] is None else second['error_with_retain_graph']}; "
         f"max \\|w.grad − 4w\\| = {second['grad_minus_4w']}"],
        ["gradcheck, correct SiLU (float64 / float32)",
         f"{custom['correct_passes_float64']} / {custom['correct_passes_float32']}"],
        ["gradcheck, wrong SiLU (float64)", f"{custom['wrong_passes_float64']}; raises "
         f"`{custom['wrong_error']['type']}: {custom['wrong_error']['message'].rstrip(',')}`"],
        ["max \\|SiLU grad − `F.silu` grad\\|", f"{custom['grad_minus_f_silu']:.1e}"],
    ]
    return markdown_table(["check", "measured"], rows)
