"""Text datasets for next-token training: windows of `block_size` tokens, each target shifted one token on.

    shakespeare  the repo's bundle (../data/shakespeare, 42 works) or a folder with its layout: works/<work>.txt.gz
                 and MANIFEST.tsv (work, title, bytes, SHA-256 of the decompressed text). Every work is checked
                 against the manifest on first use. Byte-level tokens: vocabulary 256, one byte per token.
    tokens       nanoGPT's on-disk format in a folder: train.bin, val.bin (optional test.bin) of raw token ids
                 (uint16, or uint32 when vocab_size > 65536), memory-mapped, never read whole, plus meta.json
                 {"vocab_size": int, "dtype": "uint16"|"uint32" (optional), "itos": {id: str} or [str] (optional:
                 the token strings sample.py decodes; JSON's keys are the ids' digits 0-9)} or nanoGPT's meta.pkl
                 {"vocab_size", "stoi", "itos"}; or {"vocab_size": 256, "bytes": true}: each token is a UTF-8 byte
                 (prepare.py --tokens bytes), decoded as the shakespeare dataset's; or {"vocab_size": N,
                 "tokenizer": "tokenizer.json"}: a byte-level BPE of Hugging Face `tokenizers` in that file beside it
                 (prepare.py --tokens bpe). A run keeps the vocabulary in its folder (`vocabulary_files`), and its
                 checkpoints its fingerprint (`vocab_fingerprint`), so that sample.py decodes with the right one.

Shakespeare's split is by whole works, so that no scene is split across train and evaluation: VAL_WORKS and TEST_WORKS
(below) are held out, and train is every other work in manifest order. Each split is its works' texts in manifest
order, each followed by SEPARATOR (two newlines): the bundle's three splits hold 5,057,198 + 42 x 2 tokens in all.

Evaluation uses a fixed set of window starts (the same every run): `eval_windows` starts evenly spaced over the split,
or with eval_windows=0 every non-overlapping window. Training samples any window start.

Safety: meta.pkl is read by an unpickler that refuses every import. The plain dicts, lists, strings and ints of
nanoGPT's meta need none; any pickle that wants a global (the only way a pickle runs code) is rejected unread.
"""
import codecs
import functools
import gzip
import hashlib
import json
import pickle
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

# The repo's data/, when the template sits in the repo (day12_template/template/train_template/): its bundles.
REPO_DATA = Path(__file__).resolve().parents[3] / "data"
BUNDLE = REPO_DATA / "shakespeare"
# Held out whole, a comedy and a tragedy each, about 5% of the corpus's bytes per split (fixed, not random).
VAL_WORKS = ("midsummer_nights_dream", "othello")  # 96,249 + 154,519 = 250,768 bytes (4.96%)
TEST_WORKS = ("romeo_and_juliet", "twelfth_night")  # 141,753 + 114,876 = 256,629 bytes (5.07%)
SEPARATOR = b"\n\n"  # after every work, so that one work's last line and the next one's title never run together
SCAN_CHUNK = 1 << 22  # token ids checked per step: a few MB of memory however large the .bin
DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


class TextDataError(RuntimeError):
    """The text data cannot be found or read; the one-line message names the file and says what to do."""


class TokenData:
    """A token stream cut into windows: `len(ds)` window starts, `ds.batch(epoch, indices) -> (x, y)`, both int64
    (B, block_size), x = tokens[s:s+T] and y = tokens[s+1:s+T+1]. Without `starts` (training) index i is start i;
    with `starts` (evaluation) index i is starts[i]. A np.memmap (or a contiguous slice of one) is pickled as its
    path, byte offset and length and re-opened in the DataLoader worker, instead of being copied into every worker."""
    sampling = "random"  # training draws window starts at random (data.ResumableSampler): a stream has no epochs

    def __init__(self, tokens: np.ndarray, block_size: int, starts: np.ndarray | None = None):
        self.tokens, self.block_size = tokens, block_size
        self.starts = None if starts is None else torch.as_tensor(np.asarray(starts, dtype=np.int64))
        self.window = torch.arange(block_size + 1)  # offsets of one window's x and its last target

    def __len__(self) -> int:
        return len(self.tokens) - self.block_size if self.starts is None else len(self.starts)

    def content(self) -> list:
        """What the data's fingerprint hashes (data.fingerprint): the token stream."""
        return [self.tokens]

    def batch(self, epoch: int, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The windows at `indices` (epoch is unused: text windows have no augmentation), gathered by torch from
        the tokens in place: no copy of the stream, no round trip through NumPy."""
        starts = torch.as_tensor(indices)
        if self.starts is not None:
            starts = self.starts[starts]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # a read-only memmap: torch only reads it
            tokens = torch.from_numpy(self.tokens)
        windows = tokens[starts[:, None] + self.window].long()
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        if isinstance(self.tokens, np.memmap) and self.tokens.flags.c_contiguous:
            opened = self.tokens
            while isinstance(opened.base, np.memmap):  # a slice keeps the offset of the memmap it was cut from
                opened = opened.base
            offset = opened.offset + self.tokens.ctypes.data - opened.ctypes.data
            state["tokens"] = (self.tokens.filename, self.tokens.dtype.str, offset, len(self.tokens))
        return state

    def __setstate__(self, state: dict) -> None:
        if isinstance(state["tokens"], tuple):
            path, dtype, offset, length = state["tokens"]
            state["tokens"] = np.memmap(path, dtype=np.dtype(dtype), mode="r", offset=offset, shape=(length,))
        self.__dict__.update(state)


@dataclass
class TextSplits:
    train: TokenData
    val: TokenData
    test: TokenData | None
    vocab_size: int
    block_size: int
    bytes_per_token: torch.Tensor | None  # (vocab_size,) float64: UTF-8 bytes of each token id; None if unknown
    vocab: str  # the vocabulary's fingerprint: BYTES, or vocab_fingerprint of a meta file's


def check_fits(tokens: np.ndarray, block_size: int, name: str, hint: str = "") -> None:
    if len(tokens) < block_size + 1:
        raise TextDataError(f"a window of block_size+1 tokens does not fit in {name} ({len(tokens)} tokens): "
                            f"lower data.shakespeare.block_size{hint}")


def eval_data(tokens: np.ndarray, block_size: int, eval_windows: int, table: str) -> TokenData:
    """`eval_windows` starts evenly spaced over the split, or (0) every non-overlapping window. More than the split's
    distinct windows would only repeat them (an evaluation of hours and gigabytes): refused, naming the field of the
    dataset's config `table` (data.shakespeare)."""
    last = len(tokens) - block_size - 1
    if eval_windows > last + 1:
        raise TextDataError(f"{table}.eval_windows={eval_windows:,} is more than the {last + 1:,} distinct windows "
                            f"of a {len(tokens):,}-token evaluation split: lower it (0 = every non-overlapping window)")
    if eval_windows:
        starts = np.linspace(0, last, eval_windows).round().astype(np.int64)
    else:
        starts = np.arange(0, last + 1, block_size, dtype=np.int64)
    return TokenData(tokens, block_size, starts)


# -- Shakespeare ---------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=2)
def load_corpus(root: Path) -> dict[str, bytes]:
    """{work: text} in manifest order, every text checked against its SHA-256 (once per process and folder)."""
    restore = "restore it (in the repo: `git checkout -- data/shakespeare`)"
    manifest = root / "MANIFEST.tsv"
    if not manifest.is_file() and root == BUNDLE:
        raise TextDataError(f"the bundled corpus is not at {root} (a copy outside the repo?): copy the repo's "
                            f"data/shakespeare folder and set data.root to it")
    if not manifest.is_file():
        raise TextDataError(f"{manifest} not found: data.root must be a folder with MANIFEST.tsv and works/; "
                            f"{restore}, or leave data.root empty for the repo's bundle")
    works = {}
    for line, row in enumerate(manifest.read_text(encoding="utf-8").splitlines()[1:], start=2):
        if row.count("\t") != 3:
            raise TextDataError(f"{manifest} line {line} is not work, title, bytes, sha256 (tab-separated): {restore}")
        work, _title, _size, sha256 = row.split("\t")
        path = root / "works" / f"{work}.txt.gz"
        if not path.is_file():
            raise TextDataError(f"{path} is missing (listed in {manifest}): {restore}")
        try:
            text = gzip.decompress(path.read_bytes())
        except (OSError, EOFError) as exc:
            raise TextDataError(f"{path} is not a readable gzip file ({exc}): {restore}") from None
        if hashlib.sha256(text).hexdigest() != sha256:
            raise TextDataError(f"{path} is corrupt (SHA-256 of its text is not the one in MANIFEST.tsv): {restore}")
        works[work] = text
    return works


def corpus_folder(root: str) -> Path:
    """data.root of the shakespeare dataset as a folder: the repo's bundle when empty."""
    return Path(root).resolve() if root else BUNDLE


def split_works(folder: Path) -> dict[str, dict[str, bytes]]:
    """{split: {work: text}}, each in manifest order: VAL_WORKS and TEST_WORKS held out, train every other work."""
    works = load_corpus(folder)
    held_out = VAL_WORKS + TEST_WORKS
    if not set(held_out) <= works.keys():
        raise TextDataError(f"{folder / 'MANIFEST.tsv'} lacks {sorted(set(held_out) - works.keys())}, held out by "
                            f"the split (VAL_WORKS, TEST_WORKS in text.py): use a complete copy of the corpus")
    return {"train": {w: t for w, t in works.items() if w not in held_out},
            "val": {w: t for w, t in works.items() if w in VAL_WORKS},
            "test": {w: t for w, t in works.items() if w in TEST_WORKS}}


def shakespeare(root: str, block_size: int, eval_windows: int, subset: int) -> TextSplits:
    splits = split_works(corpus_folder(root))

    def join(split: str) -> np.ndarray:
        text = b"".join(t + SEPARATOR for t in splits[split].values())
        return np.frombuffer(text, dtype=np.uint8).astype(np.uint16)

    train, val, test = join("train"), join("val"), join("test")
    train = train[:subset] if subset > 0 else train
    check_fits(train, block_size, "Shakespeare's train split", " or raise data.subset" if subset > 0 else "")
    check_fits(val, block_size, "Shakespeare's val split")
    check_fits(test, block_size, "Shakespeare's test split")
    val, test = (eval_data(split, block_size, eval_windows, "data.shakespeare") for split in (val, test))
    return TextSplits(TokenData(train, block_size), val, test, 256, block_size, torch.ones(256, dtype=torch.float64),
                      BYTES)


# -- nanoGPT's .bin files ------------------------------------------------------------------------------------------
class RefuseGlobals(pickle.Unpickler):
    """Loads plain data only: a pickle runs code solely through the globals it imports, and every import is refused."""

    def __init__(self, file, path: Path):
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str):
        raise TextDataError(f"{self.path} wants to import {module}.{name}: refused (a pickle from a dataset must "
                            f"not run code); write meta.json instead")


def meta_path(root: Path) -> Path:
    """The meta file of a token folder: meta.json, else nanoGPT's meta.pkl."""
    return root / "meta.json" if (root / "meta.json").is_file() else root / "meta.pkl"


def is_token_id(key) -> bool:
    """An int >= 0, or its decimal digits as JSON writes keys: 0-9 only, since str.isdigit also takes "²" (which
    int() refuses) and str.isdecimal other scripts' digits ("١", which int() reads as 1)."""
    return (type(key) is int and key >= 0) or (isinstance(key, str) and re.fullmatch("[0-9]+", key) is not None)


def read_meta(root: Path) -> tuple[Path, dict]:
    """(path, meta) from meta.json or meta.pkl, with an int vocab_size > 0, dtype the name of a DTYPES entry that holds
    it (given or the default: uint16 up to 65,536 ids, else uint32) and itos (if any) as {id: str}."""
    path = meta_path(root)
    if not path.is_file():
        raise TextDataError(f"{root} has no meta file (looked for meta.json and meta.pkl): write meta.json with "
                            f'{{"vocab_size": N}}')
    try:
        if path.suffix == ".json":
            meta = json.loads(path.read_text(encoding="utf-8"))
        else:
            with path.open("rb") as f:
                meta = RefuseGlobals(f, path).load()
    except TextDataError:
        raise
    except Exception as exc:  # whatever a damaged file makes the parser raise: one line naming the file
        raise TextDataError(f"{path} cannot be read ({type(exc).__name__}: {exc}): rewrite it") from None
    size = meta.get("vocab_size") if isinstance(meta, dict) else None
    if type(size) is not int or size <= 0:
        raise TextDataError(f"{path} must hold a dict with an int vocab_size > 0; got {type(meta).__name__} "
                            f"with vocab_size={size!r}")
    dtype = meta.setdefault("dtype", "uint16" if size <= 65536 else "uint32")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise TextDataError(f"{path}: dtype must be 'uint16' or 'uint32' (a string), not {dtype!r}")
    if dtype == "uint16" and size > 65536:
        raise TextDataError(f"{path}: dtype 'uint16' cannot hold vocab_size {size}: use 'uint32'")
    if "bytes" in meta and (meta["bytes"] is not True or size != 256 or "itos" in meta or "stoi" in meta):
        raise TextDataError(f'{path}: "bytes": true means token ids are UTF-8 bytes: vocab_size 256 and no itos or '
                            f"stoi; got bytes={meta['bytes']!r}, vocab_size={size}")
    if "tokenizer" in meta and (not isinstance(meta["tokenizer"], str) or Path(meta["tokenizer"]).name !=
                                meta["tokenizer"] or {"bytes", "itos", "stoi"} & meta.keys()):
        raise TextDataError(f'{path}: "tokenizer" names a tokenizer file beside it (prepare.py --tokens bpe writes '
                            f'"tokenizer.json"), and then no bytes, itos or stoi; got tokenizer={meta["tokenizer"]!r}')
    itos = meta.get("itos")
    if isinstance(itos, list):
        itos = dict(enumerate(itos))
    if itos is not None:
        if not isinstance(itos, dict) or not all(isinstance(s, str) and is_token_id(i) for i, s in itos.items()):
            raise TextDataError(f"{path}: itos must map token ids (ints, or as JSON keys their digits 0-9) to strings: "
                                f"a dict, or a list of strings")
        meta["itos"] = {int(i): s for i, s in itos.items()}  # JSON's keys are strings
    return path, meta


def checked_stoi(meta: dict, path: Path) -> dict[str, int] | None:
    """A meta's stoi (None if it has none), checked: strings to int ids below vocab_size."""
    stoi, size = meta.get("stoi"), meta["vocab_size"]
    if stoi is not None and not (isinstance(stoi, dict) and all(isinstance(s, str) and type(i) is int and 0 <= i < size
                                                                for s, i in stoi.items())):
        raise TextDataError(f"{path}: stoi/itos must map strings to int ids below vocab_size {size}")
    return stoi


def token_strings(meta: dict, path: Path) -> dict[int, str] | None:
    """A meta's token string of each id: its itos, else its stoi inverted; None if it has neither."""
    if meta.get("itos") is not None:
        return meta["itos"]
    stoi = checked_stoi(meta, path)
    return None if stoi is None else {i: s for s, i in stoi.items()}


BYTES = "utf-8 bytes"  # the fingerprint of the byte-level vocabulary (shakespeare, a tokens folder of bytes)


def vocab_fingerprint(vocab_size: int, strings: dict[int, str] | None) -> str:
    """16 hex digits of a SHA-256 of a vocabulary as sample.py decodes it: vocab_size and each id's string (not the
    meta file's format, dtype or formatting). Two vocabularies of one size but other strings differ."""
    decoding = [vocab_size, sorted(strings.items()) if strings is not None else None]
    return hashlib.sha256(json.dumps(decoding).encode("utf-8")).hexdigest()[:16]


def vocabulary_files(root: str) -> dict[str, str]:
    """A tokens folder's vocabulary as files of its own, {name: text}: a meta.json (vocab_size and itos, JSON even
    from a meta.pkl; or the name of the BPE's tokenizer.json, kept too): what a run folder keeps so that it decodes its
    samples wherever it is copied, without the data."""
    path, meta = read_meta(Path(root))
    kept, files = {"vocab_size": meta["vocab_size"]}, {}
    if meta.get("bytes"):
        kept["bytes"] = True
    if "tokenizer" in meta:
        kept["tokenizer"] = meta["tokenizer"]
        files[meta["tokenizer"]] = bpe_file(Path(root), meta["tokenizer"]).read_text(encoding="utf-8")
    elif (strings := token_strings(meta, path)) is not None:
        kept["itos"] = {str(i): s for i, s in sorted(strings.items())}
    return {"meta.json": json.dumps(kept, ensure_ascii=False) + "\n", **files}


WIDTH_PROBE = 1 << 20  # tokens looked at for the tell-tale zeros of a file of the wider dtype


def open_bin(path: Path, dtype: type, vocab_size: int, meta_path: Path, block_size: int, limit: int = 0) -> np.memmap:
    """The file's first `limit` tokens (0: all) memory-mapped, after checking its length and every token id."""
    size, itemsize = path.stat().st_size, np.dtype(dtype).itemsize
    if size % itemsize:
        raise TextDataError(f"{path} has {size} bytes, not a multiple of {itemsize} ({np.dtype(dtype).name} "
                            f"tokens): the file is truncated or {meta_path.name}'s dtype is wrong")
    count = min(size // itemsize, limit) if limit > 0 else size // itemsize
    if count < block_size + 1:
        raise TextDataError(f"a window of block_size+1 tokens does not fit in {path.name} ({count} tokens): "
                            f"lower data.tokens.block_size" + (" or raise data.subset" if limit > 0 else ""))
    tokens = np.memmap(path, dtype=dtype, mode="r", shape=(count,))
    head = tokens[:WIDTH_PROBE]
    if dtype == np.uint16 and len(head) >= 64 and head[0::2].any() and not head[1::2].any():
        raise TextDataError(f"{path}: every second uint16 id is 0, as in uint32 ids read as uint16: set "
                            f'"dtype": "uint32" in {meta_path.name} (or write the file as uint16)')
    for start in range(0, count, SCAN_CHUNK):
        chunk = tokens[start:start + SCAN_CHUNK]
        if chunk.max() >= vocab_size:
            bad = int(np.argmax(chunk >= vocab_size))
            raise TextDataError(f"{path}: token id {chunk[bad]} at position {start + bad} is >= vocab_size "
                                f"{vocab_size} of {meta_path}: the .bin and the meta file do not belong together")
    return tokens


def tokens(root: str, block_size: int, eval_windows: int, subset: int) -> TextSplits:
    folder = Path(root)
    if not root or not folder.is_dir():
        raise TextDataError(f"data.root={root!r} is not a folder: the tokens dataset needs one holding train.bin, "
                            f"val.bin (optional test.bin) and meta.json or meta.pkl")
    for name in ("train.bin", "val.bin"):
        if not (folder / name).is_file():
            raise TextDataError(f"{folder / name} not found: write the token ids there (numpy's tofile)")
    meta_path, meta = read_meta(folder)
    vocab_size, dtype = meta["vocab_size"], DTYPES[meta["dtype"]]
    train = open_bin(folder / "train.bin", dtype, vocab_size, meta_path, block_size, subset)
    val = open_bin(folder / "val.bin", dtype, vocab_size, meta_path, block_size)
    test = None
    if (folder / "test.bin").is_file():
        test = eval_data(open_bin(folder / "test.bin", dtype, vocab_size, meta_path, block_size), block_size,
                         eval_windows, "data.tokens")
    itos = meta.get("itos")
    bytes_per_token = None
    fingerprint = vocab_fingerprint(vocab_size, token_strings(meta, meta_path))
    if meta.get("bytes"):
        bytes_per_token, fingerprint = torch.ones(256, dtype=torch.float64), BYTES
    elif "tokenizer" in meta:
        bpe = BPETokenizer(bpe_file(folder, meta["tokenizer"]), vocab_size)
        bytes_per_token, fingerprint = bpe.bytes_per_token(), bpe.fingerprint
    elif itos is not None and all(i in itos for i in range(vocab_size)):
        bytes_per_token = torch.tensor([len(itos[i].encode("utf-8")) for i in range(vocab_size)],
                                       dtype=torch.float64)
    return TextSplits(TokenData(train, block_size), eval_data(val, block_size, eval_windows, "data.tokens"), test,
                      vocab_size, block_size, bytes_per_token, fingerprint)


# -- tokenizers ----------------------------------------------------------------------------------------------------
class Tokenizer(Protocol):
    vocab_size: int  # token ids are below it
    fingerprint: str  # the vocabulary's (BYTES, or vocab_fingerprint's): a checkpoint records the one it trained on

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def decoder(self) -> Callable[..., str]:
        """decode for ids that arrive a few at a time, to print text while it is written: the function returns the
        text they complete, and with final=True what is left; the pieces joined are decode's text."""


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255 (shakespeare)."""

    vocab_size, fingerprint = 256, BYTES

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")

    def decoder(self) -> Callable[..., str]:
        """A character once all its bytes have come: one split across tokens is held back, not printed as U+FFFD."""
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

        def decode(ids: list[int], final: bool = False) -> str:
            return utf8.decode(bytes(ids), final)

        return decode


class VocabTokenizer:
    """Token strings from a meta file's stoi/itos: one character each (nanoGPT's shakespeare_char) or longer (a
    subword vocabulary). Decoding joins the tokens' strings. Encoding takes, left to right, the longest token string
    that matches: for characters the only split; for subwords a valid split but not necessarily the tokenizer's own
    (BPE applies its learned merges in order), so a prompt may reach the model split as its training text rarely was."""

    def __init__(self, stoi: dict[str, int], itos: dict[int, str], vocab_size: int, meta_path: Path):
        self.stoi, self.itos, self.vocab_size, self.meta_path = stoi, itos, vocab_size, meta_path
        self.longest = max(map(len, stoi), default=0)
        self.fingerprint = vocab_fingerprint(vocab_size, itos)

    def encode(self, text: str) -> list[int]:
        ids, unmatched, at = [], [], 0
        while at < len(text):
            lengths = range(min(self.longest, len(text) - at), 0, -1)
            match = next((text[at:at + n] for n in lengths if text[at:at + n] in self.stoi), None)
            if match is None:
                unmatched.append(text[at])
                at += 1
            else:
                ids.append(self.stoi[match])
                at += len(match)
        if unmatched:
            raise TextDataError(f"no token of the vocabulary in {self.meta_path} matches the text at the characters "
                                f"{''.join(sorted(set(unmatched)))!r}")
        return ids

    def decode(self, ids: list[int]) -> str:
        return "".join(self.itos.get(i, "\ufffd") for i in ids)  # an id without a string, as bytes' errors="replace"

    def decoder(self) -> Callable[..., str]:
        """Every token is whole characters: nothing is held back."""

        def decode(ids: list[int], final: bool = False) -> str:
            return self.decode(ids)

        return decode


def bpe_file(folder: Path, name: str) -> Path:
    path = folder / name
    if not path.is_file():
        raise TextDataError(f"{path} not found, named by {folder / 'meta.json'}: the BPE's tokenizer file belongs "
                            f"beside it (prepare.py --tokens bpe writes both)")
    return path


class BPETokenizer:
    """A byte-level BPE of Hugging Face `tokenizers` (prepare.py --tokens bpe). Byte-level: each character of a
    token's string stands for one byte (GPT-2's map of the 256 bytes to printable characters), so any text encodes,
    and a token's UTF-8 bytes are its string's length."""

    def __init__(self, path: Path, vocab_size: int):
        try:
            from tokenizers import Tokenizer as HFTokenizer
        except ImportError:
            raise TextDataError(f"{path} is a tokenizer of Hugging Face tokenizers, which is not installed: "
                                f"pip install tokenizers (or the template's extra: pip install -e '.[bpe]')") from None
        try:
            self.hf = HFTokenizer.from_file(str(path))
        except Exception as exc:  # the library's own parse error: one line naming the file
            raise TextDataError(f"{path} is not a tokenizer file that tokenizers reads ({exc}): write it again "
                                f"with prepare.py --tokens bpe") from None
        self.strings = {i: s for s, i in self.hf.get_vocab().items()}
        if sorted(self.strings) != list(range(vocab_size)):
            raise TextDataError(f"{path} holds {len(self.strings):,} token ids, not the ids 0..{vocab_size - 1} of "
                                f"its meta.json's vocab_size: the two files do not belong together")
        self.vocab_size, self.path = vocab_size, path
        self.fingerprint = vocab_fingerprint(vocab_size, self.strings)

    def bytes_per_token(self) -> torch.Tensor:
        return torch.tensor([len(self.strings[i]) for i in range(self.vocab_size)], dtype=torch.float64)

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids)

    def decoder(self) -> Callable[..., str]:
        """The text decoded so far, less a character whose bytes are still arriving (decode's U+FFFD at the end)."""
        ids, shown = [], 0

        def decode(new: list[int], final: bool = False) -> str:
            nonlocal shown
            ids.extend(new)
            done = self.decode(ids) if final else self.decode(ids).rstrip("\ufffd")
            piece = done[shown:]
            shown += len(piece)
            return piece

        return decode


def tokenizer(dataset: str, root: str) -> Tokenizer:
    if dataset == "shakespeare":
        return ByteTokenizer()
    if dataset != "tokens":
        raise TextDataError(f"no tokenizer for dataset {dataset!r}: the text datasets are shakespeare and tokens")
    if not root or not Path(root).is_dir():
        raise TextDataError(f"data.root={root!r} is not a folder: the tokens dataset's meta file lives there")
    meta_path, meta = read_meta(Path(root))
    if meta.get("bytes"):
        return ByteTokenizer()
    if "tokenizer" in meta:
        return BPETokenizer(bpe_file(Path(root), meta["tokenizer"]), meta["vocab_size"])
    itos, size = token_strings(meta, meta_path), meta["vocab_size"]
    if itos is None:
        raise TextDataError(f"{meta_path} has no itos/stoi, so its token ids cannot be read as text: sample.py "
                            f"decodes bytes (the shakespeare dataset) and a meta file's vocabulary of characters or "
                            f'longer token strings; write the strings into meta.json as "itos": [string of id 0, '
                            f"string of id 1, ...]")
    stoi = checked_stoi(meta, meta_path)
    if stoi is None:
        stoi = {s: i for i, s in itos.items()}
    return VocabTokenizer(stoi, itos, size, meta_path)
