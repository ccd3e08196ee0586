"""sample.py against hostile input, one behaviour per test: a tokens run samples from its run folder alone once its
data moved (or with --data-root), another vocabulary is refused even of the same size, a subword vocabulary decodes,
a vocabulary sample.py cannot decode is one line saying what to write, the text streams and Ctrl-C keeps it, a tiny
temperature is greedy, and --help shows the defaults. One tiny GPT for the module, trained on a subword vocabulary's
ids (whole words, a space, a new line) in nanoGPT's files, whose folder then moves."""
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from train_template import gpt, sample, train
from helpers import cfg_of, tiny_tokens

WORDS = sorted(set("the king my lord shall come to night and we will speak of love death honour crown sword heart "
                   "thou art fair what say you sir madam good away alas here is no more".split()))
VOCAB = ["\n", " ", *WORDS]  # token strings: the subword vocabulary's itos
PROMPT = "the king"


def word_tokens(seed: int, lines: int = 300) -> list[int]:
    """Lines of 3 to 9 words: each word's id, the space's between two words, the new line's after the last."""
    rng = random.Random(seed)
    ids = []
    for _ in range(lines):
        words = [VOCAB.index(rng.choice(WORDS)) for _ in range(rng.randint(3, 9))]
        ids += [i for w in words for i in (VOCAB.index(" "), w)][1:] + [VOCAB.index("\n")]
    return ids


def write_meta(folder: Path, meta: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


@pytest.fixture(scope="module")
def lm(tmp_path_factory) -> dict:
    """A GPT trained on the token files of `trained_on`, a folder then moved to `moved`: the run's recorded data.root
    no longer exists, as on another machine or from another working directory."""
    base = tmp_path_factory.mktemp("lm")
    trained_on = write_meta(base / "trained_on", {"vocab_size": len(VOCAB), "itos": VOCAB})
    np.array(word_tokens(0), dtype=np.uint16).tofile(trained_on / "train.bin")
    np.array(word_tokens(1), dtype=np.uint16).tofile(trained_on / "val.bin")
    values = {**tiny_tokens(trained_on), "data.tokens.block_size": 16,
              "data.tokens.eval_windows": 16, "model.gpt.block_size": 16, "model.gpt.n_layer": 1, "train.steps": 20,
              "train.eval_every": 10}
    train.run(cfg_of(values, base / "run"))
    shutil.move(trained_on, base / "moved")
    return {"run": str(base / "run"), "moved": str(base / "moved"), "base": base}


def run_sample(capsys, *argv: str) -> tuple[int, str, str]:
    code = sample.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_sample_reads_a_moved_tokens_run_with_data_root(lm, capsys):
    code, out, err = run_sample(capsys, "--run", lm["run"], "--data-root", lm["moved"], "--prompt", PROMPT,
                                "--tokens", "20")
    assert code == 0 and out.startswith(PROMPT), err


def test_a_tokens_run_samples_from_its_run_folder_alone_once_its_data_moved(lm, capsys, tmp_path):
    copied = shutil.copytree(lm["run"], tmp_path / "copied")  # to a laptop, say: the run folder without the data
    code, out, err = run_sample(capsys, "--run", str(copied), "--prompt", PROMPT, "--tokens", "20")
    with_data = run_sample(capsys, "--run", lm["run"], "--data-root", lm["moved"], "--prompt", PROMPT, "--tokens", "20")
    assert code == 0 and (code, out) == with_data[:2], err


def test_a_moved_run_that_keeps_no_vocabulary_says_to_pass_data_root(lm, capsys, tmp_path):
    older = shutil.copytree(lm["run"], tmp_path / "older")  # as a run of a template that kept no meta.json
    (older / "meta.json").unlink()
    code, out, err = run_sample(capsys, "--run", str(older), "--prompt", PROMPT)
    assert code == 1 and "pass --data-root" in one_line(err) and out == ""


def test_another_vocabulary_of_the_same_size_is_refused_in_one_line(lm, capsys):
    shuffled = write_meta(lm["base"] / "shuffled", {"vocab_size": len(VOCAB), "itos": VOCAB[::-1]})
    code, out, err = run_sample(capsys, "--run", lm["run"], "--data-root", str(shuffled), "--prompt", PROMPT)
    assert code == 2 and "fingerprint" in one_line(err) and out == ""


def test_a_data_root_that_is_not_a_folder_is_a_flag_error(lm, capsys):
    with pytest.raises(SystemExit) as exit_:
        sample.main(["--run", lm["run"], "--data-root", str(lm["base"] / "nowhere")])
    error = capsys.readouterr().err.splitlines()[-1]  # under argparse's usage lines
    assert exit_.value.code == 2 and "--data-root" in error and "not a folder" in error


def test_a_data_root_with_more_token_ids_than_the_model_is_refused(lm, capsys):
    larger = write_meta(lm["base"] / "larger",
                        {"vocab_size": 100, "itos": VOCAB + [f"<{i}>" for i in range(len(VOCAB), 100)]})
    code, _, err = run_sample(capsys, "--run", lm["run"], "--data-root", str(larger), "--prompt", "<99>")
    assert code == 2 and "100 tokens" in one_line(err)


def test_sample_decodes_a_subword_vocabulary(lm, capsys):
    code, out, err = run_sample(capsys, "--run", lm["run"], "--data-root", lm["moved"], "--prompt", PROMPT,
                                "--tokens", "30")
    model, _, _ = sample.load_model(Path(lm["run"]) / "best.pt")
    prompt = torch.tensor([[VOCAB.index("the"), VOCAB.index(" "), VOCAB.index("king")]])
    ids = model.generate(prompt, 30, temperature=0.8, top_k=50, generator=torch.Generator().manual_seed(0))
    assert code == 0 and out == "".join(VOCAB[i] for i in ids[0].tolist()) + "\n", err  # sample.py's defaults


def test_a_meta_without_a_vocabulary_says_which_vocabularies_sample_decodes(lm, capsys):
    ids_only = write_meta(lm["base"] / "ids_only", {"vocab_size": len(VOCAB)})  # GPT-2's ids from tiktoken, say
    code, _, err = run_sample(capsys, "--run", lm["run"], "--data-root", str(ids_only), "--prompt", PROMPT)
    message = one_line(err)
    assert code == 1 and "bytes" in message and "characters" in message and '"itos": [' in message


def test_sample_prints_each_token_as_it_is_made(lm, capsys, monkeypatch):
    printed = []  # what stdout holds when the model makes each token
    make = gpt.GPT.generate_stream

    def watched(*args, **kwargs):
        for token in make(*args, **kwargs):
            printed.append(capsys.readouterr().out)
            yield token

    monkeypatch.setattr(gpt.GPT, "generate_stream", watched)
    code, out, _ = run_sample(capsys, "--run", lm["run"], "--data-root", lm["moved"], "--prompt", PROMPT,
                              "--tokens", "10")
    assert code == 0 and len(printed) == 10 and printed[0] == PROMPT
    assert all(piece in VOCAB for piece in printed[1:])  # one token's text each time: a word, a space, a new line


def test_ctrl_c_keeps_the_text_printed_and_exits_130_with_one_line(lm, capsys, monkeypatch):
    argv = ["--run", lm["run"], "--data-root", lm["moved"], "--prompt", PROMPT]
    _, three_tokens, _ = run_sample(capsys, *argv, "--tokens", "3")
    make = gpt.GPT.generate_stream

    def interrupted(*args, **kwargs):
        for made, token in enumerate(make(*args, **kwargs)):
            if made == 3:
                raise KeyboardInterrupt
            yield token

    monkeypatch.setattr(gpt.GPT, "generate_stream", interrupted)
    try:
        code, out, err = run_sample(capsys, *argv, "--tokens", "50")
    except KeyboardInterrupt:  # uncaught, it would stop pytest itself
        pytest.fail("Ctrl-C escaped sample.main")
    assert code == 130 and out == three_tokens and one_line(err).strip() == "[stopped after 3 tokens]"


def test_a_tiny_temperature_samples_the_greedy_text(lm, capsys):
    argv = ["--run", lm["run"], "--data-root", lm["moved"], "--prompt", PROMPT, "--tokens", "30"]
    _, greedy, _ = run_sample(capsys, *argv, "--temperature", "0")
    code, out, err = run_sample(capsys, *argv, "--temperature", "1e-40")
    assert code == 0 and out == greedy, err


def test_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit) as exit_:
        sample.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())  # as argparse wraps it at any terminal width
    assert exit_.value.code == 0 and "(default: 0.8)" in out and "(default: 50)" in out and "(default: 500)" in out
