"""Errors that the command line reports as one line, without a traceback."""


class UserError(Exception):
    """Bad input that the user can fix; the message names what is wrong and how to fix it."""


class ConfigError(UserError):
    """An invalid configuration value; the message names the flag."""


class DataError(UserError):
    """A missing or malformed dataset file; the message names the file."""
