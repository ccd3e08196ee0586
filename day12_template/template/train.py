"""`python train.py --help`: the command line of train_template/train.py, which says what it does."""
from train_template.train import cli

if __name__ == "__main__":
    cli()
