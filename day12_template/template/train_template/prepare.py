"""prepare.py — your own text as token files: a folder of text files in; train.bin, val.bin, test.bin, meta.json out.

    python prepare.py my_texts data/my_text                  # characters: one token per distinct character
    python prepare.py my_texts data/my_text --tokens bytes   # UTF-8 bytes: 256 tokens, any text, longer sequences
    python prepare.py my_texts data/my_text --tokens bpe --vocab-size 2048   # a byte-level BPE learned from train
    python train.py --config configs/tokens_cpu.toml --set data.root=data/my_text
    python sample.py --run runs/tokens_cpu --prompt "Once"

Every *.txt file under the folder (--pattern), in path order, is one document. Whole documents are held out, so that
no text is split between training and evaluation: a seeded shuffle of the documents gives val the first ones until
they hold --held-out of the bytes (at least one document), test the next ones as much, and train the rest. Each split
is its documents in path order, each followed by a blank line. The text-hygiene report (troubleshoot.text_hygiene:
broken UTF-8, markup, control characters, lengths, duplicates, boilerplate, passages of val or test also in train)
is printed before anything is written; what it finds is reported, not changed. The files are nanoGPT's (text.py):
uint16 token ids (uint32 past 65,536 tokens) and a meta.json with the vocabulary, written to a temporary folder and
renamed into place, so an interrupted run leaves no half-written output.
--tokens bpe learns GPT-2's kind of tokenizer (byte-level BPE, Hugging Face `tokenizers`, offline) from the train
split alone, so that no val or test text shapes the vocabulary, and writes it as tokenizer.json beside meta.json: any
text encodes, common words become one token, and a window of block_size tokens holds several times the text.
Exit codes: 0 written; 1 input that cannot be prepared (fewer than 3 documents, a file that is not UTF-8 for
characters or BPE); 2 bad flags, or an output folder that exists.
"""
import argparse
import json
import os
import random
import shutil
import sys
from functools import partial
from pathlib import Path

import numpy as np

from . import text, train
from .troubleshoot import text_hygiene

SPLITS = ("train", "val", "test")


class PrepareError(Exception):
    """Input that cannot become token files (exit 1)."""


def read_documents(folder: Path, pattern: str) -> dict[str, bytes]:
    """{path relative to `folder`: its bytes} of every file matching `pattern` below it, hidden ones left out."""
    paths = sorted(p for p in folder.rglob(pattern) if p.is_file() and not any(
        part.startswith(".") for part in p.relative_to(folder).parts))
    if len(paths) < len(SPLITS):
        raise PrepareError(f"{folder} holds {len(paths)} file(s) matching {pattern!r}; train, val and test each "
                           f"need whole documents, so at least 3: split a long text into chapters, one file each")
    return {str(p.relative_to(folder)): p.read_bytes() for p in paths}


def hold_out(documents: dict[str, bytes], share: float, seed: int) -> dict[str, list[str]]:
    """{split: document names in path order}: val, then test, take shuffled documents until each holds `share` of
    the bytes (at least one document each); train keeps the rest."""
    order = sorted(documents)
    random.Random(seed).shuffle(order)
    total = sum(map(len, documents.values()))
    splits = {"val": [], "test": []}
    for held in splits.values():
        size = 0
        while order and (not held or size < share * total):
            held.append(order.pop(0))
            size += len(documents[held[-1]])
    if not order:
        raise PrepareError(f"holding out {share:.0%} of the bytes for val and for test leaves train no document: "
                           f"lower --held-out, or add documents")
    return {"train": sorted(order), "val": sorted(splits["val"]), "test": sorted(splits["test"])}


def joined(documents: dict[str, bytes], names: list[str]) -> bytes:
    return b"".join(documents[n] + text.SEPARATOR for n in names)


def utf8(split: str, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PrepareError(f"the {split} text is not UTF-8 at byte {exc.start:,}: prepare it with --tokens bytes, "
                           f"or convert the file to UTF-8") from None


def as_characters(raw: dict[str, bytes]) -> tuple[dict[str, np.ndarray], dict]:
    """Each split's character ids, and a meta with the characters of all splits as the vocabulary (nanoGPT's
    shakespeare_char)."""
    code_points = {split: np.frombuffer(utf8(split, data).encode("utf-32-le"), dtype=np.uint32)
                   for split, data in raw.items()}
    vocab = np.unique(np.concatenate(list(code_points.values())))
    meta = {"vocab_size": len(vocab), "itos": [chr(c) for c in vocab]}
    dtype = np.uint16 if len(vocab) <= 65536 else np.uint32
    return {split: np.searchsorted(vocab, cps).astype(dtype) for split, cps in code_points.items()}, meta


def as_bytes(raw: dict[str, bytes]) -> tuple[dict[str, np.ndarray], dict]:
    """Each split's bytes as token ids 0..255."""
    return ({split: np.frombuffer(data, dtype=np.uint8).astype(np.uint16) for split, data in raw.items()},
            {"vocab_size": 256, "bytes": True})


def characters(raw: bytes) -> int:
    return len(raw.decode("utf-8", errors="replace"))


def train_bpe(train: str, vocab_size: int):
    """A byte-level BPE of at most `vocab_size` tokens (the 256 bytes and the merges learned), trained on `train`."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise PrepareError("--tokens bpe trains a Hugging Face tokenizers BPE, which is not installed: pip install "
                           "tokenizers (or the template's extra: pip install -e '.[bpe]')") from None
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2's: words, then their bytes
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator([train], trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return bpe


def as_bpe(bpe, raw: dict[str, bytes]) -> tuple[dict[str, np.ndarray], dict]:
    """Each split's ids under the trained BPE, and a meta that names its tokenizer file."""
    size = bpe.get_vocab_size()
    dtype = np.uint16 if size <= 65536 else np.uint32
    ids = {split: np.array(bpe.encode(utf8(split, data)).ids, dtype=dtype) for split, data in raw.items()}
    return ids, {"vocab_size": size, "tokenizer": BPE_FILE}


def bpe_tokens(bpe, raw: bytes) -> int:
    return len(bpe.encode(raw.decode("utf-8", errors="replace")).ids)


def write_folder(out: Path, ids: dict[str, np.ndarray], meta: dict, files: dict[str, str]) -> None:
    """The token files, meta.json and `files` ({name: text}) in a temporary folder beside `out`, then renamed to
    `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.mkdir()
    try:
        for split, tokens in ids.items():
            tokens.tofile(tmp / f"{split}.bin")
        for name, content in {"meta.json": json.dumps(meta, ensure_ascii=False) + "\n", **files}.items():
            (tmp / name).write_text(content, encoding="utf-8")
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


BPE_FILE = "tokenizer.json"  # the trained BPE, in Hugging Face's format (tokenizers.Tokenizer.from_file reads it)
# --tokens chars and bytes: (the splits' token ids and meta, the token count of a document for the hygiene report)
TOKENIZERS = {"chars": (as_characters, characters), "bytes": (as_bytes, len)}


def tokenization(tokens: str, raw: dict[str, bytes], vocab_size: int) -> tuple:
    """--tokens as (tokenize, count_tokens, files to write beside meta.json); a BPE is trained on train alone."""
    if tokens != "bpe":
        return *TOKENIZERS[tokens], {}
    bpe = train_bpe(utf8("train", raw["train"]), vocab_size)
    return partial(as_bpe, bpe), partial(bpe_tokens, bpe), {BPE_FILE: bpe.to_str()}


def prepare(folder: Path, out: Path, tokens: str, share: float, seed: int, pattern: str,
            vocab_size: int = 0) -> dict:
    """Everything the command does; returns {split: documents, tokens} and the vocabulary size."""
    documents = read_documents(folder, pattern)
    names = hold_out(documents, share, seed)
    raw = {split: joined(documents, names[split]) for split in SPLITS}
    tokenize, count_tokens, files = tokenization(tokens, raw, vocab_size)
    for check in text_hygiene({split: {n: documents[n] for n in names[split]} for split in SPLITS}, count_tokens):
        print(f"  {check.status:<8}{check.kind:<8}{check.text}")
    ids, meta = tokenize(raw)
    write_folder(out, ids, meta, files)
    return {"splits": {split: (len(names[split]), len(ids[split])) for split in SPLITS},
            "vocab_size": meta["vocab_size"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="\n".join(__doc__.splitlines()[2:]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="the folder of text files, one document each")
    parser.add_argument("out", type=Path, help="the token folder to write (data.root of a tokens run); must not exist")
    parser.add_argument("--tokens", choices=(*TOKENIZERS, "bpe"), default="chars",
                        help="chars: one token per distinct character (default); bytes: 256 byte tokens; bpe: a "
                             "byte-level BPE trained on the train split")
    parser.add_argument("--vocab-size", type=int, default=2048,
                        help="--tokens bpe: tokens in all, the 256 bytes included (default 2048)")
    parser.add_argument("--held-out", type=float, default=0.05,
                        help="share of the bytes held out for val, and as much for test (default 0.05)")
    parser.add_argument("--seed", type=int, default=0, help="the shuffle that picks the held-out documents")
    parser.add_argument("--pattern", default="*.txt", help="which files are documents (default *.txt)")
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        parser.error(f"{args.folder} is not a folder")
    if not 0 < args.held_out < 0.5:
        parser.error(f"--held-out must be between 0 and 0.5, got {args.held_out}")
    if args.tokens == "bpe" and args.vocab_size <= 256:
        parser.error(f"--vocab-size must exceed the 256 bytes a byte-level BPE starts from, got {args.vocab_size}")
    if args.out.exists():
        print(f"error: {args.out} exists: give a new folder (nothing was written)", file=sys.stderr)
        return 2
    try:
        print(f"text hygiene of {args.folder} (reported, not changed):")
        done = prepare(args.folder, args.out, args.tokens, args.held_out, args.seed, args.pattern, args.vocab_size)
    except PrepareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    counts = ", ".join(f"{split} {documents} documents {tokens:,} tokens"
                       for split, (documents, tokens) in done["splits"].items())
    print(f"wrote {args.out}: {counts}; vocabulary {done['vocab_size']:,} ({args.tokens})")
    return 0


def cli() -> None:
    """`python prepare.py` at the template's root, and the `template-prepare` command of `pip install -e .`."""
    train.exit_with(main)
