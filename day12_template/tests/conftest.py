"""The template's own tests import its modules by their plain names (`import gpt`), as its scripts do."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
