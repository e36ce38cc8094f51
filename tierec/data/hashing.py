"""Stable 64-bit hashing and the id schemes of categorical features.

Ids are never reduced modulo a table size: the embedding layer indexes them with a
hash index, so the readers only need ids that are stable across runs and machines
and that never collide across features. Every id is a non-negative int64.

Two schemes, chosen by ``SchemaConfig.categorical_encoding``:

* ``"hex"`` (Criteo): the value is a hex number below 2**32 and the feature's
  position ``f`` in the schema's categorical list (C1 is 0) is folded into the high
  bits: ``id = (f << 33) | value``. An empty value gets the per-feature *missing*
  id ``(f << 33) | (1 << 32)``, which no 32-bit value can take. The synthetic
  generator uses the same scheme.
* ``"hash"`` (any string or integer): ``id = mix64(fnv1a64(name + b"\\0" + value))``
  with the top bit cleared, where ``name`` is the column name and ``value`` the UTF-8
  bytes of the value (integers are hashed as their decimal text, so a CSV and a
  Parquet copy of the same data give the same ids). An empty or null value gets
  ``mix64(fnv1a64(name + b"\\xff"))``, and 0xFF never occurs in UTF-8 text.

>>> hex_id(0, 0x68FD1E64) == 0x68FD1E64 and hex_id(2, 0x1) == (2 << 33) | 1
True
>>> hash_text_id("C1", "abc") == hash_text_id("C1", "abc") != hash_text_id("C2", "abc")
True
"""

from __future__ import annotations

import numpy as np
from numba import njit

HEX_FEATURE_SHIFT = 33  # id = (f << 33) | value
HEX_MISSING = 1 << 32  # OR-ed into (f << 33) for an empty value
HEX_VALUE_MASK = (1 << HEX_FEATURE_SHIFT) - 1
MAX_FEATURES = 1 << (63 - HEX_FEATURE_SHIFT)  # features representable in the hex scheme

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_MASK63 = np.uint64((1 << 63) - 1)


@njit(cache=True, inline="always")
def mix64(z: np.uint64) -> np.uint64:
    """The splitmix64 finaliser: a bijection of uint64 with good avalanche."""
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@njit(cache=True, inline="always")
def splitmix64(x: np.uint64) -> np.uint64:
    """Counter-based pseudo-random uint64 of ``x`` (splitmix64's output function)."""
    return mix64(x + _GOLDEN)


@njit(cache=True, inline="always")
def fnv1a(state: np.uint64, data: np.ndarray, start: int, end: int) -> np.uint64:
    """Continue a 64-bit FNV-1a hash over ``data[start:end]`` (uint8)."""
    h = state
    for k in range(start, end):
        h = (h ^ np.uint64(data[k])) * _FNV_PRIME
    return h


@njit(cache=True, inline="always")
def finish_hash(state: np.uint64) -> np.int64:
    """Turn an FNV state into a non-negative int64 id."""
    return np.int64(mix64(state) & _MASK63)


def fnv1a_bytes(data: bytes, state: int = int(_FNV_OFFSET)) -> int:
    """FNV-1a 64 of a Python bytes object (for names; values go through numba)."""
    h = state
    for b in data:
        h = ((h ^ b) * int(_FNV_PRIME)) & 0xFFFFFFFFFFFFFFFF
    return h


def feature_hash_state(name: str) -> np.uint64:
    """The FNV state after ``name + b"\\0"``; value bytes continue from here."""
    return np.uint64(fnv1a_bytes(name.encode("utf-8") + b"\x00"))


def missing_hash_id(name: str) -> int:
    """The id of an empty or null value of feature ``name`` in the hash scheme."""
    return int(finish_hash(np.uint64(fnv1a_bytes(name.encode("utf-8") + b"\xff"))))


def hash_text_id(name: str, value: str) -> int:
    """The hash-scheme id of one value (a slow reference for tests and tools)."""
    if value == "":
        return missing_hash_id(name)
    return int(finish_hash(np.uint64(fnv1a_bytes(value.encode("utf-8"), int(feature_hash_state(name))))))


def hex_id(feature_index: int, value: int | None) -> int:
    """The hex-scheme id of a value (None = empty) of the ``feature_index``-th feature."""
    if not 0 <= feature_index < MAX_FEATURES:
        raise ValueError(f"feature index {feature_index} out of range")
    if value is None:
        return (feature_index << HEX_FEATURE_SHIFT) | HEX_MISSING
    if not 0 <= value < HEX_MISSING:
        raise ValueError(f"hex value {value:#x} does not fit in 32 bits")
    return (feature_index << HEX_FEATURE_SHIFT) | value
