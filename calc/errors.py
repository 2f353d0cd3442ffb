"""Errors shared by the CLI and the modules it dispatches to."""


class UserError(ValueError):
    """Bad input from the user: the CLI prints it as one line and exits with code 2."""
