"""One table of an export as a safetensors file, written a block at a time and read memory-mapped.

Tensors, in file order: ``ids`` [n] int64 ascending; ``offsets`` [n + 1] int64
(ragged layout only: row i is ``values[offsets[i]:offsets[i + 1]]``); ``rows``
[n, dim] (whole layout) or ``values`` [total] (ragged), float32, float16 or
uint8; ``scale`` and ``bias`` [n] float32 (int8 only). The file is a plain
safetensors file (``safetensors.safe_open`` reads it), laid out by
:class:`TableFileWriter` itself so that rows can be appended in id order
without ever holding the table: the header is written first from the known
sizes, then each region is filled with positioned writes.

>>> import tempfile, os, numpy as np
>>> from tierec.serving.rows import RowChunk
>>> path = os.path.join(tempfile.mkdtemp(), "t.safetensors")
>>> w = TableFileWriter(path, TableShape(table="t", dim=2, layout="whole", precision="fp32", rows=2, values=4))
>>> w.append(RowChunk(np.array([3, 8]), np.array([2, 2]), np.arange(4, dtype=np.float32))); w.close()
>>> f = TableFile.open(path)
>>> f.ids.tolist(), f.array("rows").tolist()
([3, 8], [[0.0, 1.0], [2.0, 3.0]])
"""

from __future__ import annotations

import json
import mmap as mmap_module
import os
import struct
from dataclasses import dataclass

import numpy as np

from tierec.serving.manifest import ExportError
from tierec.serving.rows import VALUE_DTYPES, RowChunk

_ST_DTYPES = {np.dtype(np.int64): "I64", np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.uint8): "U8"}
_NP_DTYPES = {v: k for k, v in _ST_DTYPES.items()}


@dataclass(frozen=True, kw_only=True)
class TableShape:
    """What a table file will hold: its table, dim, layout (whole | ragged), precision, rows and total values."""

    table: str
    dim: int
    layout: str
    precision: str
    rows: int
    values: int  # sum of the rows' dims

    def tensors(self) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
        """(name, dtype, shape) of each tensor, in file order."""
        vdt = np.dtype(VALUE_DTYPES[self.precision])
        out = [("ids", np.dtype(np.int64), (self.rows,))]
        if self.layout == "ragged":
            out += [("offsets", np.dtype(np.int64), (self.rows + 1,)), ("values", vdt, (self.values,))]
        else:
            out.append(("rows", vdt, (self.rows, self.dim)))
        if self.precision == "int8":
            out += [("scale", np.dtype(np.float32), (self.rows,)), ("bias", np.dtype(np.float32), (self.rows,))]
        return out


class TableFileWriter:
    """Writes a table file of a known :class:`TableShape`; :meth:`append` takes rows in id order."""

    def __init__(self, path: str | os.PathLike, shape: TableShape) -> None:
        self.layout = shape.layout
        self.regions: dict[str, int] = {}  # name -> absolute file position of the next write
        self.ends: dict[str, int] = {}
        meta = {"table": shape.table, "layout": shape.layout, "precision": shape.precision, "dim": str(shape.dim)}
        header: dict[str, object] = {"__metadata__": meta}
        pos = 0
        spans = []
        for name, dt, dims in shape.tensors():
            nbytes = int(np.prod(dims, dtype=np.int64)) * dt.itemsize
            header[name] = {"dtype": _ST_DTYPES[dt], "shape": list(dims), "data_offsets": [pos, pos + nbytes]}
            spans.append((name, pos, pos + nbytes))
            pos += nbytes
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        base = 8 + len(text)
        for name, a, b in spans:
            self.regions[name], self.ends[name] = base + a, base + b
        # O_EXCL | O_NOFOLLOW: a fresh file in the export's new directory, never one reached through a link
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
        os.pwrite(self.fd, struct.pack("<Q", len(text)) + text, 0)
        os.ftruncate(self.fd, base + pos)
        self.next_offset = 0  # ragged: the values written so far
        if self.layout == "ragged":
            self._write("offsets", np.zeros(1, np.int64))

    def append(self, chunk: RowChunk) -> None:
        self._write("ids", chunk.ids.astype(np.int64, copy=False))
        if self.layout == "ragged":
            self._write("offsets", self.next_offset + np.cumsum(chunk.lens, dtype=np.int64))
            self.next_offset += int(chunk.lens.sum())
            self._write("values", chunk.values)
        else:
            self._write("rows", chunk.values)
        if chunk.scale is not None and chunk.bias is not None:
            self._write("scale", chunk.scale.astype(np.float32, copy=False))
            self._write("bias", chunk.bias.astype(np.float32, copy=False))

    def _write(self, name: str, a: np.ndarray) -> None:
        data = np.ascontiguousarray(a).tobytes()
        at = self.regions[name]
        if at + len(data) > self.ends[name]:
            raise ExportError(f"table file region {name} overflows: more rows than announced")
        view = memoryview(data)
        while view:
            n = os.pwrite(self.fd, view, at)
            view, at = view[n:], at + n
        self.regions[name] = at

    def close(self) -> None:
        short = [n for n, at in self.regions.items() if at != self.ends[n]]
        os.fsync(self.fd)
        os.close(self.fd)
        if short:
            raise ExportError(f"table file regions {short} were not filled: fewer rows than announced")


@dataclass(frozen=True)
class TableFile:
    """A table file's tensors as numpy arrays: memory-mapped (the default) or read into RAM."""

    arrays: dict[str, np.ndarray]
    meta: dict[str, str]

    @property
    def ids(self) -> np.ndarray:
        return self.arrays["ids"]

    def array(self, name: str) -> np.ndarray | None:
        return self.arrays.get(name)

    @staticmethod
    def open(path: str | os.PathLike, mmap: bool = True) -> TableFile:
        try:
            with open(path, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                if n > 100 << 20:
                    raise ExportError(f"{path} is not a table file (header of {n:,} bytes)")
                header = json.loads(f.read(n))
            size = os.path.getsize(path)
        except (OSError, ValueError, struct.error) as e:
            raise ExportError(f"cannot read table file {path} ({e})") from None
        meta = header.pop("__metadata__", {})
        arrays = {}
        mapped = _map(path) if mmap and size > 0 else None
        for name, spec in header.items():
            dt = _NP_DTYPES.get(spec.get("dtype"))
            a, b = spec["data_offsets"]
            if dt is None or 8 + n + b > size:
                raise ExportError(f"table file {path} is damaged or foreign (tensor {name!r})")
            shape = tuple(spec["shape"])
            if b == a:
                arrays[name] = np.zeros(shape, dt)
            elif mapped is not None:  # a plain ndarray over the mapping (np.memmap's subclass costs per indexing)
                count = (b - a) // dt.itemsize
                arrays[name] = np.frombuffer(mapped, dtype=dt, count=count, offset=8 + n + a).reshape(shape)
            else:
                arrays[name] = np.fromfile(path, dtype=dt, count=(b - a) // dt.itemsize, offset=8 + n + a).reshape(shape)
        if "ids" not in arrays:
            raise ExportError(f"table file {path} has no ids")
        return TableFile(arrays, meta)


def _map(path: str | os.PathLike) -> mmap_module.mmap:
    """The whole file mapped read-only (pages are read on first touch; the OS may drop them again)."""
    with open(path, "rb") as f:
        return mmap_module.mmap(f.fileno(), 0, access=mmap_module.ACCESS_READ)
