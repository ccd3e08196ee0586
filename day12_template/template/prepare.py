"""`python prepare.py --help`: the command line of train_template/prepare.py, which says what it does."""
from train_template.prepare import cli

if __name__ == "__main__":
    cli()
