"""Helpers for the data-layer tests: invented Criteo-format rows and batch comparison (not a test module)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tierec.batch import Batch

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "criteo"
CRITEO_HEAD = SHARED / "train_head10000.txt"
CRITEO_CSV = SHARED / "sample200_with_header.csv"


def criteo_line(label: object = 0, ints: list[object] | None = None, cats: list[str] | None = None) -> str:
    """One raw Criteo line of invented values (13 ints, 26 hex ids by default)."""
    ints = ints if ints is not None else [i for i in range(13)]
    cats = cats if cats is not None else [f"{(0x1000 * (f + 1) + 7):08x}" for f in range(26)]
    return "\t".join([str(label), *("" if v is None else str(v) for v in ints), *cats])


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def synthetic_rows(n: int, seed: int = 0) -> list[str]:
    """``n`` invented Criteo lines with varied values."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ints = [None if (i + j) % 5 == 0 else int(torch.randint(-3, 500, (1,), generator=g)) for j in range(13)]
        cats = ["" if (i * 7 + f) % 11 == 0 else f"{int(torch.randint(0, 2**31, (1,), generator=g)):08x}" for f in range(26)]
        out.append(criteo_line(i % 4 == 0 and 1 or 0, ints, cats))
    return out


def assert_same_batches(a: list[Batch], b: list[Batch]) -> None:
    assert len(a) == len(b), f"{len(a)} batches vs {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.sparse.keys == y.sparse.keys, i
        assert torch.equal(x.labels, y.labels), i
        assert torch.equal(x.dense, y.dense), i
        assert torch.equal(x.sparse.values, y.sparse.values), i
        assert torch.equal(x.sparse.offsets, y.sparse.offsets), i
        assert x.sparse.batch_size == y.sparse.batch_size, i


needs_criteo = pytest.mark.skipif(not CRITEO_HEAD.exists(), reason="Criteo sample not available in ../shared/data")
needs_criteo_csv = pytest.mark.skipif(not CRITEO_CSV.exists(), reason="Criteo CSV sample not available in ../shared/data")
