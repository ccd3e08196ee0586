"""A virtual environment that sees the packages of the environment running this code, for gates that install a
project without downloading anything (Day 12's copy gate).

`python -m venv --system-site-packages` would not do: it shows the *base* interpreter's packages, so from inside a
venv or a conda environment the child lacks the lock's torch and gets the base's old setuptools. A .pth file in the
child adds this interpreter's own site folders instead (each through `site.addsitedir`, so their .pth files run too),
whichever kind of environment this is; the child still installs into its own folder.
"""
import subprocess
import sys
from pathlib import Path


def site_folders() -> list[str]:
    """The folders this interpreter imports installed packages from, in its own order."""
    return [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]


def child_site_packages(venv: Path) -> Path:
    found = sorted((venv / "lib").glob("python3*/site-packages"))
    return found[0] if found else venv / "Lib" / "site-packages"  # Windows


def python_of(venv: Path) -> Path:
    return venv / "Scripts" / "python.exe" if sys.platform == "win32" else venv / "bin" / "python"


def seeing_this_environment(venv: Path) -> Path:
    """Create `venv` (without pip of its own: this environment's pip and setuptools serve it) and return it."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    lines = [f"import site; site.addsitedir({folder!r})" for folder in site_folders()]
    (child_site_packages(venv) / "this-environment.pth").write_text("\n".join(lines) + "\n")
    return venv
