"""The store's view of sizes: ``tierec.sizes`` (kept here for existing imports).

>>> from tierec.store.sizes import parse_size
>>> parse_size("1k")
1024
"""

from tierec.sizes import format_size, parse_size, release_free_memory

__all__ = ["format_size", "parse_size", "release_free_memory"]
