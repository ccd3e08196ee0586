"""Day 4 gates: the learner's command beats 98% on the MNIST test set for two seeds (G0), the loop is the correct
one (eval mode, logits, the test set touched once), bad flags are refused before any work, and the init lab's
claims hold on measured figures.

Run:  python day04_mlp_mnist/check.py   (or `pytest day04_mlp_mnist`)
"""
import copy
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import pytest
import torch
import torch.nn as nn

from day04_mlp_mnist import init_lab as lab
from day04_mlp_mnist import main as day
from sprint.data import mnist_tensors
from sprint.device import ABSENT_CUDA
from sprint.gates import Gates, run_this_file

gates = Gates(__file__)
SMALL = dict(hidden=128, epochs=2, train_subset=4000, test_subset=2000, batch_size=100, dropout=0.1)  # ~1 s


@pytest.fixture(scope="module", params=[0, 1], ids=["seed0", "seed1"])
def default_run(request, tmp_path_factory):
    """The learner's command, `python day04_mlp_mnist/main.py [--seed 1]`, its output sent to a temporary folder."""
    out = tmp_path_factory.mktemp(f"day04-seed{request.param}")
    return day.main(["--seed", str(request.param), "--out", str(out)]), out


@pytest.fixture(scope="module")
def small_run():
    return day.train(day.Config(**SMALL), log=lambda *_: None)


class Stacked(nn.Module):
    """784 -> 64 -> 64 with the hidden layers kept in `container`, then a head registered as an attribute.
    Attribute assignment registers a Module, a Parameter or an nn.ModuleList, never the Modules inside a Python list."""

    def __init__(self, container):
        super().__init__()
        self.hidden = container([nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU()])
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        for layer in self.hidden:
            x = layer(x)
        return self.head(x)


@pytest.fixture(scope="module")
def containers():
    """Each container's model trained 150 steps of AdamW on 2,000 training images (from the same initial weights):
    the model, its first hidden layer's weights before training, its loss over those images after training."""
    x, y = mnist_tensors(train=True)
    x, y = x[:2000], y[:2000]
    out = {}
    for container in (list, nn.ModuleList):
        torch.manual_seed(0)
        model = Stacked(container)
        before = model.hidden[0].weight.detach().clone()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for step in range(150):
            batch = torch.arange(step * 100, step * 100 + 100) % len(x)
            loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            loss = nn.functional.cross_entropy(model(x), y).item()
        out[container.__name__] = {"model": model, "before": before, "loss": loss}
    return out


def test_layers_in_a_plain_list_are_invisible_to_parameters_state_dict_and_to(containers):
    counts = {name: (sum(p.numel() for p in run["model"].parameters()), len(run["model"].state_dict()))
              for name, run in containers.items()}
    converted = {name: copy.deepcopy(run["model"]).to(torch.float64).hidden[0].weight.dtype
                 for name, run in containers.items()}
    gates.check("the first hidden layer's dtype after .to(torch.float64): Python list, nn.ModuleList",
                [converted["list"], converted["ModuleList"]], "==", [torch.float32, torch.float64])
    gates.check("parameters() and state_dict() entries: hidden layers in a Python list (only the head's)",
                counts["list"], "==", (64 * 10 + 10, 2))
    gates.check("... in an nn.ModuleList (every layer's)", counts["ModuleList"], "==",
                (784 * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10, 6))


def test_layers_in_a_plain_list_never_train_and_the_model_learns_less(containers):
    moved = {name: (run["model"].hidden[0].weight - run["before"]).abs().max().item()
             for name, run in containers.items()}
    gates.check("max |change| of the first hidden layer's weights after 150 steps, Python list", moved["list"],
                "==", 0.0)
    gates.check("... nn.ModuleList", moved["ModuleList"], ">", 1e-3)
    assert torch.equal(containers["list"]["before"], containers["ModuleList"]["before"])  # the same init
    gates.check("loss over the 2,000 training images after training, Python list / nn.ModuleList",
                containers["list"]["loss"] / containers["ModuleList"]["loss"], ">", 1.5)


@pytest.mark.slow
def test_default_run_beats_98_percent_on_the_official_test_set(default_run):
    result, _ = default_run
    seed = result["config"]["seed"]
    gates.check(f"G0, seed {seed}: all 10,000 test images evaluated", result["n_test"], "==", 10_000)
    gates.check(f"G0, seed {seed}: test accuracy of the default run above 98%", result["test_acc"], ">", 0.98)


@pytest.mark.slow
def test_default_run_logs_one_json_line_per_epoch(default_run):
    result, out = default_run
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    gates.check(f"seed {result['config']['seed']}: metrics.jsonl has one row per epoch", len(rows), "==",
                result["config"]["epochs"])
    assert (out / "curves.png").stat().st_size > 0


def test_the_test_set_is_evaluated_once_after_training(monkeypatch):
    test_storages, calls = [], []

    def spy_tensors(*args, **kwargs):
        x, y = mnist_tensors(*args, **kwargs)
        test_storages.append(x.untyped_storage().data_ptr())
        return x, y

    def spy_evaluate(model, x, y, batch_size=2000):
        calls.append(x.untyped_storage().data_ptr() in test_storages)
        return evaluate(model, x, y, batch_size)

    evaluate = day.evaluate
    monkeypatch.setattr(day, "mnist_tensors", spy_tensors)
    monkeypatch.setattr(day, "evaluate", spy_evaluate)
    day.train(day.Config(**SMALL), log=lambda *_: None)
    gates.check("the test images are evaluated once per run", sum(calls), "==", 1)
    gates.check("the test evaluation is the last evaluation of the run", calls[-1], "==", True)


def test_evaluation_is_deterministic(small_run):
    x, y = mnist_tensors(train=False)
    first = day.evaluate(small_run["model"], x, y)["preds"]
    second = day.evaluate(small_run["model"], x, y)["preds"]
    gates.check("evaluate() twice gives the same 10,000 predictions (differing)", (first != second).sum(), "==", 0)


def test_forgetting_eval_changes_predictions(small_run):
    model = small_run["model"]
    x, y = mnist_tensors(train=False)
    in_eval = day.evaluate(model, x, y)["preds"]
    model.train()  # the bug: evaluating with Dropout still active
    with torch.no_grad():
        in_train_mode = torch.cat([model(x[i:i + 2000]).argmax(1) for i in range(0, len(x), 2000)])
    gates.check("train-mode Dropout changes some of 10,000 predictions", (in_eval != in_train_mode).sum(), ">", 0)


def test_loss_receives_logits_of_shape_batch_by_10():
    torch.manual_seed(0)
    model, criterion = day.MLP(hidden=32), nn.CrossEntropyLoss()
    shapes = []
    criterion.register_forward_pre_hook(lambda _module, args: shapes.append(tuple(args[0].shape)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    x, y = mnist_tensors(train=True)
    batches = torch.arange(5 * 64).view(5, 64)
    day.train_steps(model, optimizer, scheduler, criterion, x, y, batches)
    gates.check("every loss call gets logits of shape (64, 10)", sum(s == (64, 10) for s in shapes), "==", len(batches))


def test_forward_returns_logits_not_probabilities(small_run):
    model = small_run["model"].eval()
    x = mnist_tensors(train=False)[0][:500]
    with torch.no_grad():
        out = model(x)
        flat = model(x.flatten(1))
    is_distribution = (out >= 0).all(1) & torch.isclose(out.sum(1), torch.ones(len(out)), atol=1e-3)
    gates.check("forward returns logits: output rows that are probability distributions", is_distribution.sum(),
                "==", 0)
    gates.check("forward(B,1,28,28) equals forward(B,784) (max diff)", (out - flat).abs().max(), "==", 0)


def test_same_seed_gives_identical_training(small_run):
    again = day.train(day.Config(**SMALL), log=lambda *_: None)
    weights = zip(small_run["model"].state_dict().values(), again["model"].state_dict().values())
    gates.check("two runs with seed 0 give identical weights (max diff)", max((a - b).abs().max() for a, b in weights),
                "==", 0)


def test_a_diverging_loss_stops_with_a_message():
    with pytest.raises(day.NonFiniteLoss, match="lower --lr"):
        day.train(day.Config(**{**SMALL, "lr": 1e30}), log=lambda *_: None)


BAD_FLAGS = [["--train-subset", "-5"], ["--train-subset", "0"], ["--train-subset", "60000"],
             ["--evals-per-epoch", "1000"], ["--device", ABSENT_CUDA], ["--device", "gpu"], ["--epochs", "0"],
             ["--lr", "nan"], ["--dropout", "1.5"], ["--act", "swish"], ["--val-size", "60000"], ["--batch-size", "0"]]


@pytest.mark.parametrize("argv", BAD_FLAGS, ids=" ".join)
def test_a_bad_flag_exits_2_with_one_line_and_creates_nothing(argv, tmp_path):
    gates.refuses(day.main, argv, tmp_path / "out")


# --- the init lab -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("weights, distinct", [("zero", 1), ("constant", 1), ("random", 64)])
def test_equal_initial_weights_keep_every_hidden_unit_identical(weights, distinct):
    result = lab.symmetry(weights)
    gates.check(f"{weights} init: distinct hidden units (of 64) after 200 Adam steps",
                result["distinct_hidden_units"], "==", distinct)
    if weights == "constant":  # the units did train: they moved, all in the same way
        gates.check("constant init: the weights moved during training", result["max_weight_change"], ">", 0.01)


def test_he_init_keeps_relu_activations_within_2x_of_layer_1():
    stds = lab.activation_stds("He", "relu")
    worst = max(max(s / stds[0], stds[0] / s) for s in stds)
    gates.check("He + ReLU: 30 layers stay within a factor of 2 of layer 1's std", worst, "<=", 2)


def test_too_small_init_collapses_relu_activations():
    stds = lab.activation_stds("too small", "relu")
    gates.check("too-small init + ReLU: std after layer 30 / after layer 1 below 1e-3", stds[-1] / stds[0], "<", 1e-3)


@pytest.fixture(scope="module")
def dead():
    runs = [("relu", lab.NORMAL_LR)] + [(act, lab.TOO_LARGE_LR) for act in ("relu", "gelu", "silu")]
    return {(act, lr): lab.dead_units(act, lr) for act, lr in runs}


def test_a_too_large_lr_kills_relu_units_for_good(dead):
    normal, large = dead["relu", lab.NORMAL_LR], dead["relu", lab.TOO_LARGE_LR]
    gates.check(f"ReLU at Adam LR {lab.NORMAL_LR:g}: dead units below 5%", normal["dead"], "<", 0.05)
    gates.check(f"ReLU at Adam LR {lab.TOO_LARGE_LR:g}: dead units above 25%", large["dead"], ">", 0.25)
    gates.check("dead ReLU units revived by 100 steps at a normal LR", large["revived"], "==", 0)


def test_gelu_and_silu_lose_fewer_units_than_relu(dead):
    relu = dead["relu", lab.TOO_LARGE_LR]["dead"]
    gates.check("same too-large LR: GELU loses fewer units than ReLU (GELU's dead share)",
                dead["gelu", lab.TOO_LARGE_LR]["dead"], "<", relu)
    gates.check("same too-large LR: SiLU loses (almost) no unit (dead share below 1%)",
                dead["silu", lab.TOO_LARGE_LR]["dead"], "<", 0.01)


def test_swiglu_with_hidden_8d_over_3_has_the_parameters_of_a_4d_gelu_mlp():
    counts = lab.ffn_params(768)
    gates.check("d = 768: SwiGLU (hidden 8d/3) parameters equal the 4d GELU MLP's", counts["swiglu_8d_3"], "==",
                counts["gelu_4d"])
    gates.check("d = 768: SwiGLU with hidden 4d has 1.5x the parameters", counts["swiglu_4d"] / counts["gelu_4d"],
                "==", 1.5)
    block = lab.SwiGLU(12, 32)
    gates.check("SwiGLU keeps the input's shape", list(block(torch.randn(5, 12)).shape), "==", [5, 12])


if __name__ == "__main__":
    run_this_file(__file__)
