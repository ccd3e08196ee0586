"""prepare.py, your own text in three commands: a folder of text files becomes token files that train.py trains a GPT
on and sample.py writes text from; whole documents are held out; the hygiene report is printed; bad input is one
line and writes nothing."""
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from train_template import prepare, sample, text, train
from conftest import pseudo_work
from helpers import cfg_of, tiny_tokens

DOCUMENTS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot")


def text_folder(tmp_path, names=DOCUMENTS, lines: int = 120):
    folder = tmp_path / "texts"
    folder.mkdir()
    for name in names:
        (folder / f"{name}.txt").write_bytes(pseudo_work(name, lines))
    return folder


def split_text(out, split: str) -> bytes:
    """A split's token file read back as the bytes it encodes (any tokenizer)."""
    ids = np.fromfile(out / f"{split}.bin", dtype=np.uint16)
    return text.tokenizer("tokens", str(out)).decode(ids.tolist()).encode("utf-8")


TOKENS = {"chars": [], "bytes": [], "bpe": ["--vocab-size", "300"]}  # --tokens, and its other flags


@pytest.mark.parametrize("tokens", TOKENS)
def test_a_folder_of_text_files_is_prepared_trained_on_and_sampled(tokens, tmp_path, capsys):
    out = tmp_path / "my_text"
    assert prepare.main([str(text_folder(tmp_path)), str(out), "--tokens", tokens, *TOKENS[tokens]]) == 0
    values = {**tiny_tokens(out), "train.max_steps": 4}
    train.run(cfg_of(values, tmp_path / "run"))
    capsys.readouterr()
    assert sample.main(["--run", str(tmp_path / "run"), "--prompt", "the king", "--tokens", "20"]) == 0
    assert capsys.readouterr().out.startswith("the king")


@pytest.mark.parametrize("tokens", TOKENS)
def test_whole_documents_are_held_out_each_in_exactly_one_split(tokens, tmp_path):
    folder, out = text_folder(tmp_path), tmp_path / "my_text"
    assert prepare.main([str(folder), str(out), "--held-out", "0.1", "--tokens", tokens, *TOKENS[tokens]]) == 0
    splits = {split: split_text(out, split) for split in prepare.SPLITS}
    homes = {name: [s for s, data in splits.items() if pseudo_work(name, 120) in data] for name in DOCUMENTS}
    assert all(len(found) == 1 for found in homes.values()), homes
    per_split = {split: sum(found == [split] for found in homes.values()) for split in prepare.SPLITS}
    assert per_split["val"] >= 1 and per_split["test"] >= 1 and per_split["train"] >= 1, per_split
    assert sum(map(len, splits.values())) == sum(len(pseudo_work(n, 120)) + 2 for n in DOCUMENTS)  # + blank lines


def test_the_hygiene_report_is_printed_before_anything_is_written(tmp_path, capsys):
    folder = text_folder(tmp_path)
    (folder / "alpha.txt").write_bytes(b"<p>the king &amp; my lord</p>\n" + pseudo_work("alpha", 120))
    assert prepare.main([str(folder), str(tmp_path / "my_text")]) == 0
    report = capsys.readouterr().out
    assert "PROBLEM markup" in report and "leak" in report and report.index("leak") < report.index("wrote")


def test_fewer_than_three_documents_is_one_line_exit_1_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "my_text"
    assert prepare.main([str(text_folder(tmp_path, DOCUMENTS[:2])), str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "at least 3" in err and not out.exists()


def test_an_existing_output_folder_is_refused_exit_2_and_left_as_it_was(tmp_path, capsys):
    out = tmp_path / "my_text"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert prepare.main([str(text_folder(tmp_path)), str(out)]) == 2
    assert capsys.readouterr().err.count("\n") == 1 and [p.name for p in out.iterdir()] == ["notes.txt"]


def test_a_file_that_is_not_utf8_is_one_line_for_characters_and_prepares_as_bytes(tmp_path, capsys):
    folder = text_folder(tmp_path)
    (folder / "latin.txt").write_bytes("caf\u00e9 ".encode("latin-1") * 200)
    assert prepare.main([str(folder), str(tmp_path / "chars")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not UTF-8" in err and "--tokens bytes" in err
    assert not (tmp_path / "chars").exists() and list(tmp_path.glob(".chars*")) == []
    assert prepare.main([str(folder), str(tmp_path / "bytes"), "--tokens", "bytes"]) == 0


def test_the_readmes_meta_json_example_is_a_meta_file_the_tokens_dataset_reads(tmp_path):
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    example = re.search(r"```json\n(.*?)```", readme[readme.index("## Your own text"):], re.S).group(1)
    (tmp_path / "meta.json").write_text(example)
    assert text.tokenizer("tokens", str(tmp_path)).decode([2, 1, 2, 0]) == "a a\n"


def test_the_bpe_is_learned_from_the_train_split_alone(tmp_path):
    raw = {"train": pseudo_work("alpha", 300), "val": b"zyzzyva " * 500, "test": pseudo_work("bravo", 30)}
    _, _, files = prepare.tokenization("bpe", raw, 400)
    assert "zyz" not in files[prepare.BPE_FILE] and "Ġthe" in files[prepare.BPE_FILE]  # Ġ: GPT-2's space


def bpe_folder(tmp_path, vocab_size: int = 300) -> Path:
    out = tmp_path / "bpe"
    assert prepare.main([str(text_folder(tmp_path)), str(out), "--tokens", "bpe", "--vocab-size", str(vocab_size)]) == 0
    return out


def test_the_bpe_encodes_any_text_and_streams_a_character_only_once_its_bytes_have_come(tmp_path):
    bpe = text.tokenizer("tokens", str(bpe_folder(tmp_path)))
    written = "the king, caf\u00e9 \u2014 \u201cnever\u201d \U0001f451 seen"  # bytes BPE never merged
    ids = bpe.encode(written)
    assert bpe.decode(ids) == written and len(ids) < len(written.encode("utf-8"))
    decode = bpe.decoder()
    pieces = [decode([i]) for i in ids] + [decode([], final=True)]
    assert "".join(pieces) == written and "\ufffd" not in "".join(pieces)


def test_bpe_tokens_bytes_add_up_to_the_splits_bytes_so_bits_per_byte_are_exact(tmp_path):
    out = bpe_folder(tmp_path)
    splits = text.tokens(str(out), 32, 0, 0)
    for split in ("train", "val"):
        ids = torch.from_numpy(np.fromfile(out / f"{split}.bin", dtype=np.uint16).astype(np.int64))
        assert splits.bytes_per_token[ids].sum().item() == len(split_text(out, split))


def test_a_bpe_run_folder_samples_after_its_data_folder_is_gone(tmp_path, capsys):
    out = bpe_folder(tmp_path)
    train.run(cfg_of({**tiny_tokens(out), "train.max_steps": 2}, tmp_path / "run"))
    shutil.rmtree(out)
    capsys.readouterr()
    assert sample.main(["--run", str(tmp_path / "run"), "--prompt", "the king", "--tokens", "10"]) == 0
    assert capsys.readouterr().out.startswith("the king")


@pytest.mark.parametrize("damage", ["missing", "not json", "fewer tokens", "beside itos"])
def test_a_bpe_folder_with_a_damaged_tokenizer_file_is_one_line_naming_it(damage, tmp_path):
    out = bpe_folder(tmp_path)
    tokenizer, meta = out / prepare.BPE_FILE, json.loads((out / "meta.json").read_text())
    if damage == "missing":
        tokenizer.unlink()
    elif damage == "not json":
        tokenizer.write_text("{")
    elif damage == "fewer tokens":
        (out / "meta.json").write_text(json.dumps({**meta, "vocab_size": meta["vocab_size"] + 1}))
    else:
        (out / "meta.json").write_text(json.dumps({**meta, "itos": ["a"]}))
    with pytest.raises(text.TextDataError) as error:
        text.tokenizer("tokens", str(out))
    assert len(str(error.value).splitlines()) == 1 and str(out) in str(error.value)
