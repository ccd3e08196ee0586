"""`python sample.py --help`: the command line of train_template/sample.py, which says what it does."""
from train_template.sample import cli

if __name__ == "__main__":
    cli()
