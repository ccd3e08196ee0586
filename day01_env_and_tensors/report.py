"""Day 1's report: the README's environment line (`results/readme_environment.md`), from `report.json`."""
from pathlib import Path

from sprint import read_json


def readme_environment(results: Path) -> str:
    """The README's environment line, from `report.json`."""
    env = read_json(results / "report.json")["environment"]
    mps = "yes" if env["mps_available"] else "no"
    return (f"Environment: Python {env['python']}, torch {env['torch']}, torchvision {env['torchvision']}, "
            f"`cuda_build` (`torch.version.cuda`) {env['cuda_build']}, `cuda_available` {env['cuda_available']}, "
            f"device `{env['device']}`, {env['cpu_model']}, {env['cpu_count']} cores, MPS {mps}.")
