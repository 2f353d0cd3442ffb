"""`python -m calc`: the command line over the library.

`main` holds the parser and the commands that are a few lines each; a command with options of its own has its
module (`recommend`, ...). Every command reads its input through calc.contract.boundary and prints a one-line
error with exit code 2 on bad input. This is the only place for process-wide settings (the garbage collector
paused while a command imports, the process ended without the interpreter's teardown): the app's server and the
tests share their process and get none of them.

May import every wing; no wing imports it.
"""
