"""`python -m calc`: the command line over the library.

`main` holds the parser (the list of commands) and the process-wide settings; each command has its module with
its options and its work: `estimate`, `presets`, `fit`, `recommend`, `table`, `export` (export and
export-deepspeed), `ds_import` (import-deepspeed), `validate`, `calibrate`; `options` has the option types they share. Every command reads its
input through calc.contract.boundary (`load_scenario`, `read_json`) and prints a one-line error with exit code 2
on bad input. The evidence and export wings are imported by their commands when they run, so that the other
commands do not load them. `main` is the only place for process-wide settings (the garbage collector frozen and
off while a command runs, the process ended without the interpreter's teardown): the app's server and the tests
share their process and get none of them.

May import every wing; no wing imports it.
"""
