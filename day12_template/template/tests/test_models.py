"""The model contract (the README's "A new model" table), held for every registered model: it builds, trains,
checkpoints, resumes to the same numbers, memory.py estimates it and, for a language model, sample.py writes text
with it. A new model is covered by registering it. A GRU language model that has nothing but `forward` trains and
samples; a model without the `checkpointing` flag is refused activation checkpointing in one line."""
from dataclasses import dataclass

import pytest
import torch
import torch.nn as nn

from train_template import checkpoint, config, gpt, memory, models, sample, train
from helpers import TINY, cfg_of, diff_states, every_record, tiny_lm

# Small sizes of the shipped models, so that each trains in a second; a model not listed trains at its defaults.
SMALL = {"mlp": {"model.mlp.hidden": 32}, "resnet": {"model.resnet.widths": [4, 8]},
         "gpt": {"model.gpt.n_layer": 2, "model.gpt.n_head": 2, "model.gpt.n_embd": 32, "model.gpt.block_size": 32}}
STOP, END = 3, 6  # the interrupted run stops at step 3 (its checkpoint), both end at step 6: their train records
# (every step's, timings aside, as float.hex) and final weights are equal, bit for bit


# The GPT with every part of a modern one switched on (model.gpt's options; the defaults are GPT-2's).
MODERN_GPT = {"model.gpt.norm": "rmsnorm", "model.gpt.position": "rope", "model.gpt.mlp": "swiglu",
              "model.gpt.qk_norm": True, "model.gpt.logit_softcap": 30.0, "model.gpt.tie_embeddings": False}


def settings(name: str, corpus: str, options: dict | None = None) -> dict:
    """A tiny run of model `name` on data of its task: generated images, or the tests' small corpus."""
    task_run = tiny_lm(corpus) if models.MODELS[name].task == "lm" else TINY
    others = {k: v for k, v in task_run.items() if not k.startswith("model.")}  # the tiny run's own model settings
    return {**others, **SMALL.get(name, {}), **(options or {}), "model.name": name, "train.max_steps": END}


@dataclass
class GRUTable:
    hidden: int = config.opt(32, "width of the embedding and of the GRU's state", gt=0)


class GRULM(nn.Module):
    """A recurrent language model with nothing but forward: no blocks, no init_tensor, no generate_stream."""

    def __init__(self, vocab_size: int, hidden: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden)
        self.gru = nn.GRU(hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab_size)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.gru(self.embed(idx))[0])


def gru_lm(cfg: GRUTable, info) -> nn.Module:
    return GRULM(info.vocab_size, cfg.hidden)


@pytest.fixture
def with_gru(monkeypatch):
    """The GRU registered as model "gru" for one test, as `@register("gru", GRUTable, task="lm")` would."""
    monkeypatch.setitem(models.MODELS, "gru", models.Registered(gru_lm, GRUTable, "lm"))
    config.fields.cache_clear()  # the field table now has [model.gru]
    yield
    monkeypatch.undo()
    config.fields.cache_clear()


def trains_resumes_and_samples(name: str, corpus: str, tmp_path, capsys, options: dict | None = None) -> None:
    values = settings(name, corpus, options)
    whole = tmp_path / "whole"
    train.run(cfg_of(values, whole))
    resumed = tmp_path / "resumed"
    train.run(cfg_of({**values, "train.max_steps": STOP}, resumed))
    assert checkpoint.load(resumed / "last.pt")["step"] == STOP
    train.run(cfg_of({**values, "checkpoint.resume": "auto"}, resumed))
    steps = [r for r in every_record(whole) if r["kind"] == "train"]
    assert [r for r in every_record(resumed) if r["kind"] == "train"] == steps and len(steps) == END
    assert diff_states(checkpoint.load(whole / "last.pt")["model"], checkpoint.load(resumed / "last.pt")["model"]) == []
    cfg = cfg_of(values, whole)
    estimate = memory.Estimator(cfg, memory.info_of(cfg), device="cpu")(2)
    assert estimate["activations"] > 0 and estimate["peak"] > estimate["weights"] > 0
    if models.MODELS[name].task == "lm":
        capsys.readouterr()
        assert sample.main(["--run", str(whole), "--prompt", "the", "--tokens", "12"]) == 0
        assert capsys.readouterr().out.startswith("the")


@pytest.mark.parametrize("name", sorted(models.MODELS))
def test_every_registered_model_trains_resumes_exactly_is_estimated_and_samples(name, corpus, tmp_path, capsys):
    trains_resumes_and_samples(name, corpus, tmp_path, capsys)


def test_the_gpt_with_a_modern_gpts_parts_trains_resumes_exactly_is_estimated_and_samples(corpus, tmp_path, capsys):
    trains_resumes_and_samples("gpt", corpus, tmp_path, capsys, MODERN_GPT)


def test_a_model_with_nothing_but_forward_trains_resumes_and_samples(with_gru, corpus, tmp_path, capsys):
    trains_resumes_and_samples("gru", corpus, tmp_path, capsys)


def test_a_model_without_the_checkpointing_flag_is_refused_activation_checkpointing_in_one_line(with_gru, corpus,
                                                                                                 tmp_path, capsys):
    values = {**settings("gru", corpus), "model.activation_checkpointing": True, "run.out_dir": str(tmp_path / "r")}
    assert train.main(["--set", *(f"{k}={config.to_toml(v)}" for k, v in values.items())]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.activation_checkpointing" in err and "`checkpointing`" in err, err


def test_the_plain_stream_draws_what_the_gpts_own_uncached_stream_draws_within_its_block_size():
    model = gpt.GPT(vocab_size=11, block_size=32, n_layer=2, n_head=2, n_embd=16).eval()
    prompt = torch.tensor([[1, 2, 3]])
    for temperature, top_k in ((0.0, None), (0.8, 5), (1.5, None)):
        own = model.generate_stream(prompt, 20, temperature, top_k, use_cache=False,
                                    generator=torch.Generator().manual_seed(7))
        plain = sample.plain_stream(model, prompt, 20, temperature, top_k, torch.Generator().manual_seed(7))
        assert torch.equal(torch.cat(list(own), 1), torch.cat(list(plain), 1))
