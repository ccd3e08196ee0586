"""The one-command report and the README figures: every figure a README shows is what the committed results files
say, a failing test is a FAIL row even when it never reached its gate, and recorded gates are reused only while the
code they ran is unchanged."""
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import figures  # noqa: E402
import report  # noqa: E402
from day07_amp_accum import report as day07  # noqa: E402


def test_every_readme_block_is_what_its_results_files_make():
    """After `scripts/refresh_results.py`, `python scripts/report.py --readme` brings the READMEs in line."""
    stale = [md.relative_to(ROOT).as_posix() for md in figures.stale()]
    assert stale == [], "run `python scripts/report.py --readme`, then commit the READMEs"


def test_no_readme_includes_prose_made_by_code():
    """A README sentence is written in the README: results folders hold tables and reports, not README fragments."""
    assert sorted(ROOT.glob("day*/results/**/readme_*.md")) == []
    assert not [f for f in figures.files() if "include: results/readme_" in f.read_text()]


def test_every_day_readme_includes_a_gates_table_of_the_tests_its_check_runs():
    """`python scripts/report.py --gates` writes each day's `results/gates.md` from the day's recorded run: a test
    added, renamed or removed since leaves the table stale."""
    for day in figures.DAYS.values():
        listed = re.findall(r"^\| `(test_\w+)", (ROOT / day / "results" / "gates.md").read_text(), re.M)
        defined = re.findall(r"^def (test_\w+)", (ROOT / day / "check.py").read_text(), re.M)
        assert set(listed) == set(defined), f"{day}: run `python scripts/report.py --gates`"
        assert "<!-- include: results/gates.md -->" in (ROOT / day / "README.md").read_text(), day


def test_the_readme_tables_are_generated_blocks():
    text = (ROOT / "README.md").read_text()
    for name in ("results", "machines"):
        assert f"<!-- generated: {name} -->" in text, name
    assert "<!-- include: day10_bigbatch_ckpt/results/memory_table_12gb.md -->" in text


def test_a_hand_edited_figure_is_found():
    readme = ROOT / "README.md"
    edited = re.sub(r"(MLP test accuracy after .*? \| )[\d.]+%", r"\g<1>99.99%", readme.read_text(), count=1)
    assert edited != readme.read_text()
    assert figures.render(edited, readme) != edited


def test_no_readme_types_a_measured_figure_outside_its_generated_blocks():
    """Prose states the claim and the threshold; the figure lives in a table a command writes."""
    assert [figure for md in figures.files() for figure in figures.typed_figures(md)] == []


def test_figures_typed_by_hand_are_found_and_thresholds_are_not():
    """Lines the audit of c8c7b33 found drifted, put back into Day 12's README: a measured figure in prose or in a
    hand-typed table is found; a threshold, a figure inside a generated block, code or a quotation is not."""
    md = ROOT / "day12_template" / "README.md"
    typed = [
        "| `mnist_mlp.toml`: test accuracy of `best.pt` on the 10,000 test images | **98.36%** (> 98%) |",
        "| torchrun DDP, 2 ranks × 32 vs 1 process × 64: max \\|loss diff\\| | 2.4e-7, 1.2e-7 |",
        "tracking client is `mlflow-skinny` (pinned in the repo's lock; ~100 MB with its dependencies)",
        "python train.py --config configs/shakespeare_cpu.toml   # nanoGPT's CPU recipe, ~2 minutes on 2 cores",
    ]
    untyped = ["a val loss below 2.4 after 250 steps, `max_memory_allocated` within 15% of the estimate",
               "the curriculum's \"≈ 5–6 GB\" and `--budget-mib 32`", "<!-- include: results/x.md -->",
               "| 98.36% |", "<!-- end generated -->"]
    found = figures.typed_figures(md, "\n".join(typed + untyped))
    assert [line.split(":", 1)[1] for line in found] == [
        "1: 98.36%", "2: 2.4e-7", "2: 1.2e-7", "3: 100 MB", "4: 2 minutes"]


def test_a_changed_results_table_is_found(tmp_path):
    """A rerun that measures another figure rewrites its table, and the README that includes it is then stale."""
    day, results = ROOT / "day07_amp_accum", tmp_path / "results"
    shutil.copytree(day / "results", results)
    readme = (day / "README.md").read_text()
    assert figures.render(readme, tmp_path / "README.md") == readme
    summary = json.loads((results / "summary.json").read_text())
    summary["training"]["test_acc"] -= 0.01
    (results / "training.md").write_text(day07.training_table(summary))  # what a rerun writes there
    assert figures.render(readme, tmp_path / "README.md") != readme


def test_a_block_without_its_end_marker_is_an_error(tmp_path):
    md = tmp_path / "README.md"
    with pytest.raises(figures.FigureError, match="has no `<!-- end generated -->`"):
        figures.render("<!-- generated: results -->\ntext\n", md)


def test_an_include_takes_a_table_or_a_section_and_keeps_links_working(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "r.md").write_text(
        "intro\n\n| a |\n|---|\n| 1 |\n\n## Plot\n\n![p](p.png) and [doc](https://x.org/a)\n\n## Other\n\n| b |\n")
    md = tmp_path / "README.md"
    text = ("<!-- include: results/r.md table=1 -->\n<!-- end generated -->\n"
            "<!-- include: results/r.md section=Plot -->\nold\n<!-- end generated -->")
    assert figures.render(text, md) == (
        "<!-- include: results/r.md table=1 -->\n\n| a |\n|---|\n| 1 |\n\n<!-- end generated -->\n"
        "<!-- include: results/r.md section=Plot -->\n\n![p](results/p.png) and [doc](https://x.org/a)\n\n"
        "<!-- end generated -->")
    with pytest.raises(figures.FigureError, match="has 2 tables, asked for table=3"):
        figures.render("<!-- include: results/r.md table=3 -->\n<!-- end generated -->", md)


# --- the report ---------------------------------------------------------------------------------------------------

CHECK = '''
from sprint.gates import Gates

gates = Gates(__file__, out_dir=__import__("pathlib").Path(__file__).parents[1] / "gates")


def test_passes():
    gates.check("accuracy above 98%", 0.985, ">", 0.98)


def test_raises_before_its_gate():
    raise RuntimeError("the data did not load")
    gates.check("loss below 1", 0.5, "<", 1.0)


def test_fails_its_gate():
    gates.check("speed-up at least 3x", 2.5, ">=", 3)
'''
CONFTEST = '''
from pathlib import Path
from sprint.gates import OutcomeRecorder


def pytest_configure(config):
    config.pluginmanager.register(OutcomeRecorder(out_dir=Path(__file__).parent / "gates", root=Path(__file__).parent))
'''


def run_pytest(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(root),
                           *args], cwd=root, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A folder with a passing gate, a test that raises before its gate and a failing gate, run by pytest with the
    root conftest's recorder; then run again with `-k` (a partial run)."""
    root = tmp_path_factory.mktemp("repo")
    (root / "day99_example").mkdir()
    (root / "day99_example" / "check.py").write_text(CHECK)
    (root / "conftest.py").write_text(CONFTEST)
    (root / "pytest.ini").write_text("[pytest]\npython_files = check.py test_*.py\n")
    first = run_pytest(root, "day99_example")
    path = root / "gates" / "day99_example.outcomes.json"
    record = json.loads(path.read_text())
    partial = run_pytest(root, "day99_example", "-k", "passes")
    (root / "day99_example" / "test_more.py").write_text("def test_more():\n    pass\n")
    one_file = run_pytest(root, "day99_example/check.py")  # a second test file of the folder did not run
    return first, record, partial, json.loads(path.read_text()), one_file


def test_the_recorder_keeps_every_outcome_and_the_gates_each_test_recorded(recorded):
    first, record, *_ = recorded
    assert first.returncode == 1, first.stdout
    tests = record["tests"]
    assert {n.split("::")[1]: t["outcome"] for n, t in tests.items()} == {
        "test_passes": "passed", "test_raises_before_its_gate": "failed", "test_fails_its_gate": "failed"}
    assert "RuntimeError: the data did not load" in tests["day99_example/check.py::test_raises_before_its_gate"][
        "message"]
    assert [(g["name"], g["passed"], g["test"].split("::")[1]) for g in record["gates"]] == [
        ("accuracy above 98%", True, "test_passes"), ("speed-up at least 3x", False, "test_fails_its_gate")]


def test_a_test_that_fails_before_its_gate_is_a_fail_row_in_the_report(recorded):
    rows, counts = report.gate_rows({"day99_example": recorded[1]})
    assert counts == {"PASS": 1, "FAIL": 2, "SKIP": 0}
    assert [r for r in rows if "test_raises_before_its_gate" in r and "**FAIL**" in r]
    assert [r for r in rows if "speed-up at least 3x" in r and "**FAIL**" in r]
    assert not [r for r in rows if "test_fails_its_gate" in r], "a failed gate is its own row, not a second one"


def test_a_gates_table_shows_each_test_with_its_gates_and_a_failed_run_writes_none(recorded, tmp_path, monkeypatch):
    record = recorded[1]
    passing = {**record, "gates": record["gates"][:1], "tests": {
        n: {**t, "outcome": "passed"} for n, t in record["tests"].items() if n.endswith(("passes", "before_its_gate"))}}
    assert report.gates_table(passing).splitlines()[2:] == [
        "| test | gate | measured | required |", "| --- | --- | --- | --- |",
        "| `test_passes` | accuracy above 98% | 0.985 | > 0.98 |",
        "| `test_raises_before_its_gate` | (plain assertions, no recorded figure) | — | — |"]
    monkeypatch.setattr(report, "ROOT", tmp_path)
    monkeypatch.setitem(figures.DAYS, 99, "day99_example")
    (tmp_path / "day99_example" / "results").mkdir(parents=True)
    report.write_gates_tables({"day99_example": record})
    assert not (tmp_path / "day99_example" / "results" / "gates.md").exists()
    report.write_gates_tables({"day99_example": passing})
    assert (tmp_path / "day99_example" / "results" / "gates.md").read_text() == report.gates_table(passing)


def test_a_partial_run_keeps_the_last_complete_record(recorded):
    _, record, partial, after, one_file = recorded
    assert "1 passed, 2 deselected" in partial.stdout
    assert "2 failed, 1 passed" in one_file.stdout
    assert after == record


def test_recorded_gates_are_reused_only_while_no_source_changed(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "GATES_DIR", tmp_path)
    folder = "day03_linreg"
    record = {"torch": report.version("torch"), "files": report.test_files(folder), "started": time.time() + 3600}
    (tmp_path / f"{folder}.outcomes.json").write_text(json.dumps(record))
    assert report.stale_reason(folder) is None
    newest = max(report.sources(folder), key=lambda p: p.stat().st_mtime)
    (tmp_path / f"{folder}.outcomes.json").write_text(json.dumps({**record, "started": newest.stat().st_mtime - 1}))
    assert report.stale_reason(folder) == f"{newest.relative_to(ROOT)} changed after the last run"
    (tmp_path / f"{folder}.outcomes.json").write_text(json.dumps({**record, "files": ["day03_linreg/old.py"]}))
    assert report.stale_reason(folder) == "its test files changed"


def test_a_day_depends_on_the_days_it_imports():
    assert report.day_imports("day07_amp_accum") == {"day04_mlp_mnist", "day06_ckpt_resume"}
    sources = {p.relative_to(ROOT).parts[0] for p in report.sources("day07_amp_accum")}
    assert {"day07_amp_accum", "day06_ckpt_resume", "day04_mlp_mnist", "sprint"} <= sources
    assert "day09_cnn" not in sources


def test_the_interview_cites_tests_by_node_id():
    cited = report.cited_tests(textwrap.dedent("""
        ## Q1. A question?
        - `day07_amp_accum/check.py::test_a[x]` and `tests/test_repo.py::test_b`
        ## Q2. Another?
        - `day07_amp_accum/check.py::test_a[x]`
        """))
    assert cited == {"Q1": ["day07_amp_accum/check.py::test_a[x]", "tests/test_repo.py::test_b"],
                     "Q2": ["day07_amp_accum/check.py::test_a[x]"]}


def test_a_folder_whose_subfolder_the_conftest_ignores_is_recorded_when_the_rest_ran(tmp_path):
    """Day 12's tests/ run inside its copy gate, not in the suite (the root conftest's collect_ignore): the recorder
    still writes Day 12's record, so `scripts/report.py` reuses it instead of running Day 12 again."""
    (tmp_path / "day98_example" / "tests").mkdir(parents=True)
    (tmp_path / "day98_example" / "check.py").write_text("def test_passes():\n    pass\n")
    (tmp_path / "day98_example" / "tests" / "test_inside.py").write_text("def test_inside():\n    pass\n")
    (tmp_path / "conftest.py").write_text(CONFTEST + '\ncollect_ignore = ["day98_example/tests"]\n')
    (tmp_path / "pytest.ini").write_text("[pytest]\npython_files = check.py test_*.py\n")
    done = run_pytest(tmp_path, "day98_example")
    assert "1 passed" in done.stdout, done.stdout
    assert (tmp_path / "gates" / "day98_example.outcomes.json").is_file()


def test_the_reports_test_files_are_those_the_suite_collects():
    """A folder's record lists the files the suite collected: Day 12's tests/ (collected in its copy) is not one of
    them, so the report's own list must leave it out too, or Day 12's record never counts as current."""
    assert report.test_files("day12_template") == ["day12_template/check.py"]
