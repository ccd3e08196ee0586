"""Day 8 gates: both engines agree with torch.autograd, the experiments show their effect, MNIST reaches 97%.

Run:  python day08_mini_autograd/check.py   (or `pytest day08_mini_autograd`)
"""
import gc
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

from sprint.gates import Gates, run_this_file

if __name__ == "__main__":  # script mode hands over to pytest before hypothesis (a pytest plugin) is imported
    run_this_file(__file__)

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings, target
from hypothesis import strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes

from day08_mini_autograd import bench
from day08_mini_autograd import main as day
from day08_mini_autograd import tensor_engine as te
from day08_mini_autograd.engine import Value, collector_paused, topological_order

gates = Gates(__file__)
TOL = f"rtol {day.RTOL:g}, atol {day.ATOL:g}"  # element-wise, float64 (main.tolerance_used)
PROPERTY = settings(max_examples=150, deadline=None, derandomize=True, database=None)  # reproducible examples

# Each op is written once and applied to both engines (Value or te.Tensor vs torch.Tensor), so the two
# build the same expression. Domains are kept safe: log/div/negative powers only see x*x + 1 > 0.
UNARY = {
    "neg": lambda a: -a,
    "square": lambda a: a**2,
    "cube": lambda a: a**3,
    "tanh": lambda a: a.tanh(),
    "relu": lambda a: a.relu(),
    "exp_tanh": lambda a: a.tanh().exp(),
    "log": lambda a: (a * a + 1).log(),
    "rsqrt": lambda a: (a * a + 1) ** -0.5,
    "reflected": lambda a: 2.0 - 3.0 * a + 1.5 / (a * a + 1),
    "constants": lambda a: (a + 0.5 - 2.0) * 1.5 / 4.0,  # a number on the right of each operator
}
BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / (b * b + 1),
}


def test_tolerance_is_element_wise_so_an_error_in_a_small_element_counts():
    # Relative to the largest element this error is 1e-9; element-wise it is 0.1% of the small gradient.
    assert day.tolerance_used([1.0, 1.001e-6], [1.0, 1e-6]) > 1 >= day.tolerance_used([1.0, 1e-6], [1.0, 1e-6])


def torch_leaves(arrays):
    return [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]


# ------------------------------------------------------------------------------------------------------------
# Gradients vs torch.autograd (property-based)
# ------------------------------------------------------------------------------------------------------------
scalar_programs = st.tuples(
    st.lists(st.floats(-2, 2, allow_nan=False), min_size=1, max_size=3),  # input values
    st.lists(st.tuples(st.sampled_from(sorted(UNARY) + sorted(BINARY)), st.integers(0, 99), st.integers(0, 99)),
             min_size=1, max_size=8))  # (op, index of first operand, index of second operand)


def run_program(inputs, program):
    """Apply the ops to a growing pool of values; the output sums the whole pool, so every node matters."""
    pool = list(inputs)
    for op, i, j in program:
        a, b = pool[i % len(pool)], pool[j % len(pool)]
        pool.append(UNARY[op](a) if op in UNARY else BINARY[op](a, b))
    return sum(pool[1:], pool[0])


def scalar_gradient_error(values, program):
    """Gradients after two backward() calls on the same graph: leaves accumulate, intermediates do not."""
    ours = [Value(v) for v in values]
    out = run_program(ours, program)
    out.backward()
    out.backward()
    theirs = torch_leaves(values)
    out = run_program(theirs, program)
    out.backward(retain_graph=True)
    out.backward()
    return day.tolerance_used([v.grad for v in ours], [t.grad.item() for t in theirs])


def test_scalar_engine_matches_torch_autograd_on_random_expressions_backward_twice():
    errors = []

    @PROPERTY
    @given(scalar_programs)
    def run(case):
        errors.append(scalar_gradient_error(*case))
        target(errors[-1])  # steer the search toward the largest disagreement

    run()
    gates.check(f"scalar engine vs torch, backward() twice: worst gradient error / ({TOL})", max(errors), "<=", 1)


def test_a_second_backward_adds_the_same_gradient_again_like_torch():
    x = Value(1.5)
    y = (x * 2) * 3
    y.backward()
    y.backward()
    tx = torch.tensor(1.5, requires_grad=True)
    ty = (tx * 2) * 3
    ty.backward(retain_graph=True)
    ty.backward()
    gates.check("((x*2)*3).backward() twice: d/dx accumulated, as torch's 12", x.grad, "==", tx.grad.item())


# (base, exponent) pairs where Python's own `**` misbehaves: 0 ** 0, 0 ** fraction, negative ** fraction
POWERS = [(0.0, 0), (0.0, 0.0), (0.0, 0.5), (0.0, 1), (0.0, 2), (0.0, 1.5), (-2.0, 2), (-2.0, 3), (-8.0, -1),
          (2.0, 0.5), (3.0, -0.5), (-1.5, 0)]


@pytest.mark.parametrize("base, k", POWERS, ids=[f"{b}**{k}" for b, k in POWERS])
def test_power_value_and_gradient_equal_torch(base, k):
    x = Value(base)
    y = x**k
    y.backward()
    tx = torch.tensor(base, dtype=torch.float64, requires_grad=True)
    ty = tx**k
    ty.backward()
    np.testing.assert_allclose([y.data, x.grad], [ty.item(), tx.grad.item()], rtol=day.RTOL, atol=day.ATOL)


@pytest.mark.parametrize("base, k", [(-8.0, 1 / 3), (-2.0, 0.5), (0.0, -1), (0.0, -0.5)])
def test_power_without_a_real_value_raises_where_torch_returns_nan_or_inf(base, k):
    torch_value = (torch.tensor(base, dtype=torch.float64) ** k).item()
    assert not np.isfinite(torch_value)
    with pytest.raises(ValueError, match="has no real value"):
        Value(base) ** k


def tensor_broadcast_error(shapes, ops, reduce_axis, keepdims, seed):
    """c = op2(unary(op1(a, b)), a) -> sum/mean over an axis -> flattened, weighted sum; compare d/da, d/db."""
    unary, op1, op2, reduction = ops
    rng = np.random.default_rng(seed)
    arrays = [rng.normal(size=shape) for shape in shapes]

    def build(a, b):
        c = BINARY[op2](UNARY[unary](BINARY[op1](a, b)), a)  # `a` is used twice: its gradients must add up
        axis = reduce_axis % c.ndim if c.ndim else None
        c = c.sum(axis, keepdims=keepdims) if reduction == "sum" else c.mean(axis, keepdims=keepdims)
        return c.reshape(-1)

    ours, theirs = [te.Tensor(x, requires_grad=True) for x in arrays], torch_leaves(arrays)
    out = build(*ours)
    weights = rng.normal(size=out.shape)  # a random upstream gradient, the same for both engines
    (out * te.Tensor(weights)).sum().backward()
    (build(*theirs) * torch.from_numpy(weights)).sum().backward()
    return max(day.tolerance_used(o.grad, t.grad.numpy()) for o, t in zip(ours, theirs))


SPEC_CASE = dict(ops=("tanh", "mul", "add", "sum"), reduce_axis=0, keepdims=False, seed=0)


def test_tensor_engine_matches_torch_autograd_with_broadcasting():
    errors = []

    @PROPERTY
    @given(shapes=mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=4).map(lambda s: s.input_shapes),
           ops=st.tuples(*(st.sampled_from(sorted(t)) for t in (UNARY, BINARY, BINARY)), st.sampled_from(["sum", "mean"])),
           reduce_axis=st.integers(0, 2), keepdims=st.booleans(), seed=st.integers(0, 2**16))
    @example(shapes=((3, 1), (1, 4)), **SPEC_CASE)  # the spec's shapes ...
    @example(shapes=((5,), (2, 5)), **SPEC_CASE)
    @example(shapes=((2, 3), ()), **SPEC_CASE)  # ... and a 0-d operand
    def run(**case):
        errors.append(tensor_broadcast_error(**case))
        target(errors[-1])

    run()
    gates.check(f"tensor engine (broadcast ops) vs torch: worst gradient error / ({TOL})", max(errors), "<=", 1)


def test_tensor_engine_matches_torch_on_matmul_and_cross_entropy():
    errors = []

    @PROPERTY
    @given(st.integers(1, 6), st.integers(1, 5), st.integers(2, 6), st.sampled_from(["relu", "tanh"]),
           st.integers(0, 2**16))
    def run(n, k, m, act, seed):
        rng = np.random.default_rng(seed)
        arrays = [rng.normal(size=(n, k)), rng.normal(size=(k, m)), rng.normal(size=(m,)), rng.normal(size=(m, m))]
        labels = rng.integers(0, m, n)
        ours = [te.Tensor(a, requires_grad=True) for a in arrays]
        x, w, b, w2 = ours
        te.cross_entropy(UNARY[act](x @ w + b) @ w2, labels).backward()
        theirs = torch_leaves(arrays)
        x, w, b, w2 = theirs
        torch.nn.functional.cross_entropy(UNARY[act](x @ w + b) @ w2, torch.from_numpy(labels)).backward()
        errors.append(max(day.tolerance_used(o.grad, t.grad.numpy()) for o, t in zip(ours, theirs)))
        target(errors[-1])

    run()
    gates.check(f"tensor engine (matmul, log-softmax, cross-entropy) vs torch: worst gradient error / ({TOL})",
                max(errors), "<=", 1)


def test_each_leaf_owns_a_writable_gradient_like_torch():
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=(2, 3)), rng.normal(size=(2, 3))]
    a, b = (te.Tensor(x, requires_grad=True) for x in arrays)
    (a + b).sum().backward()  # both leaves receive the same upstream gradient
    ta, tb = torch_leaves(arrays)
    (ta + tb).sum().backward()
    assert a.grad is not b.grad and a.grad.flags.writeable and a.grad.dtype == a.data.dtype
    a.grad *= 0.5  # an optimizer may scale or clip a gradient in place
    ta.grad *= 0.5
    gates.check(f"shared upstream gradient, one leaf's scaled in place: worst error vs torch / ({TOL})",
                max(day.tolerance_used(o.grad, t.grad.numpy()) for o, t in ((a, ta), (b, tb))), "<=", 1)


def test_a_tensor_copies_the_array_it_is_given_like_torch_tensor():
    weights = np.ones(3)
    w = te.Tensor(weights, requires_grad=True)
    (w * w).sum().backward()
    te.SGD([w], lr=0.1).step()
    tw = torch.tensor(np.ones(3), requires_grad=True)  # torch.tensor() copies too (torch.from_numpy would not)
    (tw * tw).sum().backward()
    torch.optim.SGD([tw], lr=0.1).step()
    assert np.array_equal(weights, np.ones(3)), "the optimizer step wrote into the caller's array"
    assert np.array_equal(w.data, tw.detach().numpy())


def test_matmul_with_a_plain_array_on_either_side_matches_torch():
    rng = np.random.default_rng(0)
    x, w, v = rng.normal(size=(4, 3)), rng.normal(size=(3, 2)), rng.normal(size=(5, 4))
    ours = te.Tensor(x, requires_grad=True)
    (v @ (ours @ w)).sum().backward()  # Tensor @ ndarray, then ndarray @ Tensor
    theirs = torch_leaves([x])[0]
    (torch.from_numpy(v) @ (theirs @ torch.from_numpy(w))).sum().backward()
    gates.check(f"ndarray @ (Tensor @ ndarray): gradient error vs torch / ({TOL})",
                day.tolerance_used(ours.grad, theirs.grad.numpy()), "<=", 1)


# ------------------------------------------------------------------------------------------------------------
# Scale: deep graphs and graphs that free themselves
# ------------------------------------------------------------------------------------------------------------
def test_100k_op_chain_backpropagates_without_recursion_error():
    n, factor = 100_000, 1.00001
    x = Value(1.0)
    y = x
    for _ in range(n):
        y = y * factor
    nodes = len(topological_order(y))
    y.backward()  # a recursive topological sort raises RecursionError here
    gates.check("100k-op chain: nodes sorted", nodes, "==", n + 1)  # a constant factor is no node of its own
    gates.check(f"100k-op chain: dy/dx error vs factor**n / ({TOL})", day.tolerance_used(x.grad, factor**n), "<=", 1)


def unreachable_after(step):
    """Run `step` with the cycle collector paused (test only), then count the garbage only it could free."""
    gc.collect()
    gc.disable()
    try:
        step()
    finally:
        gc.enable()
    return gc.collect()


def test_scalar_graphs_free_themselves_without_the_cycle_collector():
    net = day.xor_net()

    def step():
        loss = day.xor_loss(net)
        net.zero_grad()
        loss.backward()

    gates.check("scalar engine: cyclic garbage objects after 3 training steps",
                unreachable_after(lambda: [step() for _ in range(3)]), "==", 0)


def test_collector_paused_pauses_the_collector_then_restores_its_state_even_after_an_error():
    def states(enabled_before):
        gc.enable() if enabled_before else gc.disable()
        with collector_paused():
            inside = gc.isenabled()
        with pytest.raises(KeyError), collector_paused():
            raise KeyError
        return [inside, gc.isenabled()]

    was_enabled = gc.isenabled()
    try:
        seen = states(True) + states(False)
    finally:
        gc.enable() if was_enabled else gc.disable()
    gates.check("collector enabled before: on inside, after; disabled before: on inside, after", seen, "==",
                [False, True, False, False])


def test_tensor_graphs_free_themselves_without_the_cycle_collector():
    model, rng = te.MLP([784, 32, 10]), np.random.default_rng(0)
    opt = te.Adam(model.parameters())

    def step():
        loss = te.cross_entropy(model(te.Tensor(rng.normal(size=(16, 784)).astype(np.float32))), rng.integers(0, 10, 16))
        opt.zero_grad()
        loss.backward()
        opt.step()

    gates.check("tensor engine: cyclic garbage objects after 3 training steps",
                unreachable_after(lambda: [step() for _ in range(3)]), "==", 0)


# ------------------------------------------------------------------------------------------------------------
# XOR and the four experiments
# ------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def exp():
    return day.run_experiments()  # main.py's defaults: 300 steps at lr 0.5


def test_xor_reaches_loss_below_0_01(exp):
    gates.check("XOR final MSE", exp["xor"]["final_loss"], "<", 0.01)


def test_overwriting_instead_of_accumulating_halves_the_gradient_of_x_times_x(exp):
    gates.check(f"(1) d(x*x)/dx, correct backward: error vs 2x / ({TOL})",
                day.tolerance_used(exp["square_grad_correct"], exp["square_grad_exact"]), "<=", 1)
    gates.check("(1) d(x*x)/dx with '=': relative gap to correct",
                abs(exp["square_grad_overwrite"] / exp["square_grad_correct"] - 1), ">", 0.1)


def test_overwriting_instead_of_accumulating_stops_xor_training(exp):
    gates.check("(1) XOR final MSE with '=' instead of '+='", exp["xor_overwrite"]["final_loss"], ">", 0.1)


def test_skipping_the_gradient_reset_stalls_xor_training(exp):
    gates.check("(2) XOR final MSE without zero-grad", exp["xor_no_zero_grad"]["final_loss"], ">", 0.1)


def test_diamond_gradient_needs_topological_order(exp):
    exact = exp["diamond_grad_exact"]
    gates.check(f"(3) diamond dy/dx in topological order: error / ({TOL})",
                day.tolerance_used(exp["diamond_grad_topological"], exact), "<=", 1)
    gates.check("(3) diamond dy/dx without topological order: relative gap",
                abs(exp["diamond_grad_no_topological"] / exact - 1), ">", 0.1)


def test_same_network_in_torch_gives_the_same_gradients(exp):
    worst = max(exp["torch_grad_tolerance_used_init"], exp["torch_grad_tolerance_used_trained"])
    gates.check(f"(4) XOR net gradients vs torch, before and after training: worst error / ({TOL})", worst, "<=", 1)


# ------------------------------------------------------------------------------------------------------------
# The learner's commands: main.py at its defaults (MNIST >= 97%), bench.py in CI's environment, bad flags
# ------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("day08")
    return day.main(["--out", str(out)]), out


@pytest.mark.slow
def test_tensor_engine_mlp_reaches_97_percent_on_mnist(default_run):
    result, _ = default_run
    gates.check("test images evaluated", result["mnist"]["n_test"], "==", 10_000)
    gates.check("MNIST test accuracy, NumPy Tensor engine, main.py's default run", result["mnist"]["test_acc"],
                ">=", 0.97)


@pytest.mark.slow
def test_main_writes_plot_and_summary(default_run):
    _, out = default_run
    assert (out / "day08.png").stat().st_size > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["machine"] and summary["mnist"]["test_acc"] == default_run[0]["mnist"]["test_acc"]


def test_bench_runs_without_micrograd_installed_and_the_engines_compute_the_same_losses(tmp_path):
    result = bench.main(["--steps", "2", "--points", "8", "--heaps", "numpy", "--rounds", "1", "--tensor-steps", "1",
                         "--out", str(tmp_path)])
    assert {(r["engine"], r["collector"]) for r in result["scalar"]["runs"]} == {
        ("ours", "default"), ("ours", "paused per step"), ("micrograd", "default"), ("micrograd", "paused per step"),
        ("tensor", "default")}
    gates.check("the demo's losses, this engine and the Tensor engine vs micrograd 0.1.0: largest relative gap",
                result["scalar"]["max_relative_loss_gap"], "<", 1e-12)
    assert (tmp_path / "bench.json").exists() and (tmp_path / "bench.md").exists()


BAD_FLAGS = {
    "main": [["--epochs", "0"], ["--xor-steps", "0"], ["--hidden", "-3"], ["--batch-size", "0"], ["--lr", "-1"],
             ["--lr", "nan"], ["--xor-lr", "inf"], ["--seed", "-1"], ["--train-subset", "0"],
             ["--train-subset", "70000"], ["--test-subset", "-5"], ["--epochs", "two"], ["--smoke"]],
    "bench": [["--steps", "0"], ["--points", "1"], ["--rounds", "0"], ["--tensor-steps", "-1"], ["--heaps", "jax"],
              ["--quick"]],
}


@pytest.mark.parametrize("script, argv", [(k, v) for k, vs in BAD_FLAGS.items() for v in vs],
                         ids=[f"{k}:{' '.join(v)}" for k, vs in BAD_FLAGS.items() for v in vs])
def test_a_bad_flag_exits_2_with_one_line_and_creates_nothing(script, argv, tmp_path):
    gates.refuses({"main": day.main, "bench": bench.main}[script], argv, tmp_path / "out")


def test_an_out_folder_under_a_file_is_refused_before_any_work(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    for script in (day.main, bench.main):
        with pytest.raises(SystemExit) as exc:
            script(["--out", str(tmp_path / "file" / "out")])
        assert exc.value.code == 2 and "is a file, not a folder" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------------------
# Optimizers vs torch.optim
# ------------------------------------------------------------------------------------------------------------
def trajectory_error(make_ours, make_torch, steps=10):
    """Train the same 6-5-3 tanh net in both frameworks; worst relative parameter gap over `steps` steps."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 6)), rng.integers(0, 3, 8)
    ours = [te.Linear(6, 5, rng, np.float64), te.Linear(5, 3, rng, np.float64)]
    params = [p for layer in ours for p in (layer.weight, layer.bias)]
    theirs = [torch.tensor(p.data, requires_grad=True) for p in params]
    opt, topt = make_ours(params), make_torch(theirs)
    worst = 0.0
    for _ in range(steps):
        loss = te.cross_entropy(ours[1](ours[0](te.Tensor(x)).tanh()), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        w1, b1, w2, b2 = theirs
        tloss = torch.nn.functional.cross_entropy(torch.tanh(torch.from_numpy(x) @ w1 + b1) @ w2 + b2,
                                                  torch.from_numpy(y))
        topt.zero_grad()
        tloss.backward()
        topt.step()
        worst = max(worst, *(day.tolerance_used(p.data, t.detach().numpy()) for p, t in zip(params, theirs)))
    return worst


def test_adam_matches_torch_adam_for_10_steps():
    kw = dict(lr=0.05, betas=(0.8, 0.99), eps=1e-8, weight_decay=0.01)
    worst = trajectory_error(lambda p: te.Adam(p, **kw), lambda p: torch.optim.Adam(p, **kw))
    gates.check(f"Adam vs torch.optim.Adam, parameters over 10 steps: worst error / ({TOL})", worst, "<=", 1)


def test_sgd_matches_torch_sgd_for_10_steps():
    worst = trajectory_error(lambda p: te.SGD(p, lr=0.3), lambda p: torch.optim.SGD(p, lr=0.3))
    gates.check(f"SGD vs torch.optim.SGD, parameters over 10 steps: worst error / ({TOL})", worst, "<=", 1)


# ------------------------------------------------------------------------------------------------------------
# Clear errors on bad input
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad, error", [
    (lambda: Value(2.0) ** Value(3.0), TypeError),
    (lambda: Value(-1.0).log(), ValueError),
    (lambda: te.Tensor(np.ones((2, 3))) @ te.Tensor(np.ones((2, 3))), ValueError),
    (lambda: te.cross_entropy(te.Tensor(np.zeros((2, 3))), [0, 3]), ValueError),
    (lambda: te.Tensor(np.ones(3), requires_grad=True).backward(), ValueError),
], ids=["value-pow-value", "log-negative", "matmul-shapes", "target-out-of-range", "backward-non-scalar"])
def test_bad_input_raises_a_clear_error(bad, error):
    with pytest.raises(error):
        bad()
