"""The error of data that cannot be loaded as configured."""


class DataError(ValueError):
    """The data cannot be loaded as configured; the message names the config key and its value."""
