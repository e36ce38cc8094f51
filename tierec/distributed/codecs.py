"""Codecs for what crosses groups (``dist.compress``), and error feedback for the lossy ones.

A codec turns ``[N, D]`` float32 rows into one ``[N, row_bytes(D)]`` uint8
payload (the bytes on the wire, so one collective carries them) and back:

- ``none``: the float32 bytes (exact);
- ``fp16`` / ``bf16``: half precision (2 bytes a value);
- ``int8``: row-wise affine quantisation, 1 byte a value plus a float32 offset
  (the row's minimum) and scale ((max - min) / 255) per row: D + 8 bytes a row.

Error feedback (``RowResiduals`` for embedding rows, keyed by (table, id);
``DenseResiduals`` for flat dense buffers, keyed by a name): what a lossy send
lost, ``(x + residual) - decode(encode(x + residual))``, is kept and added to
the next send of the same row, so the errors do not accumulate: the sum of
what was received over many sends stays within one quantisation step of the
sum of what was meant to be sent.

>>> import torch
>>> from tierec.distributed.codecs import codec
>>> c = codec("int8")
>>> x = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
>>> c.encode(x).shape, c.row_bytes(4)
(torch.Size([1, 12]), 12)
>>> torch.allclose(c.decode(c.encode(x), 4), x, atol=3 / 255)
True
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from tierec.embedding.hash_index import HashIndex


class Codec(Protocol):
    name: str
    lossy: bool

    def row_bytes(self, dim: int) -> int: ...  # bytes on the wire per row of ``dim`` floats

    def encode(self, x: Tensor) -> Tensor: ...  # [N, D] float32 -> [N, row_bytes(D)] uint8

    def decode(self, payload: Tensor, dim: int) -> Tensor: ...  # [N, row_bytes(D)] uint8 -> [N, D] float32


def _bytes(x: Tensor) -> Tensor:  # [N, D] any dtype -> [N, D * itemsize] uint8
    if x.numel() == 0:  # (an empty tensor's strides cannot be viewed as another dtype)
        return torch.empty(x.shape[0], x.shape[1] * x.element_size(), dtype=torch.uint8)
    return _packed(x).view(torch.uint8).reshape(x.shape[0], x.shape[1] * x.element_size())


def _packed(x: Tensor) -> Tensor:
    """``x`` with row-major strides (a column slice of one row is "contiguous" but keeps its row stride,
    and viewing it as a wider dtype needs the real row-major layout)."""
    return x.clone(memory_format=torch.contiguous_format) if x.dim() == 2 and x.stride(0) != x.shape[1] else x.contiguous()


class PlainCodec:
    """float32 (``none``) or a 16-bit float (``fp16``, ``bf16``): a cast."""

    def __init__(self, name: str, dtype: torch.dtype) -> None:
        self.name = name
        self.dtype = dtype
        self.lossy = dtype != torch.float32
        self._size = torch.tensor([], dtype=dtype).element_size()

    def row_bytes(self, dim: int) -> int:
        return dim * self._size

    def encode(self, x: Tensor) -> Tensor:
        return _bytes(x.to(self.dtype))

    def decode(self, payload: Tensor, dim: int) -> Tensor:
        if payload.numel() == 0:
            return torch.zeros(payload.shape[0], dim)
        return _packed(payload).view(self.dtype).reshape(payload.shape[0], dim).float()


class Int8RowCodec:
    """Row-wise int8: ``q = round((x - min) / scale)``, ``scale = (max - min) / 255``; offset and scale float32."""

    name = "int8"
    lossy = True

    def row_bytes(self, dim: int) -> int:
        return dim + 8

    def encode(self, x: Tensor) -> Tensor:
        x = x.float()
        lo = x.amin(1, keepdim=True) if x.shape[1] else x.new_zeros(x.shape[0], 1)  # [N, 1]
        hi = x.amax(1, keepdim=True) if x.shape[1] else lo
        scale = (hi - lo) / 255.0  # [N, 1]; 0 for a constant row
        inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
        q = ((x - lo) * inv).round_().clamp_(0, 255).to(torch.uint8)  # [N, D]
        return torch.cat([q, _bytes(torch.cat([lo, scale], 1))], 1)

    def decode(self, payload: Tensor, dim: int) -> Tensor:
        if payload.shape[0] == 0:
            return torch.zeros(0, dim)
        q = payload[:, :dim].float()
        lo_scale = _packed(payload[:, dim:]).view(torch.float32).reshape(-1, 2)  # [N, 2]
        return q * lo_scale[:, 1:2] + lo_scale[:, 0:1]


def codec(name: str) -> Codec:
    """The codec of a ``dist.compress`` value."""
    if name == "none":
        return PlainCodec("none", torch.float32)
    if name == "fp16":
        return PlainCodec("fp16", torch.float16)
    if name == "bf16":
        return PlainCodec("bf16", torch.bfloat16)
    if name == "int8":
        return Int8RowCodec()
    raise ValueError(f"dist.compress {name!r} is not one of none, fp16, bf16, int8")


def dense_rows(n: int, block: int) -> int:  # rows of ``block`` values that hold a flat buffer of n
    return -(-n // block)


DENSE_BLOCK = 64  # values per row when a flat dense buffer is sent row-wise (one int8 scale per 64 values)


def encode_flat(c: Codec, flat: Tensor, block: int = DENSE_BLOCK) -> Tensor:
    """A flat float buffer [n] as rows of ``block`` values (zero padded) -> payload [rows, row_bytes]."""
    rows = dense_rows(flat.numel(), block)
    padded = torch.zeros(rows * block, dtype=torch.float32)
    padded[: flat.numel()] = flat
    return c.encode(padded.view(rows, block))


def decode_flat(c: Codec, payload: Tensor, n: int, block: int = DENSE_BLOCK) -> Tensor:
    return c.decode(payload, block).reshape(-1)[:n]


class DenseResiduals:
    """Error feedback for flat dense buffers (DDP buckets, parameter vectors), keyed by a name."""

    def __init__(self) -> None:
        self._res: dict[object, Tensor] = {}

    def encode(self, key: object, c: Codec, flat: Tensor, block: int = DENSE_BLOCK) -> Tensor:
        """``flat`` plus its residual, encoded; the new residual is what the encoding lost."""
        if not c.lossy:
            return encode_flat(c, flat, block)
        r = self._res.get(key)
        want = flat.float() + r if r is not None and r.numel() == flat.numel() else flat.float().clone()
        payload = encode_flat(c, want, block)
        self._res[key] = want - decode_flat(c, payload, flat.numel(), block)
        return payload

    def nbytes(self) -> int:
        return sum(r.numel() * 4 for r in self._res.values())


class RowResiduals:
    """Error feedback for embedding rows: the residual of each (table, id), added to its next send."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.index = HashIndex()
        self.values = torch.zeros(0, dim)  # [capacity, D]

    def __len__(self) -> int:
        return self.index.num_rows

    def nbytes(self) -> int:  # bytes of residual rows (index excluded)
        return self.values.numel() * 4

    def encode(self, c: Codec, keys: np.ndarray, tabs: np.ndarray, x: Tensor) -> Tensor:
        """Rows ``x`` [N, D] of distinct (table, id) pairs plus their residuals, encoded; keeps the new residuals."""
        if not c.lossy:
            return c.encode(x)
        rows = self.index.lookup(keys, tabs.astype(np.int32, copy=False), insert=True).rows
        n = self.index.num_rows
        if n > self.values.shape[0]:
            grown = torch.zeros(max(n, 2 * self.values.shape[0]), self.dim)
            grown[: self.values.shape[0]] = self.values
            self.values = grown
        at = torch.from_numpy(rows)
        want = x.float() + self.values.index_select(0, at)
        payload = c.encode(want)
        self.values.index_copy_(0, at, want - c.decode(payload, self.dim))
        return payload


class SegmentedCodec:
    """A codec applied to column segments of a row separately (weights and each optimizer state of a record),
    so that int8's per-row range of one segment does not swamp another's. ``inner``: one codec for every
    segment, or one per segment (e.g. a gradient compressed, its access count beside it exact)."""

    def __init__(self, inner: Codec | list[Codec], widths: list[int]) -> None:
        self.inners = list(inner) if isinstance(inner, list) else [inner] * len(widths)
        if len(self.inners) != len(widths):
            raise ValueError(f"{len(self.inners)} codecs for {len(widths)} segments")
        self.widths = widths
        self.name = "+".join(dict.fromkeys(c.name for c in self.inners))
        self.lossy = any(c.lossy for c in self.inners)

    def row_bytes(self, dim: int) -> int:
        assert dim == sum(self.widths), (dim, self.widths)
        return sum(c.row_bytes(w) for c, w in zip(self.inners, self.widths))

    def encode(self, x: Tensor) -> Tensor:
        return torch.cat([c.encode(p) for c, p in zip(self.inners, torch.split(x, self.widths, dim=1))], 1)

    def decode(self, payload: Tensor, dim: int) -> Tensor:
        sizes = [c.row_bytes(w) for c, w in zip(self.inners, self.widths)]
        parts = torch.split(payload, sizes, dim=1)
        return torch.cat([c.decode(p, w) for c, p, w in zip(self.inners, parts, self.widths)], 1)
