"""Errors that reach the user as one line, without a traceback."""


class SpecbenchError(Exception):
    """A problem with the user's input or environment, explained in the message.

    The entry point prints the message alone and exits with status 2; anything else that escapes is a bug and
    keeps its traceback.
    """
