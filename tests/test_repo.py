"""The repo keeps its promises: layout, two-command quick start, CI = README, a complete lock file, checkpoints
loaded without pickle, a licence.

The checks that guard a promise are functions of text (a source file, `.ci/run`, the lock file), so each is tested
twice: on the repo's own file, and on a broken copy that it must reject.
"""
import ast
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from functools import cache
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest
from packaging.markers import Marker, default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
DAYS = ["day01_env_and_tensors", "day02_autograd", "day03_linreg", "day04_mlp_mnist", "day05_dataloader",
        "day06_ckpt_resume", "day07_amp_accum", "day08_mini_autograd", "day09_cnn", "day10_bigbatch_ckpt",
        "day11_profile", "day12_template"]
LOCK = (ROOT / "requirements.lock.txt").read_text()
CI = (ROOT / ".ci" / "run").read_text()


def readme_block(title: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split(f"## {title}", 1)[1]
    block = section.split("```", 2)[1]
    return [line for line in block.splitlines()[1:] if line.strip()]


INSTALL, _, TEST = readme_block("Quick start")


def test_twelve_day_folders_each_with_a_readme():
    for day in DAYS:
        assert (ROOT / day / "README.md").is_file(), day


def test_every_day_with_a_main_has_gates_and_a_main_guard():
    for main in ROOT.glob("day*/main.py"):
        assert (main.parent / "check.py").is_file(), f"{main.parent.name} has main.py but no check.py"
        tree = ast.parse(main.read_text())
        guards = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
        assert guards, f"{main} runs code on import: put the entry point under if __name__ == '__main__'"


def test_every_check_is_a_script_and_records_gates():
    for check in ROOT.glob("day*/check.py"):
        text = check.read_text()
        assert "Gates(__file__)" in text and "run_this_file(__file__)" in text, check


def test_quick_start_is_install_run_test():
    assert readme_block("Quick start") == [
        "pip install -r requirements.lock.txt",
        "python day04_mlp_mnist/main.py",
        "pytest",
    ]


def test_every_command_and_image_in_the_readmes_points_at_a_real_file():
    missing = []
    for readme in [ROOT / "README.md", ROOT / "errors" / "README.md", *ROOT.glob("day*/README.md")]:
        text = readme.read_text()
        for script in re.findall(r"python3? ((?:day\d\d_\w+|scripts|errors)/[\w/]+\.py)", text):
            if not (ROOT / script).is_file():
                missing.append(f"{readme.relative_to(ROOT)}: {script}")
        for image in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", text):
            if not (readme.parent / image).is_file():
                missing.append(f"{readme.relative_to(ROOT)}: {image}")
    assert not missing, missing


# --- checkpoints load without pickle: torch.load(..., weights_only=True), checked in the syntax tree -------------

def unsafe_torch_loads(source: str) -> list[str]:
    """Each use of `torch.load` in `source` that is not a call with the literal keyword `weights_only=True`.

    Follows `import torch as t` and `from torch import load as f`; a `**kwargs` call, a variable, a missing keyword
    or `torch.load` handed around uncalled all count as unsafe, since none of them can be checked here."""
    tree = ast.parse(source)
    modules, loads = {"torch"}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name == "torch"}
        elif isinstance(node, ast.ImportFrom) and node.module in ("torch", "torch.serialization"):
            loads |= {a.asname or a.name for a in node.names if a.name == "load"}

    def is_load(f) -> bool:
        if isinstance(f, ast.Name):
            return f.id in loads
        return isinstance(f, ast.Attribute) and f.attr == "load" and ast.unparse(f.value) in (
            *modules, *(f"{m}.serialization" for m in modules))

    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    unsafe = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and is_load(node.func):
            flag = next((k.value for k in node.keywords if k.arg == "weights_only"), None)
            if not (isinstance(flag, ast.Constant) and flag.value is True):
                unsafe.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif is_load(node) and id(node) not in called:
            unsafe.append(f"line {node.lineno}: {ast.unparse(node)} (passed around uncalled)")
    return unsafe


def repo_python_files() -> list[Path]:
    skip = {"runs", "data", "__pycache__", "site-packages"}
    return [p for p in ROOT.rglob("*.py")
            if not any(part.startswith(".") or part in skip for part in p.relative_to(ROOT).parts)]


def test_every_torch_load_in_the_repo_passes_weights_only_true():
    offenders = {str(p.relative_to(ROOT)): found for p in repo_python_files()
                 if (found := unsafe_torch_loads(p.read_text()))}
    assert not offenders, offenders


@pytest.mark.parametrize("source", [
    "import torch\nstate = torch.load(path, weights_only = False)",
    "import torch\nstate = torch.load(path)",
    "import torch\nsafe = True\nstate = torch.load(path, weights_only=safe)",
    "import torch\nstate = torch.load(path, weights_only=1)",
    "import torch\nstate = torch.load(path, **options)",
    "import torch as T\nstate = T.load(path, map_location='cpu')",
    "from torch import load\nstate = load(path)",
    "import torch\nstate = torch.serialization.load(path)",
    "import torch, functools\nload = functools.partial(torch.load, map_location=\"cpu\")",
], ids=["false-with-spaces", "missing", "variable", "one", "kwargs", "alias", "from-import", "serialization",
        "uncalled"])
def test_the_load_check_rejects_every_unverifiable_torch_load(source):
    assert unsafe_torch_loads(source)


def test_the_load_check_accepts_a_literal_weights_only_true():
    assert unsafe_torch_loads("import torch\nstate = torch.load(p, map_location='cpu', weights_only=True)") == []


# --- CI runs the README's install and test commands, and nothing that changes what pytest runs ------------------

PIP_QUIET = {"--quiet", "-q", "-qq", "--disable-pip-version-check", "--no-input", "--no-cache-dir",
             "--root-user-action=ignore"}
HARMLESS = {"set", "true", "echo", "printf", "command", "test", "[", "]"}
SHELL_WORDS = {"if", "then", "else", "elif", "fi", "!", "{", "}"}
REDIRECTS = {">", ">>", "<", ">&", "&>", ">|"}


def simple_commands(script: str) -> list[list[str]]:
    """The shell script as simple commands (lists of words): comments dropped, continuations joined, split at
    `;`, `&&`, `||`, `|`; redirections kept as ("REDIRECT", target)."""
    commands = []
    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words, current = list(lexer), []
        while words:
            word = words.pop(0)
            if word in (";", "&&", "||", "|", "&"):
                commands.append(current)
                current = []
            elif word in REDIRECTS:
                if current and current[-1].isdigit():
                    current.pop()  # the "2" of "2>&1"
                current.append(("REDIRECT", words.pop(0) if words else ""))
            else:
                current.append(word)
        commands.append(current)
    return [c for c in commands if c]


def ci_problems(script: str, install: str = INSTALL, test: str = TEST) -> list[str]:
    """Why `script` (.ci/run) is not "install as the README says, then run the README's test command": every other
    command must be an install step (pip from the lock, apt packages) or harmless shell, and nothing may change
    pytest's selection: no PYTEST_* variable, no options, no other directory, no file written, no plugin."""
    problems, installed, tests = [], False, []
    commands = simple_commands(script)
    for i, command in enumerate(commands):
        for word in command:
            if isinstance(word, tuple) and word[1] not in ("/dev/null", "1", "2"):
                problems.append(f"writes a file ({word[1]}): a pytest.ini or conftest.py changes what runs")
        words = [w for w in command if not isinstance(w, tuple)]
        while words and (words[0] in SHELL_WORDS or words[0] in ("sudo", "exec") or re.match(r"^\w+=", words[0])):
            prefix = words.pop(0)
            if prefix.startswith("PYTEST"):
                problems.append(f"sets {prefix.split('=')[0]}, which changes what pytest runs")
            while prefix == "sudo" and words and words[0].startswith("-"):
                words.pop(0)
        if not words:
            continue
        program, args = words[0], words[1:]
        if program == "export":
            problems += [f"exports {a.split('=')[0]}, which changes what pytest runs"
                         for a in args if a.startswith("PYTEST")]
        elif program == "cd":
            if args != ["$(dirname $0)/.."]:
                problems.append(f"cd {' '.join(args)}: pytest must start in the repo root to collect every test")
        elif program in ("python", "python3") and args[:2] == ["-m", "pip"] or program in ("pip", "pip3"):
            pip_args = [a for a in (args[2:] if program.startswith("python") else args) if a not in PIP_QUIET]
            if pip_args == install.split()[1:]:
                installed = True
            else:
                problems.append(f"pip {' '.join(pip_args)}: install only the lock file (a plugin changes what runs)")
        elif program in ("apt-get", "apt"):
            problems += [f"installs {a}: a pytest plugin changes what runs" for a in args if "pytest" in a]
        elif program in ("pytest", "py.test") or (program.startswith("python") and args[:2] == ["-m", "pytest"]):
            tests.append(i)
            if words != test.split():
                problems.append(f"runs {' '.join(words)!r}, not the README's {test!r}")
        elif program not in HARMLESS:
            problems.append(f"unexpected command {' '.join(words)!r}: .ci/run only installs and runs {test!r}")
    if not installed:
        problems.append(f"does not install as the README says: {install!r}")
    if len(tests) != 1 or tests[0] != len(commands) - 1:
        problems.append(f"must end with the README's test command {test!r}, run once")
    return problems


def test_ci_installs_and_runs_exactly_the_readme_test_command():
    assert ci_problems(CI) == []


@pytest.mark.parametrize("line", [
    "apt-get install -y dataset-fashion-mnist",
    "sudo apt-get update -qq && sudo apt-get install -y --no-install-recommends dataset-fashion-mnist",
    "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist",
    "if command -v apt-get >/dev/null 2>&1; then sudo apt-get install -y dataset-fashion-mnist; fi",
    "export OMP_NUM_THREADS=1",
])
def test_ci_may_add_install_steps_and_harmless_settings(line):
    script = CI.replace("\npytest", f"\n{line}\npytest")
    assert line in script and ci_problems(script) == []


@pytest.mark.parametrize("old, new", [
    ("\npytest", "\nexport PYTEST_ADDOPTS=\"-m 'not slow'\"\npytest"),
    ("\npytest", "\nPYTEST_ADDOPTS='-k day04' pytest"),
    ("\npytest", "\npytest -m 'not slow'"),
    ("\npytest", "\npytest -k day04"),
    ("\npytest", "\npytest --deselect tests/test_repo.py"),
    ("\npytest", "\npython -m pytest -x"),
    ("\npytest", "\ncd tests\npytest"),
    ("\npytest", "\nprintf '[pytest]\\naddopts = -m gpu\\n' > pytest.ini\npytest"),
    ("\npytest", "\npip install pytest-randomly\npytest"),
    ("\npytest", "\nsed -i 's/day\\*/day04*/' pyproject.toml\npytest"),
    ("\npytest", "\npytest\npytest"),
    ("\npytest", "\npytest\necho done"),
    ("-r requirements.lock.txt", "torch"),
])
def test_the_ci_check_rejects_anything_that_changes_the_selection(old, new):
    assert old in CI
    assert ci_problems(CI.replace(old, new))


# --- the lock file pins the dependency closure of what was asked for, and nothing else --------------------------

PLATFORMS = {  # where torch 2.14.1 ships wheels
    "linux-x86_64": {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
                     "os_name": "posix"},
    "linux-aarch64": {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "aarch64",
                      "os_name": "posix"},
    "macos-arm64": {"sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "arm64",
                    "os_name": "posix"},
    "windows-amd64": {"sys_platform": "win32", "platform_system": "Windows", "platform_machine": "AMD64",
                      "os_name": "nt"},
}
PYTHONS = ["3.11", "3.12", "3.13", "3.14"]  # requires-python >= 3.11; torch 2.14.1 has no wheel for 3.15


def environment(platform: str, python: str) -> dict:
    return {**default_environment(), **PLATFORMS[platform], "python_version": python,
            "python_full_version": f"{python}.0", "implementation_name": "cpython",
            "platform_python_implementation": "CPython"}


def pins(lock: str) -> dict[str, tuple[str, Marker | None]]:
    """name -> (pinned version, marker or None) for each requirement line of the lock file."""
    found = {}
    for line in lock.splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"not a pin: {line}"
            found[canonicalize_name(req.name)] = (spec.version, req.marker)
    return found


def asked_for(lock: str) -> list[str]:
    """The packages the lock's header says were installed before `pip freeze`."""
    command = re.search(r"^#\s+pip install (.+?) && pip freeze", lock, re.M)
    assert command, "the lock's header must say what was asked for: '#   pip install ... && pip freeze'"
    return [canonicalize_name(Requirement(word).name) for word in command.group(1).split()]


@cache
def installed(name: str) -> tuple[str, tuple[Requirement, ...]] | None:
    """(version, requirements) of the installed distribution, or None when it is not installed here."""
    try:
        dist = distribution(name)
    except PackageNotFoundError:
        return None
    return dist.version, tuple(map(Requirement, dist.requires or []))


def closure(roots: list[str], env: dict) -> tuple[dict[str, set[str]], set[str]]:
    """What installing `roots` pulls in under the marker environment `env`, from the installed metadata: name -> the
    packages that need it. Extras count only where a requirement asks for them. Also returns the needed packages
    that are not installed here, whose own requirements are therefore unknown (e.g. Windows-only colorama)."""
    needed, unknown = {name: {"(asked for)"} for name in roots}, set()
    todo, done = [(name, frozenset()) for name in roots], set()
    while todo:
        name, extras = todo.pop()
        if (name, extras) in done:
            continue
        done.add((name, extras))
        if (meta := installed(name)) is None:
            unknown.add(name)
            continue
        for req in meta[1]:
            if req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in extras or {""}):
                child = canonicalize_name(req.name)
                needed.setdefault(child, set()).add(name)
                todo.append((child, frozenset(req.extras)))
    return needed, unknown


KNOWN_LEAVES = {"colorama"}  # needed on Windows only, so not installed here; its 0.4.6 wheel declares no dependencies


def lock_problems(lock: str, env: dict, where: str = "here") -> list[str]:
    """Differences between the pins active under `env` and the closure of what the header asked for."""
    active = {name for name, (_, marker) in pins(lock).items() if marker is None or marker.evaluate(env)}
    needed, unknown = closure(asked_for(lock), env)
    problems = [f"{name} is needed by {', '.join(sorted(needed[name]))} {where} but not pinned for it"
                for name in sorted(needed.keys() - active)]
    problems += [f"{name} is needed {where} but not installed here: its own dependencies are unchecked"
                 for name in sorted(unknown - KNOWN_LEAVES)]
    return problems + [f"{name} is pinned {where} but nothing needs it" for name in sorted(active - needed.keys())]


def version_problems(lock: str) -> list[str]:
    """Pins that differ from what is installed here (the metadata read above) or break a requirement's range (one
    that applies here: not an optional extra's, such as torchao's `dev` pin of pytest)."""
    pinned, problems, env = pins(lock), [], {**default_environment(), "extra": ""}
    for name, (version, _) in pinned.items():
        if (meta := installed(name)) is not None and meta[0] != version:
            problems.append(f"{name}: installed {meta[0]}, pinned {version} (install the lock first)")
        for req in meta[1] if meta else ():
            child = canonicalize_name(req.name)
            applies = req.marker is None or req.marker.evaluate(env)
            if applies and child in pinned and not req.specifier.contains(pinned[child][0], prereleases=True):
                problems.append(f"{child}=={pinned[child][0]} breaks {name}'s requirement {req}")
    return problems


def test_lock_file_pins_torch_without_local_version_suffixes():
    pinned = {name: version for name, (version, _) in pins(LOCK).items()}
    assert pinned["torch"] == "2.14.1" and pinned["torchvision"] == "0.29.1"
    assert not [v for v in pinned.values() if "+" in v], "local version suffixes (+cpu, +cu13x) break other platforms"


def test_the_lock_pins_exactly_what_the_header_asked_for_and_its_dependencies_here():
    """Exact for this machine. setuptools belongs to the closure (torch needs setuptools>=77.0.3, tensorboard
    setuptools>=41) although `pip freeze` hides it, which is why it was added by hand."""
    assert lock_problems(LOCK, default_environment()) == []


@pytest.mark.parametrize("platform", PLATFORMS)
def test_the_lock_markers_install_exactly_the_closure_on_each_platform(platform):
    """Markers evaluated for each platform and Python, on this machine's metadata: right where a package's
    dependencies do not differ between its wheels (torch's CUDA wheels all carry `platform_system == "Linux"`)."""
    problems = [p for python in PYTHONS
                for p in lock_problems(LOCK, environment(platform, python), f"on {platform}, Python {python}")]
    assert problems == []


def test_every_pin_is_the_installed_version_and_within_the_range_its_dependents_require():
    assert version_problems(LOCK) == []


def drop(lock: str, *names: str) -> str:
    return "\n".join(line for line in lock.splitlines() if not line.startswith(tuple(f"{n}==" for n in names)))


def test_the_lock_check_finds_missing_dependencies():
    problems = lock_problems(drop(LOCK, "networkx", "sympy", "filelock"), default_environment())
    assert [p.split()[0] for p in problems] == ["filelock", "networkx", "sympy"], problems


def test_the_lock_check_finds_a_pin_nothing_needs():
    assert lock_problems(LOCK + "six==1.17.0\n", default_environment()) == [
        "six is pinned here but nothing needs it"]


def test_the_lock_check_finds_a_linux_only_wheel_pinned_for_every_platform():
    unmarked = LOCK.replace('triton==3.8.0; platform_system == "Linux"', "triton==3.8.0")
    assert lock_problems(unmarked, environment("macos-arm64", "3.11")) == ["triton is pinned here but nothing needs it"]


def test_the_lock_check_finds_a_windows_only_dependency_left_out():
    assert "colorama==" in LOCK
    problems = lock_problems(drop(LOCK, "colorama"), environment("windows-amd64", "3.11"))
    assert problems == ["colorama is needed by click, pytest, tqdm here but not pinned for it"]


def test_the_version_check_finds_a_pin_outside_a_dependents_range():
    old_sympy = LOCK.replace("sympy==1.14.0", "sympy==1.12")
    assert "sympy==1.12 breaks torch's requirement sympy>=1.13.3" in version_problems(old_sympy)


# --- the GPU gate script never passes for nothing; the licence -------------------------------------------------

def test_gpu_gates_script_says_nothing_ran_and_exits_77_without_cuda():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU visible, whatever the machine has
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_gates.sh")], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 77, proc.stdout + proc.stderr
    assert "NOTHING RAN" in proc.stderr


def test_gpu_gates_script_stops_a_hung_run_at_its_time_limit_and_says_so(tmp_path):
    """A host where CUDA answers but a gate hangs: stand-ins for python (CUDA present) and pytest (hangs until
    SIGINT, printing the test it was in, as pytest does)."""
    (tmp_path / "python").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "pytest").write_text("#!/bin/sh\nsleep 60 &\ntrap 'kill $!; echo interrupted in test_hangs; exit 2' INT\nwait\n")
    for stand_in in ("python", "pytest"):
        (tmp_path / stand_in).chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "GPU_GATES_LIMIT": "1"}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_gates.sh")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 124, proc.stdout + proc.stderr
    assert "interrupted in test_hangs" in proc.stdout and "stopped after 1 s" in proc.stderr


def test_a_session_record_holds_every_test_and_gate_of_a_partial_run_and_renders_as_a_table(tmp_path):
    record = tmp_path / "record.json"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--session-record",
                           str(record), "day04_mlp_mnist/check.py", "-k", "bad_flag and lr and nan"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:]
    written = json.loads(record.read_text())
    assert [t["outcome"] for t in written["tests"].values()] == ["passed"] and written["gates"], written
    assert subprocess.run([sys.executable, "scripts/gpu_results.py", str(record)], cwd=ROOT).returncode == 0
    table = (tmp_path / "gpu_gates.md").read_text()
    assert "no CUDA device" in table and "1 passed" in table and written["gates"][0]["name"] in table


def test_licence_file_is_the_mit_licence_pyproject_declares():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]
    licence = (ROOT / "LICENSE").read_text()
    assert (declared.get("text") if isinstance(declared, dict) else declared) == "MIT"
    assert licence.startswith("MIT License\n\nCopyright (c) 2026 pytorch-sprint contributors\n")
    assert "Permission is hereby granted, free of charge, to any person obtaining a copy" in licence


def test_the_bundled_mnist_keeps_its_own_licence_note():
    assert "Creative Commons Attribution-Share Alike 3.0" in (ROOT / "data" / "mnist" / "README.md").read_text()


def test_the_refresh_script_names_a_real_command_for_every_day_with_results():
    sys.path.insert(0, str(ROOT / "scripts"))
    import refresh_results

    days_with_results = {int(p.parent.name[3:5]) for p in ROOT.glob("day*/results")}
    assert days_with_results <= set(refresh_results.STEPS)
    for steps in refresh_results.STEPS.values():
        for script, _, _ in steps:
            assert (ROOT / script).is_file(), script


TEMPLATE_PYPROJECT = (ROOT / "day12_template" / "template" / "pyproject.toml").read_text()


def bound_problems(pyproject: str, lock: str) -> list[str]:
    """The requirements of a pyproject.toml (extras included) that are not lower bounds (`>=` only, no pin copied from
    the lock) or that the lock's pins do not satisfy (the copy's `pip install -e .` would want other versions)."""
    project = tomllib.loads(pyproject)["project"]
    requirements = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]
    pinned = {name: version for name, (version, _) in pins(lock).items()}
    problems = []
    for req in map(Requirement, requirements):
        name = canonicalize_name(req.name)
        if not req.specifier or any(spec.operator != ">=" for spec in req.specifier):
            problems.append(f"{req}: not a lower bound")
        elif name not in pinned:
            problems.append(f"{req}: not in the lock")
        elif pinned[name] not in req.specifier:
            problems.append(f"{req}: the lock pins {pinned[name]}")
    return problems


def test_the_template_package_declares_bounds_the_lock_satisfies():
    """day12_template/template/pyproject.toml lists lower bounds, not the lock, and the versions the repo pins meet them."""
    assert bound_problems(TEMPLATE_PYPROJECT, LOCK) == []


@pytest.mark.parametrize("old, new, problem", [
    ('"torch>=2.14"', '"torch>=2.15"', "torch>=2.15: the lock pins 2.14.1"),
    ('"torch>=2.14"', '"torch==2.14.1"', "torch==2.14.1: not a lower bound"),
    ('"tqdm>=4.66"', '"tqdm"', "tqdm: not a lower bound"),
    ('"pytest>=8"', '"pytest>=8", "six>=1.16"', "six>=1.16: not in the lock"),
], ids=["above-the-lock", "a-pin", "a-bare-name", "not-locked"])
def test_the_bounds_check_finds_a_requirement_the_lock_does_not_meet_or_that_is_no_lower_bound(old, new, problem):
    assert old in TEMPLATE_PYPROJECT
    assert bound_problems(TEMPLATE_PYPROJECT.replace(old, new), LOCK) == [problem]
