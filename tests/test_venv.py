"""Gates that build an environment of their own (Day 12's copy gate) work wherever the lock is installed: in the base
interpreter (CI), in a venv (the README's Quick start) or in conda. The child sees this environment's packages and
installs into its own folder."""
import subprocess
import sys

import setuptools
import torch

from sprint import REPO_ROOT
from sprint.venv import child_site_packages, python_of, seeing_this_environment

PROBE = "import sys, setuptools, torch; print(sys.prefix, torch.__version__, setuptools.__version__)"


def output(python, code: str) -> str:
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_child_imports_this_environments_torch_and_setuptools_and_its_prefix_is_its_own(tmp_path):
    venv = seeing_this_environment(tmp_path / "child")
    assert output(python_of(venv), PROBE).split() == [str(venv), torch.__version__, setuptools.__version__]


def test_a_child_made_from_inside_a_venv_sees_that_venvs_packages_not_only_the_base_interpreters(tmp_path):
    """The learner's case: the lock installed into a venv. `--system-site-packages` gave the child the *base*
    interpreter's packages (no torch there, an old setuptools); a package only the outer venv holds proves the
    child sees the outer venv's instead."""
    outer = seeing_this_environment(tmp_path / "outer")
    (child_site_packages(outer) / "only_in_the_outer_venv.py").write_text("WHERE = 'outer'\n")
    make_child = (f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r}); from pathlib import Path; "
                  f"from sprint.venv import seeing_this_environment; "
                  f"seeing_this_environment(Path({str(tmp_path / 'child')!r}))")
    output(python_of(outer), make_child)
    child = python_of(tmp_path / "child")
    assert output(child, "import only_in_the_outer_venv as m; print(m.WHERE)").strip() == "outer"
    assert output(child, PROBE).split()[1:] == [torch.__version__, setuptools.__version__]
