"""Generated blocks in Markdown files: templates that read the committed results files, and the markers that hold them.

A generated block sits between two HTML comments (invisible on GitHub):

    <!-- generated: NAME -->                     a block registered in BLOCKS (scripts/figures.py)
    <!-- include: PATH -->                       a results file (PATH relative to the Markdown file), verbatim
    <!-- include: PATH table=N -->               ... only its N-th table
    <!-- include: PATH paragraph=N -->           ... only its N-th paragraph
    <!-- include: PATH section=TITLE -->         ... only the text under its heading TITLE
    ...                                          (links are rewritten to work from the Markdown file)
    <!-- end generated -->

A template cell is `{FILE:PATH|FILTER|...}`: FILE is a JSON (or JSON-lines) results file, `dN/x.json` short for day
N's `results/x.json`; PATH walks keys and list indices separated by dots (`-1` the last element, `*` every element, a
key may itself hold dots); each FILTER turns the value: `max min sum len first last zeros exact shape yesno`,
arithmetic (`*100`, `/1024`), `each:F` (F on every element), `join:SEP`, or a format spec (`.2%`, `,`, `.1f`, `.1e`).
`{calc:NAME|...}` calls CALCS[NAME] for the few figures that combine fields. A missing file or field is an error
naming it, never a blank.
"""
import json
import os
import re
import textwrap
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DAYS = {int(p.name[3:5]): p.name for p in sorted(ROOT.glob("day[0-9][0-9]_*")) if p.is_dir()}
BEGIN = re.compile(r"^<!-- (generated|include): (.+?) -->$")
END = "<!-- end generated -->"
TEMPLATE = re.compile(r"\{(calc|[\w./-]+\.jsonl?):([^{}|]*)((?:\|[^{}|]*)*)\}")
TRACE: list[tuple[str, str, str]] = []  # (where, template, value) of every cell filled, for --spec
_where = [""]  # the block being rendered
CALCS: dict = {}  # name -> function returning a value, for {calc:NAME} (scripts/figures.py fills it)
BLOCKS: dict = {}  # name -> function returning Markdown, for <!-- generated: NAME --> (scripts/figures.py fills it)


class FigureError(Exception):
    """A template that cannot be filled from the committed results (a missing file or field, a bad filter)."""


# --- reading the results files ------------------------------------------------------------------------------------

def results_file(ref: str) -> Path:
    """`d4/summary.json` -> day04_mlp_mnist/results/summary.json; anything else is relative to the repo root."""
    if m := re.fullmatch(r"d(\d+)/(.+)", ref):
        if int(m[1]) not in DAYS:
            raise FigureError(f"{ref}: no day {m[1]}")
        return ROOT / DAYS[int(m[1])] / "results" / m[2]
    return ROOT / ref


@cache
def load_path(path: Path, mtime: float):
    """The parsed JSON (a list of objects for JSON lines) of `path`, cached while its mtime stays the same."""
    text = path.read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()] if path.suffix == ".jsonl" \
        else json.loads(text)


def load(ref: str):
    path = results_file(ref)
    if not path.is_file():
        raise FigureError(f"{path.relative_to(ROOT)} does not exist (run its refresh command)")
    return load_path(path, path.stat().st_mtime)


def walk(value, keys: list[str], where: str):
    if not keys:
        return value
    key, rest = keys[0], keys[1:]
    while key != "*" and isinstance(value, dict) and key not in value and rest:  # a dotted key: "torch.nn.RMSNorm"
        key, rest = f"{key}.{rest[0]}", rest[1:]
    if key == "*":
        items = value.values() if isinstance(value, dict) else value
        return [walk(v, rest, where) for v in items]
    try:
        return walk(value[int(key)] if isinstance(value, list) else value[key], rest, where)
    except (KeyError, IndexError, ValueError, TypeError):
        raise FigureError(f"{where}: no {key!r} there") from None


def read(ref: str, path: str = ""):
    """The value at `path` (dots between keys) in the results file `ref`."""
    return walk(load(ref), path.split(".") if path else [], f"{ref}:{path}")


# --- filters ------------------------------------------------------------------------------------------------------

NAMED = {
    "max": max, "min": min, "sum": sum, "len": len, "first": lambda v: v[0], "last": lambda v: v[-1],
    "zeros": lambda v: sum(x == 0 for x in v),
    "exact": lambda v: "exact" if v == 0 else f"{v:.1e} off",
    "shape": lambda v: "(" + ", ".join(map(str, v)) + ")",
    "yesno": lambda v: "yes" if v else "no",
}


def apply(value, flt: str, where: str):
    try:
        if flt in NAMED:
            return NAMED[flt](value)
        if flt.startswith("each:"):
            return [apply(v, flt[5:], where) for v in value]
        if flt.startswith("join:"):
            return flt[5:].join(map(str, value))
        if m := re.fullmatch(r"([*/+-])(\d+(?:\.\d*)?(?:e-?\d+)?)", flt):
            x = float(m[2])
            return {"*": value * x, "/": value / x, "+": value + x, "-": value - x}[m[1]]
        return format(value, flt)
    except (TypeError, ValueError, IndexError, ZeroDivisionError) as exc:
        raise FigureError(f"{where}: filter {flt!r} on {value!r}: {exc}") from None


def fill(template: str) -> str:
    """Every `{FILE:PATH|FILTER...}` of `template` replaced by its value (see the module docstring)."""
    def one(m: re.Match) -> str:
        ref, path, filters = m[1], m[2], [f for f in m[3].split("|") if f]
        where = m[0]
        if ref == "calc":
            if path not in CALCS:
                raise FigureError(f"{where}: no calc named {path!r}")
            value = CALCS[path]()
        else:
            value = read(ref, path)
        for flt in filters:
            value = apply(value, flt, where)
        return str(value)

    text = TEMPLATE.sub(one, template)
    TRACE.append((_where[0], template, text))
    return text


def table(header: list[str], rows: list[list[str]], align: str = "") -> str:
    """A Markdown table; each cell of `rows` is a template. `align`: one of l/r/c per column (default left)."""
    marks = {"l": "---", "r": "---:", "c": ":---:"}
    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join(marks[a] for a in (align or "l" * len(header))) + " |"]
    lines += ["| " + " | ".join(fill(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


# --- the marker engine --------------------------------------------------------------------------------------------

def select(text: str, selector: str, where: str) -> str:
    """`table=N`: the N-th table of `text`; `paragraph=N`: its N-th block of lines between blank lines;
    `section=TITLE`: the text under the heading TITLE; empty: all of it."""
    if not selector:
        return text.strip("\n")
    key, _, value = selector.partition("=")
    lines = text.splitlines()
    if key == "table":
        tables, current = [], []
        for line in lines + [""]:
            if line.startswith("|"):
                current.append(line)
            elif current:
                tables.append(current)
                current = []
        if not value.isdigit() or not 1 <= int(value) <= len(tables):
            raise FigureError(f"{where}: has {len(tables)} tables, asked for table={value}")
        return "\n".join(tables[int(value) - 1])
    if key == "paragraph":
        blocks = [b.strip("\n") for b in re.split(r"\n\s*\n", text) if b.strip()]
        if not value.isdigit() or not 1 <= int(value) <= len(blocks):
            raise FigureError(f"{where}: has {len(blocks)} paragraphs, asked for paragraph={value}")
        return blocks[int(value) - 1]
    if key == "section":
        heads = [i for i, line in enumerate(lines) if re.fullmatch(r"#+ " + re.escape(value), line)]
        if len(heads) != 1:
            raise FigureError(f"{where}: {len(heads)} headings named {value!r}")
        level = len(lines[heads[0]].split(" ")[0])
        body = []
        for line in lines[heads[0] + 1:]:
            if re.match(r"#{1,%d} " % level, line):
                break
            body.append(line)
        return "\n".join(body).strip("\n")
    raise FigureError(f"{where}: unknown selector {selector!r} (use table=N, paragraph=N or section=TITLE)")


def relink(text: str, src: Path, dest: Path) -> str:
    """Relative links and images of a file in `src` (a folder), rewritten for a Markdown file in `dest`."""
    def one(m: re.Match) -> str:
        target = m[2]
        if re.match(r"[a-z]+:|/|#", target):
            return m[0]
        return f"{m[1]}({Path(os.path.relpath(src / target, dest)).as_posix()})"

    return re.sub(r"(!?\[[^\]]*\])\(([^)\s]+)\)", one, text)


def wrap(text: str, width: int = 118) -> str:
    """Prose lines folded at `width` like the hand-written text around them (bullets keep a hanging indent); table
    rows stay whole."""
    lines = []
    for line in text.split("\n"):
        if line.startswith("|") or len(line) <= width:
            lines.append(line)
        else:
            indent = "  " if line.startswith("- ") else ""
            glued = re.sub(r"`[^`]*`", lambda m: m[0].replace(" ", "\0"), line)  # never break inside `code`
            lines += [part.replace("\0", " ") for part in textwrap.wrap(
                glued, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)]
    return "\n".join(lines)


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def block(kind: str, arg: str, md: Path) -> str:
    where = f"{shown(md)}: <!-- {kind}: {arg} -->"
    _where[0] = where
    if kind == "generated":
        if arg not in BLOCKS:
            raise FigureError(f"{where}: no block named {arg!r} in scripts/figures.py")
        return wrap(BLOCKS[arg]())
    ref, _, selector = arg.partition(" ")
    path = (md.parent / ref).resolve()
    if not path.is_file():
        raise FigureError(f"{where}: {ref} does not exist")
    return relink(select(path.read_text(), selector.strip(), where), path.parent, md.parent)


def render(text: str, md: Path) -> str:
    """`text` (the Markdown file `md`) with every generated block re-made."""
    out, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        m = BEGIN.match(lines[i])
        out.append(lines[i])
        i += 1
        if not m:
            continue
        end = next((j for j in range(i, len(lines)) if lines[j] == END or BEGIN.match(lines[j])), None)
        if end is None or lines[end] != END:
            raise FigureError(f"{shown(md)}: `{lines[i - 1]}` has no `{END}` before the next block")
        out += ["", block(m[1], m[2], md), "", END]
        i = end + 1
    return "\n".join(out)
