"""The template's own tests: they import its package (`from train_template import gpt`), as its scripts do, and
bring their own data (a generated corpus in the bundled Shakespeare's layout), so that they pass in a copy of the
folder outside the repo as well as inside it."""
import gzip
import hashlib
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the package train_template, installed or not
sys.path.insert(0, str(Path(__file__).resolve().parent))  # helpers.py, under any pytest import mode

WORDS = ("the king my lord shall come to night and we will speak of love death honour crown sword heart "
         "thou art fair what say you sir madam good come away alas here is no more").split()
TRAIN_WORKS = ("hamlet", "sonnets")


def pseudo_work(name: str, lines: int = 600) -> bytes:
    """Lines of words drawn by a generator seeded with the work's name: the same bytes on every machine."""
    rng = random.Random(name)
    body = "\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(lines))
    return f"{name.upper()}\n\n{body}\n".encode()


def write_corpus(root: Path) -> Path:
    """MANIFEST.tsv and works/<work>.txt.gz, as data/shakespeare holds them: two training works, and the works the
    split holds out (text.VAL_WORKS, text.TEST_WORKS) under their real names."""
    from train_template import text  # the template's module: importable once the path above is set

    (root / "works").mkdir(parents=True)
    rows = ["work\ttitle\tbytes\tsha256_of_text"]
    for work in TRAIN_WORKS + text.VAL_WORKS + text.TEST_WORKS:
        body = pseudo_work(work)
        (root / "works" / f"{work}.txt.gz").write_bytes(gzip.compress(body, mtime=0))
        rows.append(f"{work}\t{work.title()}\t{len(body)}\t{hashlib.sha256(body).hexdigest()}")
    (root / "MANIFEST.tsv").write_text("\n".join(rows) + "\n")
    return root


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> str:
    """A small corpus in the Shakespeare layout, for data.root (the repo's bundle is not in a copied project)."""
    return str(write_corpus(tmp_path_factory.mktemp("corpus") / "shakespeare"))
