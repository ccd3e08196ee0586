"""The error gallery stays true: each broken snippet still raises its row's real message, each fix still runs
cleanly, the gallery covers the cheat sheet, and errors/README.md is what the gallery generates."""
import re

import pytest

from errors import gallery
from errors.catalog import CUDA, ENTRIES


EACH_ENTRY = [pytest.param(e, id=gallery.entry_id(e), marks=[pytest.mark.gpu] if e.needs == "cuda" else [])
              for e in ENTRIES]


def runnable_here(entry):
    if reason := gallery.skip_reason(entry):
        pytest.skip(reason)


@pytest.mark.parametrize("entry", EACH_ENTRY)
def test_broken_snippet_gives_the_real_message(entry):
    runnable_here(entry)
    caught = gallery.broken(entry).text
    assert re.search(entry.pattern, caught), f"expected {entry.pattern!r}, got:\n{caught or 'no error, no warning'}"


@pytest.mark.parametrize("entry", EACH_ENTRY)
def test_fixed_snippet_runs_without_error_or_warning(entry):
    runnable_here(entry)
    outcome = gallery.fixed(entry)
    assert not outcome.text, outcome.text
    assert outcome.result, "a fixed snippet returns one line saying what it computed"


def test_every_row_of_the_cheat_sheet_has_an_entry():
    assert {e.row for e in ENTRIES} >= set(gallery.ROWS)


def test_at_least_17_of_the_21_rows_are_reproduced_on_cpu():
    assert len(gallery.rows_on_cpu()) >= 17, sorted(gallery.rows_on_cpu())


def test_every_row_not_reproduced_on_cpu_has_a_gpu_entry():
    for row in set(gallery.ROWS) - gallery.rows_on_cpu():
        assert any(e.row == row and e.how == CUDA for e in ENTRIES), row


def test_readme_is_what_the_gallery_generates():
    unrunnable = [gallery.entry_id(e) for e in ENTRIES if e.how != CUDA and gallery.skip_reason(e)]
    if unrunnable:
        pytest.skip(f"the README is generated where every CPU entry runs; here {unrunnable} cannot")
    assert gallery.README.read_text() == gallery.render(), "regenerate it: python errors/gallery.py --readme"
