"""`python consolidate.py --help`: the command line of train_template/consolidate.py, which says what it does."""
from train_template.consolidate import cli

if __name__ == "__main__":
    cli()
