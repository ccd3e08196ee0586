"""Text-data hygiene: what a language model will read, document by document, before blaming the model.

The curriculum's preprocessing checklist, measured (nothing is changed): invalid UTF-8 bytes, HTML tags and entities,
control characters, documents too short or too long, exact duplicate documents, near duplicates (MinHash over
character shingles), lines repeated across documents (boilerplate), token lengths, and passages of the validation
and test documents that are also in train. The checks run in the order a cleaning pipeline fixes things: exact
copies are set aside before near duplicates are looked for, both before lines are counted, and boilerplate lines are
taken out before passages shared with train are looked for, so that one fault is reported once, by its own check.

A document is whatever the caller passes as one; for the bundled Shakespeare it is a work (one file of works/), the
unit the split holds out. Everything works on bytes, so a file that is not UTF-8 is measured, not a crash.
"""
import hashlib
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

MIN_WORDS, MAX_WORDS = 50, 100_000  # Gopher's document-length filter (Rae et al. 2021): outside it, not prose
NEAR_SHINGLE = 12  # characters: on the bundled works, the closest two different plays share 2% of these shingles
BIN_BITS = 9  # MinHash signatures of 2**9 = 512 bins: a Jaccard estimate within about 0.02 of the truth
NEAR_JACCARD = 0.8  # near-duplicate threshold of Lee et al. 2022 ("Deduplicating training data ...")
BOILERPLATE_CHARS = 20  # shorter lines are a text's structure (speaker names, stage directions, headings)
BOILERPLATE_SHARE = 0.01  # lines in at least half the documents taking 1% of the bytes: a problem, not a header
LEAK_SHINGLE = 50  # characters, about 9 words (GPT-3's contamination test used 13 words)
LEAK_CHARS = 200  # a passage this long shared with train (3 lines of verse, ~35 words) is copied, not a phrase
LEAK_SHARE = 0.01  # of a document's shingles in train: a copy edited all over (bundled held-out works: 0.014%)
PRIME = np.uint64(0x100000001B3)  # FNV's 64-bit prime: the polynomial hash of a shingle
INVERSE = np.uint64(pow(int(PRIME), -1, 2**64))  # PRIME * INVERSE = 1 modulo 2**64 (PRIME is odd)
MIX = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))  # splitmix64's finaliser
EMPTY = np.uint64(2**64 - 1)  # a MinHash bin no shingle fell into
TAG = re.compile(rb"</?[A-Za-z][A-Za-z0-9]*(?:\s[^<>]*)?/?>")
ENTITY = re.compile(rb"&(?:#[0-9]+|#[xX][0-9a-fA-F]+|[A-Za-z][A-Za-z0-9]*);")  # &egrave; &#233; (not "&c.")
CONTROL = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]|\xc2[\x80-\x9f]")  # C0, DEL, C1; not \t \n \r
ESCAPED = re.compile("[\udc80-\udcff]")  # an undecodable byte, as errors="surrogateescape" keeps it


@dataclass
class TextCheck:
    kind: str  # utf8 | markup | control | length | exact | near | lines | tokens | leak
    status: str  # ok | note | PROBLEM
    text: str
    figures: dict = field(default_factory=dict)


def show(raw: bytes, limit: int = 60) -> str:
    """Bytes as a short printable string for a report line."""
    text = raw.decode("utf-8", errors="backslashreplace")
    return repr(text if len(text) <= limit else text[:limit] + "...")


def where(hits: dict[str, list[int]]) -> str:
    """How many documents have a hit, and where the first one is ('2 document(s), first NAME at byte N')."""
    first = next(iter(hits))
    return f"{len(hits):,} document(s), first {first} at byte {hits[first][0]:,}"


# -- what is in the bytes ----------------------------------------------------------------------------------------
def check_utf8(docs: dict[str, bytes]) -> TextCheck:
    bad, first = {}, {}
    for name, doc in docs.items():
        try:
            doc.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad[name] = len(ESCAPED.findall(doc.decode("utf-8", errors="surrogateescape")))
            first[name] = [exc.start]
    if not bad:
        return TextCheck("utf8", "ok", f"every document is valid UTF-8 ({sum(map(len, docs.values())):,} bytes)")
    return TextCheck("utf8", "PROBLEM", f"{sum(bad.values()):,} bytes that are not UTF-8 in {where(first)}",
                     {"invalid_bytes": bad, "first_offset": {k: v[0] for k, v in first.items()}})


def check_markup(docs: dict[str, bytes]) -> TextCheck:
    forms, hits = Counter(), {}
    for name, doc in docs.items():
        found = [*TAG.finditer(doc), *ENTITY.finditer(doc)]
        if found:
            hits[name] = sorted(m.start() for m in found)
            forms.update(m[0] for m in found)
    if not hits:
        return TextCheck("markup", "ok", "no HTML tags or entities")
    first = next(iter(hits))
    context = docs[first][max(hits[first][0] - 12, 0):hits[first][0] + 16]
    common = ", ".join(f"{m.decode(errors='replace')} x{n}" for m, n in forms.most_common(3))
    return TextCheck("markup", "PROBLEM", f"{sum(forms.values()):,} HTML tags/entities ({common}) in {where(hits)}: "
                     f"{show(context)}", {"count": sum(forms.values()), "offsets": hits,
                                          "forms": {m.decode(errors="replace"): n for m, n in forms.items()}})


def check_control(docs: dict[str, bytes]) -> TextCheck:
    chars, hits = Counter(), {}
    for name, doc in docs.items():
        found = list(CONTROL.finditer(doc))
        if found:
            hits[name] = [m.start() for m in found]
            chars.update(m[0] for m in found)
    if not hits:
        return TextCheck("control", "ok", "no control characters besides \\n, \\t and \\r")
    common = ", ".join(f"{show(c)} x{n}" for c, n in chars.most_common(3))
    return TextCheck("control", "PROBLEM", f"{sum(chars.values()):,} control characters ({common}) in {where(hits)}",
                     {"count": sum(chars.values()), "offsets": hits})


def check_length(docs: dict[str, bytes]) -> TextCheck:
    words = {name: len(doc.split()) for name, doc in docs.items()}
    outside = {name: n for name, n in words.items() if not MIN_WORDS <= n <= MAX_WORDS}
    shortest, longest = min(words, key=words.get), max(words, key=words.get)
    figures = {"min_words": words[shortest], "max_words": words[longest], "outside": outside}
    measured = (f"{len(words):,} documents of {words[shortest]:,} ({shortest}) to {words[longest]:,} words "
                f"({longest})")
    if not outside:
        return TextCheck("length", "ok", f"{measured}: none outside {MIN_WORDS}-{MAX_WORDS:,}", figures)
    listed = ", ".join(f"{name} ({n:,} words)" for name, n in list(outside.items())[:3])
    return TextCheck("length", "PROBLEM", f"{len(outside):,} document(s) outside {MIN_WORDS}-{MAX_WORDS:,} words: "
                     f"{listed}; {measured}", figures)


# -- duplicates ----------------------------------------------------------------------------------------------------
def across(split_of: dict[str, str], a: str, b: str) -> str:
    """' (val and train: a leak)' when two documents are in different splits."""
    return f" ({split_of[a]} and {split_of[b]}: a leak)" if split_of[a] != split_of[b] else ""


def check_exact(docs: dict[str, bytes], split_of: dict[str, str]) -> tuple[TextCheck, set[str]]:
    """Byte-identical documents; returns the check and the copies (every one after the first)."""
    first, copies = {}, {}
    for name, doc in docs.items():
        digest = hashlib.sha256(doc).digest()
        if digest in first:
            copies[name] = first[digest]
        else:
            first[digest] = name
    if not copies:
        return TextCheck("exact", "ok", f"no two of the {len(docs):,} documents are identical"), set()
    listed = ", ".join(f"{copy} = {original}" + across(split_of, copy, original)
                       for copy, original in list(copies.items())[:3])
    return TextCheck("exact", "PROBLEM", f"{len(copies):,} document(s) identical to an earlier one: {listed}",
                     {"copies": copies}), set(copies)


def normalised(doc: bytes) -> bytes:
    """Lower case (ASCII) with every run of whitespace one space: re-wrapped or re-cased copies still match."""
    return b" ".join(doc.lower().split())


def shingle_hashes(text: bytes, k: int) -> np.ndarray:
    """A 64-bit hash of every k-byte window of `text` (none if it is shorter): the polynomial sum of
    byte[i + t] * PRIME**t (modulo 2**64, where uint64 arithmetic wraps), every window at once from prefix sums, then
    splitmix64's finaliser, so that the top bits MinHash bins by are as random as the others."""
    codes = np.frombuffer(text, dtype=np.uint8).astype(np.uint64)
    n = max(len(codes) - k + 1, 0)
    prefix = np.concatenate([np.zeros(1, dtype=np.uint64), np.cumsum(codes * np.cumprod(np.full(len(codes), PRIME)))])
    hashes = (prefix[k:] - prefix[:n]) * np.cumprod(np.full(n, INVERSE))  # window i's sum moved back to position 0
    hashes ^= hashes >> np.uint64(30)
    hashes *= MIX[0]
    hashes ^= hashes >> np.uint64(27)
    hashes *= MIX[1]
    hashes ^= hashes >> np.uint64(31)
    return hashes


def minhash(hashes: np.ndarray) -> np.ndarray:
    """One-permutation MinHash (Li, Owen and Zhang 2012): the hash range cut into bins by the top BIN_BITS bits, and
    the smallest hash in each bin. Two documents agree in a bin with probability their Jaccard similarity (shared
    shingles / all their shingles), so the share of agreeing bins estimates it, from one hash per shingle."""
    signature = np.full(2**BIN_BITS, EMPTY, dtype=np.uint64)
    np.minimum.at(signature, (hashes >> np.uint64(64 - BIN_BITS)).astype(np.intp), hashes)
    return signature


def check_near(texts: dict[str, bytes], split_of: dict[str, str]) -> tuple[TextCheck, set[str]]:
    """Pairs of documents (`normalised`) at an estimated Jaccard similarity of NEAR_JACCARD or more (every pair
    compared: fine for thousands of documents; millions need LSH banding). Returns the check and the later document
    of each pair."""
    names = list(texts)
    if len(names) < 2:
        return TextCheck("near", "ok", f"{len(names)} document(s): no pair to compare"), set()
    signatures = np.stack([minhash(shingle_hashes(texts[n], NEAR_SHINGLE)) for n in names])
    pairs, closest = {}, (-1.0, "", "")
    for i in range(len(names) - 1):
        others = signatures[i + 1:]
        filled = (others != EMPTY) | (signatures[i] != EMPTY)
        agree = ((others == signatures[i]) & filled).sum(axis=1)
        similarity = agree / np.maximum(filled.sum(axis=1), 1)
        for j in np.flatnonzero(similarity >= NEAR_JACCARD):
            pairs.setdefault(names[i + 1 + j], (names[i], float(similarity[j])))
        best = int(np.argmax(similarity))
        if similarity[best] > closest[0]:
            closest = (float(similarity[best]), names[i], names[i + 1 + best])
    figures = {"pairs": pairs, "closest": closest}
    measured = (f"MinHash over {NEAR_SHINGLE}-character shingles, {2**BIN_BITS} bins; the closest pair: "
                f"{closest[1]} / {closest[2]} at {closest[0]:.2f}")
    if not pairs:
        return TextCheck("near", "ok", f"no two documents at Jaccard >= {NEAR_JACCARD} ({measured})", figures), set()
    listed = ", ".join(f"{later} ~ {earlier} at {s:.2f}" + across(split_of, later, earlier)
                       for later, (earlier, s) in list(pairs.items())[:3])
    return TextCheck("near", "PROBLEM", f"{len(pairs):,} near-duplicate document(s): {listed}; {measured}",
                     figures), set(pairs)


def lines_of(doc: bytes) -> list[bytes]:
    """The document's non-empty lines, stripped."""
    return [line for line in (raw.strip() for raw in doc.split(b"\n")) if line]


def without_lines(doc: bytes, drop: set[bytes]) -> bytes:
    """`doc`'s non-empty lines, but those in `drop`."""
    return b"\n".join(line for line in lines_of(doc) if line not in drop)


def check_lines(docs: dict[str, bytes]) -> tuple[TextCheck, set[bytes]]:
    """Lines repeated within and across documents. Short lines repeat in any play (speaker names, stage directions,
    headings); a longer line found in at least half the documents is boilerplate (a header, a footer, a licence).
    Returns the check and the boilerplate lines."""
    count, docs_with = Counter(), Counter()
    for doc in docs.values():
        lines = lines_of(doc)
        count.update(lines)
        docs_with.update(set(lines))
    total = sum(map(len, docs.values()))
    repeated = {line: n for line, n in count.items() if n > 1}
    copies_bytes = sum((n - 1) * (len(line) + 1) for line, n in repeated.items())
    long_bytes = sum((n - 1) * (len(line) + 1) for line, n in repeated.items() if len(line) >= BOILERPLATE_CHARS)
    boilerplate = {line: docs_with[line] for line in repeated
                   if len(line) >= BOILERPLATE_CHARS and docs_with[line] >= max(3, len(docs) / 2)}
    boilerplate_bytes = sum(count[line] * (len(line) + 1) for line in boilerplate)
    top = count.most_common(5)
    figures = {"lines": sum(count.values()), "distinct": len(count), "copies": sum(repeated.values()) - len(repeated),
               "copies_share": copies_bytes / max(total, 1), "long_copies_share": long_bytes / max(total, 1),
               "top": [[line.decode("utf-8", errors="replace"), n] for line, n in top],
               "boilerplate": {line.decode("utf-8", errors="replace"): n for line, n in boilerplate.items()},
               "boilerplate_share": boilerplate_bytes / max(total, 1)}
    measured = (f"{figures['lines']:,} non-empty lines, {figures['distinct']:,} distinct: the repeats are "
                f"{100 * figures['copies_share']:.1f}% of the bytes, lines of {BOILERPLATE_CHARS}+ characters "
                f"{100 * figures['long_copies_share']:.2f}%; most repeated: "
                + ", ".join(f"{show(line, 30)} x{n:,}" for line, n in top))
    if not boilerplate:
        return TextCheck("lines", "ok", measured, figures), set()
    listed = ", ".join(f"{show(line)} in {n} of {len(docs)}" for line, n in list(boilerplate.items())[:3])
    status = "PROBLEM" if figures["boilerplate_share"] >= BOILERPLATE_SHARE else "note"
    return TextCheck("lines", status, f"boilerplate ({100 * figures['boilerplate_share']:.2f}% of the bytes): "
                     f"{listed}; {measured}", figures), set(boilerplate)


# -- what the model sees -------------------------------------------------------------------------------------------
def check_tokens(splits: dict[str, dict[str, bytes]], count_tokens: Callable[[bytes], int]) -> TextCheck:
    lengths = {name: count_tokens(doc) for docs in splits.values() for name, doc in docs.items()}
    values = np.array(list(lengths.values()))
    figures = {"min": int(values.min()), "median": float(np.median(values)), "p95": float(np.percentile(values, 95)),
               "max": int(values.max()), "total": int(values.sum()),
               "per_split": {s: sum(lengths[n] for n in docs) for s, docs in splits.items()},
               "longest": max(lengths, key=lengths.get)}
    return TextCheck("tokens", "ok", f"tokens per document: min {figures['min']:,}, median {figures['median']:,.0f}, "
                     f"95th percentile {figures['p95']:,.0f}, max {figures['max']:,} ({figures['longest']}); "
                     + ", ".join(f"{s} {n:,}" for s, n in figures["per_split"].items())
                     + f" ({figures['total']:,} in all)", figures)


def longest_run(mask: np.ndarray) -> tuple[int, int]:
    """(length, start) of the longest run of True in `mask`; (0, 0) if there is none."""
    edges = np.flatnonzero(np.diff(np.concatenate([[False], mask, [False]]).astype(np.int8)))
    starts, ends = edges[0::2], edges[1::2]
    if not len(starts):
        return 0, 0
    best = int(np.argmax(ends - starts))
    return int(ends[best] - starts[best]), int(starts[best])


def found_in(sorted_hashes: np.ndarray, hashes: np.ndarray) -> np.ndarray:
    """Which of `hashes` are among `sorted_hashes` (sorted), as a boolean mask. The queries are looked up in sorted
    order: one sweep through the table instead of a jump for each (several times faster)."""
    found = np.zeros(len(hashes), dtype=bool)
    if len(sorted_hashes):
        order = np.argsort(hashes)
        at = np.searchsorted(sorted_hashes, hashes[order]).clip(max=len(sorted_hashes) - 1)
        found[order] = sorted_hashes[at] == hashes[order]
    return found


def check_leak(splits: dict[str, dict[str, bytes]]) -> TextCheck:
    """Each validation/test document's LEAK_SHINGLE-character shingles (of the `normalised` texts) looked up among
    train's: the share found (a document's largest share catches a copy edited every few words), and the longest
    passage found whole (a run of consecutive shingles in train: a passage pasted in)."""
    train = np.sort(np.concatenate([np.zeros(0, dtype=np.uint64), *(shingle_hashes(t, LEAK_SHINGLE)
                                                                    for t in splits["train"].values())]))
    figures, parts, longest, most = {}, [], (0, "", b""), (0.0, "")
    for split in [s for s in splits if s != "train"]:
        shared = total = 0
        for name, text in splits[split].items():
            hashes = shingle_hashes(text, LEAK_SHINGLE)
            found = found_in(train, hashes)
            run, start = longest_run(found)
            passage = run + LEAK_SHINGLE - 1 if run else 0
            if passage > longest[0]:
                longest = (passage, f"{split}/{name}", text[start:start + passage])
            share = found.sum() / max(len(found), 1)
            if share > most[0]:
                most = (float(share), f"{split}/{name}")
            shared, total = shared + int(found.sum()), total + len(hashes)
        figures[split] = {"shared": shared, "shingles": total, "share": shared / max(total, 1)}
        parts.append(f"{split} {shared:,} of {total:,} ({100 * figures[split]['share']:.4f}%)")
    figures["longest"] = {"chars": longest[0], "where": longest[1], "text": longest[2].decode("utf-8", "replace")}
    figures["largest_share"] = {"share": most[0], "where": most[1]}
    largest_text = f"{100 * most[0]:.4f}% of {most[1]}'s" if most[1] else "none"
    longest_text = f"{longest[0]:,} characters in {longest[1]}, {show(longest[2])}" if longest[0] else "none"
    measured = (f"{LEAK_SHINGLE}-character shingles also in train: {', '.join(parts)}; the largest share of one "
                f"document: {largest_text}; the longest shared passage: {longest_text}")
    leaked = longest[0] >= LEAK_CHARS or most[0] >= LEAK_SHARE
    return TextCheck("leak", "PROBLEM" if leaked else "ok", measured, figures)


def text_hygiene(splits: dict[str, dict[str, bytes]], count_tokens: Callable[[bytes], int] = len) -> list[TextCheck]:
    """Every check on {split: {document name: bytes}} (train first, then val/test; names unique across splits).
    `count_tokens(bytes) -> int` is the tokenizer's length (default: byte-level, one token per byte)."""
    docs = {name: doc for split_docs in splits.values() for name, doc in split_docs.items()}
    if "train" not in splits or not docs:
        raise ValueError("text_hygiene needs {split: {name: bytes}} with a 'train' split and at least one document")
    if len(docs) < sum(map(len, splits.values())):
        raise ValueError("text_hygiene: a document name is in two splits (names must be unique across splits)")
    split_of = {name: split for split, split_docs in splits.items() for name in split_docs}
    texts = {name: normalised(doc) for name, doc in docs.items()}
    exact, copies = check_exact(docs, split_of)
    near, similar = check_near({n: t for n, t in texts.items() if n not in copies}, split_of)
    kept = {split: [n for n in split_docs if n not in copies | similar] for split, split_docs in splits.items()}
    lines, boilerplate = check_lines({n: docs[n] for names in kept.values() for n in names})
    if boilerplate:  # in every split without being a leak: look for shared passages without it
        texts = {n: normalised(without_lines(docs[n], boilerplate)) for n in docs}
    return [check_utf8(docs), check_markup(docs), check_control(docs), check_length(docs), exact, near, lines,
            check_tokens(splits, count_tokens),
            check_leak({split: {n: texts[n] for n in names} for split, names in kept.items()})]
