"""The installed tierec's version (from the package metadata), for ``tierec --version``, summaries and exports.

A leaf module: it imports nothing of tierec.

>>> from tierec.version import tierec_version
>>> isinstance(tierec_version(), str)
True
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

UNKNOWN = "0+unknown"  # a source tree that was never installed (no package metadata)


def tierec_version() -> str:
    """The version pip installed (``pyproject.toml``'s), or ``0+unknown`` when tierec is not installed."""
    try:
        return version("tierec")
    except PackageNotFoundError:
        return UNKNOWN
