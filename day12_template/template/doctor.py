"""`python doctor.py --help`: the command line of train_template/doctor.py, which says what it does."""
from train_template.doctor import cli

if __name__ == "__main__":
    cli()
