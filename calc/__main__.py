"""`python -m calc ...`: the command line, calc.cli."""

from calc.cli.main import run_as_program

if __name__ == "__main__":
    run_as_program()
