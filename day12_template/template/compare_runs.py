"""`python compare_runs.py --help`: the command line of train_template/compare_runs.py, which says what it does."""
from train_template.compare_runs import cli

if __name__ == "__main__":
    cli()
