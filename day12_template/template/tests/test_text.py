"""text.py, the text datasets: the bundle verifies, held-out works stay whole, bad token files are refused in one
line, a pickle never runs code, windows and tokenizers are what they claim."""
import gzip
import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from train_template import text

def one_line(exc_info) -> str:
    message = str(exc_info.value)
    assert "\n" not in message, message
    return message


def split_bytes(data: text.TokenData) -> bytes:
    return np.asarray(data.tokens).astype(np.uint8).tobytes()


def write_tokens(folder: Path, train, val, meta: dict | None = None, dtype=np.uint16, pkl: bool = False) -> Path:
    """nanoGPT's layout: raw ids via tofile, plus meta.json (or meta.pkl)."""
    folder.mkdir(parents=True, exist_ok=True)
    np.array(train, dtype=dtype).tofile(folder / "train.bin")
    np.array(val, dtype=dtype).tofile(folder / "val.bin")
    if meta is not None and pkl:
        (folder / "meta.pkl").write_bytes(pickle.dumps(meta))
    elif meta is not None:
        (folder / "meta.json").write_text(json.dumps(meta))
    return folder


CHARS = "\n !abcdefghij"
CHAR_META = {"vocab_size": len(CHARS), "itos": dict(enumerate(CHARS)), "stoi": {c: i for i, c in enumerate(CHARS)}}


# -- the Shakespeare layout (a generated corpus: conftest.py) ---------------------------------------------
def test_val_and_test_are_whole_works_disjoint_from_train(corpus):
    works = text.load_corpus(Path(corpus))
    splits = text.shakespeare(corpus, 64, 10, 0)
    train = split_bytes(splits.train)
    for data, names in ((splits.val, text.VAL_WORKS), (splits.test, text.TEST_WORKS)):
        assert split_bytes(data) == b"".join(works[w] + text.SEPARATOR for w in works if w in names)
        for w in names:
            middle = works[w][len(works[w]) // 2:len(works[w]) // 2 + 500]
            assert middle not in train, f"{w} leaks into train"
    assert not set(text.VAL_WORKS) & set(text.TEST_WORKS)


def test_batch_windows_are_the_shifted_pairs(corpus):
    splits = text.shakespeare(corpus, 32, 7, 0)
    tokens = np.asarray(splits.train.tokens).astype(np.int64)
    starts = torch.tensor([0, 5, len(splits.train) - 1])
    x, y = splits.train.batch(0, starts)
    assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (3, 32)
    for row, s in enumerate(starts.tolist()):
        assert torch.equal(x[row], torch.from_numpy(tokens[s:s + 32]))
        assert torch.equal(y[row], torch.from_numpy(tokens[s + 1:s + 33]))


def test_eval_windows_are_evenly_spaced_over_the_split(corpus):
    splits = text.shakespeare(corpus, 32, 7, 0)
    starts = splits.val.starts
    assert len(splits.val) == 7 and starts[0] == 0 and starts[-1] == len(splits.val.tokens) - 33
    assert np.ptp(np.diff(starts)) <= 1


def test_zero_eval_windows_means_every_non_overlapping_window(corpus):
    splits = text.shakespeare(corpus, 32, 0, 0)
    n = len(splits.val.tokens)
    assert len(splits.val) == (n - 1) // 32 and np.all(np.diff(splits.val.starts) == 32)
    x, y = splits.val.batch(-1, torch.tensor([len(splits.val) - 1]))
    assert y.shape == (1, 32)


def test_subset_keeps_the_first_training_tokens(corpus):
    full, small = text.shakespeare(corpus, 16, 4, 0), text.shakespeare(corpus, 16, 4, 1000)
    assert len(small.train.tokens) == 1000 and np.array_equal(small.train.tokens, full.train.tokens[:1000])
    assert len(small.train) == 1000 - 16


def copy_corpus(corpus: str, tmp_path: Path) -> Path:
    root = tmp_path / "shakespeare"
    shutil.copytree(corpus, root)
    return root


def test_corrupt_work_is_named(corpus, tmp_path):
    root = copy_corpus(corpus, tmp_path)
    path = root / "works" / "hamlet.txt.gz"
    path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes()).replace(b"king", b"duke")))
    with pytest.raises(text.TextDataError) as err:
        text.shakespeare(str(root), 64, 10, 0)
    assert str(path) in one_line(err) and "git checkout -- data/shakespeare" in str(err.value)


def test_missing_work_is_named(corpus, tmp_path):
    root = copy_corpus(corpus, tmp_path)
    (root / "works" / "sonnets.txt.gz").unlink()
    with pytest.raises(text.TextDataError) as err:
        text.shakespeare(str(root), 64, 10, 0)
    assert "sonnets.txt.gz is missing" in one_line(err)


def test_window_longer_than_shakespeare_subset_is_refused(corpus):
    with pytest.raises(text.TextDataError) as err:
        text.shakespeare(corpus, 64, 10, 50)
    assert "lower data.shakespeare.block_size" in one_line(err)


# -- nanoGPT's .bin files --------------------------------------------------------------------------------------
def test_tokens_reads_bin_files_and_meta_json(tmp_path):
    root = write_tokens(tmp_path, [1, 2, 3, 4, 5, 6, 7, 8], [3, 2, 1, 0, 4], {"vocab_size": 9})
    splits = text.tokens(str(root), 4, 0, 0)
    assert isinstance(splits.train.tokens, np.memmap) and splits.test is None and splits.bytes_per_token is None
    assert (splits.vocab_size, len(splits.train), len(splits.val)) == (9, 4, 1)
    x, y = splits.train.batch(0, torch.tensor([1]))
    assert x.tolist() == [[2, 3, 4, 5]] and y.tolist() == [[3, 4, 5, 6]]


def test_tokens_reads_nanogpt_meta_pkl_and_test_bin(tmp_path):
    root = write_tokens(tmp_path, list(range(13)) * 3, [0, 1, 2, 3, 4, 5], CHAR_META, pkl=True)  # 2 windows of 4
    np.array([5, 4, 3, 2, 1, 0], dtype=np.uint16).tofile(root / "test.bin")
    splits = text.tokens(str(root), 4, 2, 0)
    assert len(splits.test) == 2 and splits.test.batch(-1, torch.tensor([1]))[1].tolist() == [[3, 2, 1, 0]]
    assert torch.equal(splits.bytes_per_token, torch.ones(13, dtype=torch.float64))


def test_a_kept_vocabulary_is_json_and_has_the_fingerprint_of_the_meta_pkl_it_came_from(tmp_path):
    """What a run folder keeps (vocabulary_files) decodes as its data does: nanoGPT's meta.pkl with stoi only, read
    back from a meta.json of plain strings."""
    stoi_only = {"vocab_size": 13, "stoi": {s: i for i, s in CHAR_META["itos"].items()}}
    root = write_tokens(tmp_path / "data", list(range(13)) * 3, [0, 1, 2, 3, 4], stoi_only, pkl=True)
    kept = tmp_path / "run"
    kept.mkdir()
    files = text.vocabulary_files(str(root))
    assert list(files) == ["meta.json"]
    (kept / "meta.json").write_text(files["meta.json"])
    fingerprints = [text.tokens(str(root), 4, 0, 0).vocab, text.tokenizer("tokens", str(root)).fingerprint,
                    text.tokenizer("tokens", str(kept)).fingerprint]
    assert len(set(fingerprints)) == 1 and fingerprints[0] != text.BYTES


def test_odd_byte_length_is_refused(tmp_path):
    root = write_tokens(tmp_path, [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6], {"vocab_size": 9})
    with (root / "val.bin").open("ab") as f:
        f.write(b"\x00")
    with pytest.raises(text.TextDataError) as err:
        text.tokens(str(root), 4, 0, 0)
    assert "val.bin has 13 bytes, not a multiple of 2" in one_line(err)


def test_token_id_beyond_vocab_is_refused_with_its_position(tmp_path):
    root = write_tokens(tmp_path, [1, 2, 3, 9, 5, 12], [1, 2, 3, 4, 5], {"vocab_size": 9})
    with pytest.raises(text.TextDataError) as err:
        text.tokens(str(root), 4, 0, 0)
    assert "train.bin: token id 9 at position 3 is >= vocab_size 9" in one_line(err)


def test_missing_meta_is_refused_naming_what_was_looked_for(tmp_path):
    root = write_tokens(tmp_path, [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5])
    with pytest.raises(text.TextDataError) as err:
        text.tokens(str(root), 4, 0, 0)
    assert "meta.json" in one_line(err) and "meta.pkl" in str(err.value)


def test_missing_val_bin_is_refused(tmp_path):
    root = write_tokens(tmp_path, [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5], {"vocab_size": 9})
    (root / "val.bin").unlink()
    with pytest.raises(text.TextDataError) as err:
        text.tokens(str(root), 4, 0, 0)
    assert str(root / "val.bin") in one_line(err)


def test_window_longer_than_split_is_refused(tmp_path):
    root = write_tokens(tmp_path, list(range(9)) * 4, [1, 2, 3], {"vocab_size": 9})
    with pytest.raises(text.TextDataError) as err:
        text.tokens(str(root), 4, 0, 0)
    assert one_line(err) == ("a window of block_size+1 tokens does not fit in val.bin (3 tokens): "
                             "lower data.tokens.block_size")


class Evil:
    def __reduce__(self):
        return print, ("pwned",)


def test_malicious_meta_pkl_is_refused_without_running_it(tmp_path, capsys):
    root = write_tokens(tmp_path, [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5])
    (root / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": 9, "itos": Evil()}))
    with pytest.raises(text.TextDataError) as err:
        text.tokens(str(root), 4, 0, 0)
    assert "wants to import builtins.print: refused" in one_line(err)
    assert "pwned" not in capsys.readouterr().out


def test_meta_without_int_vocab_size_is_refused(tmp_path):
    root = write_tokens(tmp_path, [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5], ["not", "a", "dict"], pkl=True)
    with pytest.raises(text.TextDataError) as err:
        text.tokens(str(root), 4, 0, 0)
    assert "int vocab_size > 0" in one_line(err)


def test_uint32_tokens_with_vocab_70000_work(tmp_path):
    ids = [0, 69_999, 65_536, 12, 70_000 - 2, 3]
    root = write_tokens(tmp_path, ids, ids, {"vocab_size": 70_000}, dtype=np.uint32)
    x, y = text.tokens(str(root), 4, 0, 0).train.batch(0, torch.tensor([0, 1]))
    assert x.tolist() == [ids[0:4], ids[1:5]] and y.tolist() == [ids[1:5], ids[2:6]]


def test_uint16_cannot_hold_vocab_70000(tmp_path):
    root = write_tokens(tmp_path, [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5], {"vocab_size": 70_000, "dtype": "uint16"})
    with pytest.raises(text.TextDataError) as err:
        text.tokens(str(root), 4, 0, 0)
    assert "cannot hold vocab_size 70000" in one_line(err)


def test_memmapped_token_data_pickles_by_path_to_an_equal_batch(tmp_path):
    rng = np.random.default_rng(0)
    root = write_tokens(tmp_path, rng.integers(0, 500, 100_000), rng.integers(0, 500, 1000), {"vocab_size": 500})
    data = text.tokens(str(root), 16, 0, 0).train
    blob = pickle.dumps(data)
    copy = pickle.loads(blob)
    indices = torch.tensor([0, 17, len(data) - 1])
    assert len(blob) < 10_000 and isinstance(copy.tokens, np.memmap)
    for a, b in zip(data.batch(0, indices), copy.batch(0, indices)):
        assert torch.equal(a, b)


def test_slice_of_a_memmap_pickles_to_an_equal_batch(tmp_path):
    root = write_tokens(tmp_path, np.arange(1000) % 300, np.arange(100), {"vocab_size": 300})
    data = text.TokenData(text.tokens(str(root), 8, 0, 0).train.tokens[250:600], 8)
    copy = pickle.loads(pickle.dumps(data))
    indices = torch.tensor([0, 99, len(data) - 1])
    assert data.batch(0, indices)[0][0, 0] == 250
    assert all(torch.equal(a, b) for a, b in zip(data.batch(0, indices), copy.batch(0, indices)))


def test_in_memory_token_data_pickles_to_an_equal_batch(corpus):
    data = text.shakespeare(corpus, 32, 5, 0).val
    copy = pickle.loads(pickle.dumps(data))
    indices = torch.arange(len(data))
    assert all(torch.equal(a, b) for a, b in zip(data.batch(-1, indices), copy.batch(-1, indices)))


# -- tokenizers ------------------------------------------------------------------------------------------------
def test_byte_tokenizer_round_trips():
    tok = text.tokenizer("shakespeare", "")
    sample = "To be, or not to be: that is the question. — ‘Ay’"
    assert tok.encode("Ay") == [65, 121] and tok.decode(tok.encode(sample)) == sample


def test_char_tokenizer_round_trips(tmp_path):
    root = write_tokens(tmp_path, [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5], CHAR_META, pkl=True)
    tok = text.tokenizer("tokens", str(root))
    assert tok.encode("a b!\n") == [3, 1, 4, 2, 0] and tok.decode(tok.encode("hi jab!")) == "hi jab!"


def test_char_tokenizer_from_json_itos_list_round_trips(tmp_path):
    root = write_tokens(tmp_path, [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5], {"vocab_size": 13, "itos": list(CHARS)})
    tok = text.tokenizer("tokens", str(root))
    assert tok.decode(tok.encode("bad cab\n")) == "bad cab\n"


def test_char_tokenizer_names_unknown_characters(tmp_path):
    root = write_tokens(tmp_path, [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5], CHAR_META, pkl=True)
    with pytest.raises(text.TextDataError) as err:
        text.tokenizer("tokens", str(root)).encode("abcXYZ")
    assert "'XYZ'" in one_line(err)


def test_tokenizer_without_itos_or_stoi_is_refused(tmp_path):
    root = write_tokens(tmp_path, [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5], {"vocab_size": 9})
    with pytest.raises(text.TextDataError) as err:
        text.tokenizer("tokens", str(root))
    assert "no itos/stoi" in one_line(err)


def test_subword_tokenizer_encodes_by_greedy_longest_match(tmp_path):
    meta = {"vocab_size": 5, "itos": ["a", "b", "ab", "abc", " "]}
    root = write_tokens(tmp_path, [1, 2, 3, 4, 0, 1], [1, 2, 3, 4, 0], meta)
    tok = text.tokenizer("tokens", str(root))
    assert tok.encode("abcab ba") == [3, 2, 4, 1, 0] and tok.decode([3, 2, 4, 1, 0]) == "abcab ba"


def test_tokenizer_refuses_ids_beyond_vocab_size(tmp_path):
    meta = {"vocab_size": 2, "stoi": {"a": 0, "b": 7}}
    root = write_tokens(tmp_path, [1, 0, 1, 0, 1, 0], [1, 0, 1, 0, 1], meta, pkl=True)
    with pytest.raises(text.TextDataError) as err:
        text.tokenizer("tokens", str(root))
    assert "below vocab_size 2" in one_line(err)


def test_byte_decoder_prints_only_complete_characters():
    tok = text.tokenizer("shakespeare", "")
    ids = list("aé€😀".encode()) + [0xFF] + list("€".encode())[:2]  # an invalid byte, a character cut short
    decode = tok.decoder()
    pieces = [decode([i]) for i in ids] + [decode([], final=True)]
    assert pieces[:8] == ["a", "", "é", "", "", "€", "", ""] and "".join(pieces) == tok.decode(ids)


# -- meta files that lie about their types -----------------------------------------------------------------------
def test_meta_dtype_that_is_not_a_name_is_refused_in_one_line(tmp_path):
    root = write_tokens(tmp_path, [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5], {"vocab_size": 9, "dtype": ["uint16"]})
    with pytest.raises(text.TextDataError) as err:
        text.tokens(str(root), 4, 0, 0)
    assert str(root / "meta.json") in one_line(err) and "'uint16' or 'uint32'" in str(err.value)


@pytest.mark.parametrize("key", ["²", "١"])  # digits to str.isdigit (and int() takes "١" as 1), not ids
def test_itos_id_that_is_not_ascii_digits_is_refused_in_one_line(tmp_path, key):
    meta = {"vocab_size": 3, "itos": {"0": "a", "2": "c", key: "b"}}
    root = write_tokens(tmp_path, [1, 2, 0, 1, 2, 0], [1, 2, 0, 1, 2], meta)
    with pytest.raises(text.TextDataError) as err:
        text.tokens(str(root), 4, 0, 0)
    assert str(root / "meta.json") in one_line(err) and "digits 0-9" in str(err.value)
