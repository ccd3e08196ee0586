"""`python memory.py --help`: the command line of train_template/memory.py, which says what it does."""
from train_template.memory import cli

if __name__ == "__main__":
    cli()
