"""Day 8 — mini-autograd: a scalar engine that trains XOR, four experiments that break it, a Tensor engine on MNIST.

Part 1 trains the curriculum's 2-2-1 tanh network on XOR with `engine.Value` and a hand-written zero-grad + SGD.
Part 2 answers the four self-check questions by experiment: (1) `=` instead of `+=` in backward, (2) no
gradient reset, (3) no topological order, (4) the same network in PyTorch.
Part 3 trains a 784-256-10 MLP on MNIST with `tensor_engine` (NumPy only: the images come from
`sprint.data.mnist_tensors` and are turned into arrays once).

Run:    python day08_mini_autograd/main.py                 (writes runs/day08_mini_autograd/)
        python day08_mini_autograd/main.py --epochs 1 --hidden 64 --train-subset 5000 --test-subset 1000
        python day08_mini_autograd/main.py --out day08_mini_autograd/results   (refreshes the committed figures)
Gates:  python day08_mini_autograd/check.py
Bench:  python day08_mini_autograd/bench.py
"""
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import numpy as np
import torch

from day08_mini_autograd import tensor_engine as te
from day08_mini_autograd.engine import Value, propagate, topological_order
from day08_mini_autograd.nn import MLP
from day08_mini_autograd.report import print_experiments, write_day
from sprint import runs_dir
from sprint.cli import UserError, arg, parse, progress, run, validate
from sprint.data import mnist_tensors


@dataclass
class Config:
    xor_steps: int = arg(300, "full-batch SGD steps on XOR (scalar engine)", gt=0)
    xor_lr: float = arg(0.5, "XOR learning rate", gt=0)
    epochs: int = arg(3, "MNIST epochs (Tensor engine)", gt=0)
    hidden: int = arg(256, "MNIST hidden width", gt=0)
    batch_size: int = arg(128, "MNIST batch size", gt=0)
    lr: float = arg(2e-3, "MNIST Adam learning rate at the start (it decays linearly to 0)", gt=0)
    seed: int = arg(0, "MNIST initialisation and shuffling seed", ge=0)
    train_subset: int | None = arg(None, "first N MNIST training images only (a quick run)", gt=0, le=60_000)
    test_subset: int | None = arg(None, "first N MNIST test images only", gt=0, le=10_000)

    def __post_init__(self):
        validate(self)


# ------------------------------------------------------------------------------------------------------------
# Part 1: XOR with the scalar engine
# ------------------------------------------------------------------------------------------------------------
XOR_X = [(0.0, 0.0), (0.0, 1.0), (1.0, 0.0), (1.0, 1.0)]
XOR_Y = [0.0, 1.0, 1.0, 0.0]  # no single line separates these: the hidden layer is necessary
# The curriculum's fixed start, per neuron (w1, w2, b): two hidden tanh units, then the tanh output unit.
# A 2-2-1 tanh net can stall in a local minimum (loss ~0.13) from some random starts; this one converges.
XOR_INIT = [0.3, -0.2, 0.1, 0.4, 0.2, -0.3, 0.6, -0.5, 0.2]


def xor_net(init=XOR_INIT):
    net = MLP(2, [2, 1], act="tanh", act_last=True)
    for p, value in zip(net.parameters(), init, strict=True):
        p.data = value
    return net


def xor_loss(net):
    """Mean squared error over the four XOR points."""
    return sum(((net(x)[0] - y) ** 2 for x, y in zip(XOR_X, XOR_Y)), Value(0.0)) * 0.25


def train_xor(steps=300, lr=0.5, backward=Value.backward, zero_grad=True, log_every=0):
    """Full-batch SGD by hand; `backward`/`zero_grad` let the experiments swap in a broken step."""
    net = xor_net()
    params = net.parameters()
    losses = []
    for step in range(steps):
        loss = xor_loss(net)
        if not math.isfinite(loss.data):
            raise UserError(f"XOR loss became {loss.data} at step {step}; lower --xor-lr")
        if zero_grad:
            for p in params:
                p.grad = 0.0  # backward() adds to .grad, so last step's gradient must be cleared first
        backward(loss)
        for p in params:
            p.data -= lr * p.grad  # the whole of SGD
        losses.append(loss.data)
        if log_every and (step % log_every == 0 or step == steps - 1):
            print(f"  step {step:4d}  loss {loss.data:.5f}")
    return {"losses": losses, "final_loss": losses[-1], "params": [p.data for p in params]}


# ------------------------------------------------------------------------------------------------------------
# Part 2: the four self-check questions, answered by experiment
# ------------------------------------------------------------------------------------------------------------
PROBE_X = 3.0  # where experiments 1 and 3 evaluate their gradients


def backward_overwrite(root):
    """Experiment 1: the backward pass with `=` where the chain rule needs `+=`."""
    root.grad = 1.0
    for node in reversed(topological_order(root)):
        if node._a is not None:
            node._a.grad = node._da * node.grad  # BUG on purpose: overwrites instead of accumulating
        if node._b is not None:
            node._b.grad = node._db * node.grad


def backward_without_topological_order(root):
    """Experiment 3: pass each node's gradient on as soon as a depth-first walk reaches it."""
    root.grad = 1.0
    stack, seen = [root], {root}
    while stack:
        node = stack.pop()
        propagate(node)  # BUG on purpose: other consumers of `node` may not have added their share yet
        for child in (node._a, node._b):
            if child is not None and child not in seen:
                seen.add(child)
                stack.append(child)


def square_gradient(backward, x=PROBE_X):
    """d(x*x)/dx at x with a given backward pass; the right answer is 2x."""
    v = Value(x)
    backward(v * v)
    return v.grad


def diamond_gradient(backward, x=PROBE_X):
    """d/dx of y = a*b, a = u+1, b = 2u, u = x*x: u feeds two paths that meet again (a diamond)."""
    v = Value(x)
    u = v * v
    backward((u + 1) * (u * 2))
    return v.grad


def diamond_gradient_exact(x=PROBE_X):
    u = x * x  # dy/du = b + 2a = 2u + 2(u + 1); du/dx = 2x
    return (2 * u + 2 * (u + 1)) * 2 * x


def torch_xor_gradients(params):
    """Loss and gradients of the same 2-2-1 tanh network written with torch (float64)."""
    p = torch.tensor(params, dtype=torch.float64, requires_grad=True)
    hidden_w, out_w = p[:6].view(2, 3), p[6:]  # rows of (w1, w2, b), as in engine.MLP
    x = torch.tensor(XOR_X, dtype=torch.float64)
    y = torch.tensor(XOR_Y, dtype=torch.float64)
    h = torch.tanh(x @ hidden_w[:, :2].T + hidden_w[:, 2])
    out = torch.tanh(h @ out_w[:2] + out_w[2])
    loss = ((out - y) ** 2).mean()
    loss.backward()
    return loss.item(), p.grad.tolist()


def engine_xor_gradients(params):
    net = xor_net(params)
    loss = xor_loss(net)
    loss.backward()
    return loss.data, [p.grad for p in net.parameters()]


RTOL, ATOL = 1e-9, 1e-12  # float64 engines agree with torch up to rounding: ~1e-16 per operation


def tolerance_used(ours, reference, rtol=RTOL, atol=ATOL):
    """The worst element's |ours - reference| as a fraction of its own tolerance `atol + rtol * |reference|`:
    at most 1 means `np.allclose(ours, reference, rtol, atol)` holds for every element."""
    a, b = np.asarray(ours, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    return float((np.abs(a - b) / (atol + rtol * np.abs(b))).max(initial=0.0))


def run_experiments(steps=300, lr=0.5, log_every=0):
    """Part 1's training run plus the four self-check questions, as the numbers that answer them."""
    correct = train_xor(steps, lr, log_every=log_every)
    overwrite = train_xor(steps, lr, backward=backward_overwrite)
    no_reset = train_xor(steps, lr, zero_grad=False)
    (torch_loss, torch_init), (ours_loss, ours_init) = torch_xor_gradients(XOR_INIT), engine_xor_gradients(XOR_INIT)
    torch_end, ours_end = torch_xor_gradients(correct["params"])[1], engine_xor_gradients(correct["params"])[1]
    return {
        "xor": correct,
        "probe_x": PROBE_X,
        "square_grad_exact": 2 * PROBE_X,
        "square_grad_correct": square_gradient(Value.backward),
        "square_grad_overwrite": square_gradient(backward_overwrite),
        "xor_overwrite": overwrite,
        "xor_no_zero_grad": no_reset,
        "diamond_grad_exact": diamond_gradient_exact(),
        "diamond_grad_topological": diamond_gradient(Value.backward),
        "diamond_grad_no_topological": diamond_gradient(backward_without_topological_order),
        "torch_grad_tolerance_used_init": tolerance_used(ours_init, torch_init),
        "torch_grad_tolerance_used_trained": tolerance_used(ours_end, torch_end),
        "torch_loss_abs_diff_init": abs(ours_loss - torch_loss),
    }


# ------------------------------------------------------------------------------------------------------------
# Part 3: MNIST with the Tensor engine
# ------------------------------------------------------------------------------------------------------------
def mnist_arrays(train, limit=None):
    """MNIST as float32 arrays (N, 784) and int64 labels; the engine itself never touches torch."""
    x, y = mnist_tensors(train=train)
    x, y = x.reshape(len(x), -1).numpy(), y.numpy()
    return (x[:limit], y[:limit]) if limit else (x, y)


def accuracy(model, x, y, batch_size=2000):
    with te.no_grad():  # evaluation builds no graph
        hits = sum(int((model(te.Tensor(x[i:i + batch_size])).data.argmax(1) == y[i:i + batch_size]).sum())
                   for i in range(0, len(x), batch_size))
    return hits / len(x)


def train_mnist(epochs=3, hidden=256, batch_size=128, lr=2e-3, seed=0, train_limit=None, test_limit=None,
                log=print):
    """Adam with a linear learning-rate decay to zero; returns test accuracy and per-epoch figures."""
    x_train, y_train = mnist_arrays(True, train_limit)
    x_test, y_test = mnist_arrays(False, test_limit)
    model = te.MLP([784, hidden, 10], seed)  # Linear -> ReLU -> Linear, float32
    opt = te.Adam(model.parameters(), lr=lr)
    rng = np.random.default_rng(seed)
    steps_per_epoch = math.ceil(len(x_train) / batch_size)
    total_steps, step, history = epochs * steps_per_epoch, 0, []
    start = time.perf_counter()
    bar = progress(total=total_steps, desc="MNIST", unit="step")
    for epoch in range(epochs):
        order, loss_sum = rng.permutation(len(x_train)), 0.0  # reshuffle every epoch
        for i in range(0, len(x_train), batch_size):
            idx = order[i:i + batch_size]
            loss = te.cross_entropy(model(te.Tensor(x_train[idx])), y_train[idx])
            if not np.isfinite(loss.data):
                raise UserError(f"MNIST loss became {loss.data} at step {step}; lower --lr")
            opt.zero_grad()
            loss.backward()
            opt.lr = lr * (1 - step / total_steps)  # linear decay: big steps early, fine steps at the end
            opt.step()
            loss_sum, step = loss_sum + float(loss.data), step + 1
            bar.update()
            bar.set_postfix(epoch=epoch + 1, loss=f"{float(loss.data):.4f}", refresh=False)
        history.append({"epoch": epoch + 1, "train_loss": loss_sum / steps_per_epoch,
                        "test_acc": accuracy(model, x_test, y_test), "elapsed_s": time.perf_counter() - start})
        log(f"  epoch {epoch + 1}  train loss {history[-1]['train_loss']:.4f}  "
            f"test acc {100 * history[-1]['test_acc']:.2f}%  ({history[-1]['elapsed_s']:.1f} s)")
    bar.close()
    return {"test_acc": history[-1]["test_acc"], "history": history, "train_s": time.perf_counter() - start,
            "epochs": epochs, "hidden": hidden, "batch_size": batch_size, "lr": lr,
            "n_train": len(x_train), "n_test": len(x_test)}


def main(argv=None):
    cfg, out = parse(Config, argv, __doc__, out=runs_dir(__file__))
    print(f"Part 1 - XOR with the scalar engine: 2-2-1 tanh, init {XOR_INIT}, lr {cfg.xor_lr}, "
          f"{cfg.xor_steps} steps, MSE")
    experiments = run_experiments(cfg.xor_steps, cfg.xor_lr, log_every=50)
    print("Part 2 - the four self-check questions")
    print_experiments(experiments)

    print(f"Part 3 - MNIST with the Tensor engine: 784-{cfg.hidden}-10, Adam lr {cfg.lr} -> 0, "
          f"batch {cfg.batch_size}, {cfg.epochs} epoch(s)")
    mnist = train_mnist(cfg.epochs, cfg.hidden, cfg.batch_size, cfg.lr, cfg.seed, cfg.train_subset, cfg.test_subset)
    print(f"  test accuracy {100 * mnist['test_acc']:.2f}% on {mnist['n_test']:,} images after "
          f"{mnist['train_s']:.1f} s of training")

    write_day(out, experiments, mnist)
    return {"experiments": experiments, "mnist": mnist}


if __name__ == "__main__":
    run(main)
