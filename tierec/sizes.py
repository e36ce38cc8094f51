"""Human-readable sizes: ``"2GiB"``, ``"512 MB"``, ``"64k"``, ``1048576`` -> bytes.

Binary suffixes (KiB, MiB, GiB, TiB) are powers of 1024; decimal ones (KB, MB,
GB, TB) powers of 1000; a single letter (k, m, g, t) is taken as binary, as in
most systems tools. An empty string means "not set" (None).

>>> from tierec.sizes import parse_size, format_size
>>> parse_size("2GiB"), parse_size("1.5 MB"), parse_size("64k"), parse_size(""), parse_size(4096)
(2147483648, 1500000, 65536, None, 4096)
>>> format_size(3 * 2**30)
'3.00 GiB'
"""

from __future__ import annotations

import re

from tierec.errors import ConfigError


_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "kb": 10**3,
    "m": 1 << 20,
    "mib": 1 << 20,
    "mb": 10**6,
    "g": 1 << 30,
    "gib": 1 << 30,
    "gb": 10**9,
    "t": 1 << 40,
    "tib": 1 << 40,
    "tb": 10**12,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$")


def parse_size(value: str | int | float | None, where: str = "size") -> int | None:
    """Bytes of a size given as a number or a string with a unit; ``""``/None -> None."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise _error(f"{where}: {value!r} is not a size")
    if isinstance(value, (int, float)):
        if value < 0:
            raise _error(f"{where}: size must be >= 0, got {value!r}")
        return int(value)
    text = value.strip().lower()
    if not text:
        return None
    m = _PATTERN.match(text)
    if m is None or m.group(2) not in _UNITS:
        raise _error(f"{where}: {value!r} is not a size; write e.g. '2GiB', '512MB', '64k' or a byte count")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def format_size(n: int | float) -> str:
    """A short binary-unit rendering of ``n`` bytes."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def _error(message: str) -> ConfigError:
    return ConfigError(message)


def release_free_memory() -> None:
    """Hand the C heap's free pages back to the OS (glibc ``malloc_trim``; a no-op elsewhere).

    glibc raises its mmap threshold after large frees, so later mid-size arrays
    come from the heap and their pages linger after they are freed; the store
    calls this after growing its directory and at every hotness pass, so that
    resident memory follows what is in use.
    """
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)  # the process's own symbols: libc is already loaded
    except (OSError, AttributeError):
        pass
