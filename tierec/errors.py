"""Errors shared by every layer (the configuration, the store's size parser, the CLI).

A leaf module: it imports nothing of tierec, so any module may raise these
without an import cycle.

>>> from tierec.errors import ConfigError
>>> str(ConfigError("store.cache_size: 'x' is not a size"))
"store.cache_size: 'x' is not a size"
"""


class ConfigError(ValueError):
    """A configuration problem, reported as one line to the user."""
