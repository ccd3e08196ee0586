"""INTERVIEW.md answers the curriculum's fourteen questions (its twelve, and two of its Transformer chapter), and its
evidence holds: every test it cites exists, passed, and passed every gate it recorded.

In a full `pytest` session the cited tests have already run when the last test here starts (it is marked `after_all`,
which the root conftest.py orders last): their outcomes and gates are read from the session itself. Cited tests that
are not part of the session (this file run alone, or `pytest tests`) are run once in a subprocess, except the slow ones
(`-m "not slow"`), whose existence the subprocess still checks by collecting them.
"""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sprint import gates

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import report  # noqa: E402

CITED = report.cited_tests()
NODEIDS = sorted({n for nodeids in CITED.values() for n in nodeids})

# Runs the given tests (the slow ones deselected) in a fresh pytest session and writes, as JSON: the exit code, each
# test's outcome, the deselected ones, and every gate recorded with the test that recorded it.
DRIVER = r"""
import json, sys
from dataclasses import asdict
import pytest
from sprint import gates

class Watch:
    deselected, tests = [], {}
    def pytest_deselected(self, items):
        self.deselected += [item.nodeid for item in items]
    def pytest_sessionfinish(self, session):
        self.tests = session.config.pluginmanager.get_plugin("sprint-outcomes").tests

nodeids, out = json.loads(sys.argv[1]), sys.argv[2]
watch = Watch()
code = pytest.main([*nodeids, "-m", "not slow", "-q", "-p", "no:cacheprovider"], plugins=[watch])
json.dump({"code": int(code), "tests": watch.tests, "deselected": watch.deselected,
           "gates": [{**asdict(r), "test": getattr(r, "test", None)} for r in gates.RECORDED]}, open(out, "w"))
"""


def test_the_curriculums_fourteen_questions_each_answered_with_cited_tests_and_generated_figures():
    text = (ROOT / "INTERVIEW.md").read_text()
    assert list(CITED) == [f"Q{n}" for n in range(1, 15)]
    for n, (question, nodeids) in enumerate(CITED.items(), 1):
        assert len(nodeids) >= 2, f"{question} cites {nodeids}"
        section = text.split(f"## {question}.", 1)[1].split("\n## ", 1)[0]
        assert f"<!-- generated: interview-{n} -->" in section, f"{question} has no generated figures"


def test_a_cited_test_marked_slow_in_the_answers_is_slow_in_the_code():
    """The `(slow)` notes tell a reader which evidence `pytest -m "not slow"` leaves out; they must be true."""
    text = (ROOT / "INTERVIEW.md").read_text()
    noted = set(re.findall(r"`([^`]+::[^`]+)` \(slow\)", text))
    for nodeid in NODEIDS:
        path, name = nodeid.split("::")[0], nodeid.split("::")[1].split("[")[0]
        source = (ROOT / path).read_text() if (ROOT / path).is_file() else ""
        assert f"\ndef {name}(" in source, f"{nodeid}: no test {name} in {path}"
        head = source[:source.index(f"\ndef {name}(")].rsplit("\n\n", 1)[-1]
        assert ("@pytest.mark.slow" in head) == (nodeid in noted), nodeid


@pytest.mark.after_all
def test_every_cited_test_exists_and_passed_with_its_gates(request, tmp_path):
    recorder = request.config.pluginmanager.get_plugin("sprint-outcomes")
    in_session = {item.nodeid for item in request.session.items}
    outcomes = {n: recorder.tests.get(n) for n in NODEIDS if n in in_session}
    recorded = [{"test": getattr(r, "test", None), "name": r.name, "passed": r.passed} for r in gates.RECORDED]
    elsewhere = [n for n in NODEIDS if n not in in_session]
    deselected = []
    if elsewhere:
        out = tmp_path / "run.json"
        done = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(elsewhere), str(out)], cwd=ROOT,
                              capture_output=True, text=True, timeout=600)
        assert out.is_file(), f"the cited tests could not be run:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        run = json.loads(out.read_text())
        assert run["code"] in (0, 1, 5), f"pytest exit code {run['code']} (a cited test that does not exist?):\n" \
                                         f"{done.stdout[-3000:]}"
        deselected = run["deselected"]
        outcomes |= {n: run["tests"].get(n) for n in elsewhere if n not in deselected}
        recorded += run["gates"]
    assert set(outcomes) | set(deselected) == set(NODEIDS), "every cited test was collected"
    problems = [f"{n}: {t['outcome'] if t else 'did not run'} {t['message'] if t else ''}"
                for n, t in outcomes.items() if t is None or t["outcome"] != "passed"]
    problems += [f"{g['test']}: gate {g['name']!r} failed" for g in recorded
                 if g["test"] in outcomes and not g["passed"]]
    assert not problems, problems
    assert len(outcomes) >= len(NODEIDS) // 2, f"only {len(outcomes)} of {len(NODEIDS)} cited tests ran"
