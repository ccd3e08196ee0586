"""Day 4 gates: the default run beats 98% on the MNIST test set, and the loop is the correct one.

Run:  python day04_mlp_mnist/check.py   (or `pytest day04_mlp_mnist`)
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import pytest
import torch
import torch.nn as nn

from day04_mlp_mnist import main as day
from sprint.data import mnist_tensors
from sprint.gates import Gates, run_this_file

gates = Gates(__file__)
SMALL = dict(hidden=128, epochs=2, train_subset=4000, test_subset=2000, batch_size=100)  # ~1 s of training


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """The learner's command, `python day04_mlp_mnist/main.py`, with its output sent to a temporary folder."""
    out = tmp_path_factory.mktemp("day04")
    return day.main(["--out", str(out)]), out


@pytest.fixture(scope="module")
def small_run():
    return day.train(day.Config(**SMALL), log=lambda *_: None)


@pytest.mark.slow
def test_default_run_beats_98_percent_on_the_official_test_set(default_run):
    result, _ = default_run
    gates.check("test images evaluated", result["n_test"], "==", 10_000)
    gates.check("test accuracy, default run", result["test_acc"], ">", 0.98)


@pytest.mark.slow
def test_default_run_logs_one_json_line_per_epoch(default_run):
    result, out = default_run
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    gates.check("metrics.jsonl rows", len(rows), "==", result["config"]["epochs"])
    assert (out / "curves.png").stat().st_size > 0


def test_evaluation_is_deterministic(small_run):
    x, y = mnist_tensors(train=False)
    first = day.evaluate(small_run["model"], x, y)["preds"]
    second = day.evaluate(small_run["model"], x, y)["preds"]
    gates.check("predictions differing between two evaluate() calls", (first != second).sum(), "==", 0)


def test_forgetting_eval_changes_predictions(small_run):
    model = small_run["model"]
    x, y = mnist_tensors(train=False)
    in_eval = day.evaluate(model, x, y)["preds"]
    model.train()  # the bug: evaluating with Dropout still active
    with torch.no_grad():
        in_train_mode = torch.cat([model(x[i:i + 2000]).argmax(1) for i in range(0, len(x), 2000)])
    gates.check("predictions changed by train-mode Dropout (of 10,000)", (in_eval != in_train_mode).sum(), ">", 0)


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
    gates.check("loss calls with input shape (64, 10)", sum(s == (64, 10) for s in shapes), "==", len(batches))


def test_forward_returns_logits_not_probabilities(small_run):
    model = small_run["model"].eval()
    x = mnist_tensors(train=False)[0][:500]
    with torch.no_grad():
        out = model(x)
        flat = model(x.flatten(1))
    is_distribution = (out >= 0).all(1) & torch.isclose(out.sum(1), torch.ones(len(out)), atol=1e-3)
    gates.check("output rows that are probability distributions", is_distribution.sum(), "==", 0)
    gates.check("max |forward(B,1,28,28) - forward(B,784)|", (out - flat).abs().max(), "==", 0)


def test_same_seed_gives_identical_training(small_run):
    again = day.train(day.Config(**SMALL), log=lambda *_: None)
    weights = zip(small_run["model"].state_dict().values(), again["model"].state_dict().values())
    gates.check("max |weight difference| between two runs with seed 0", max((a - b).abs().max() for a, b in weights),
                "==", 0)


def test_bad_settings_are_rejected_with_a_clear_message():
    with pytest.raises(ValueError, match="dropout must be in"):
        day.Config(dropout=1.5)
    with pytest.raises(SystemExit):  # argparse: "error: Config.epochs must be > 0, got 0"
        day.main(["--epochs", "0"])
    with pytest.raises(FloatingPointError, match="lower --lr"):
        day.train(day.Config(**{**SMALL, "lr": 1e30}), log=lambda *_: None)


if __name__ == "__main__":
    run_this_file(__file__)
