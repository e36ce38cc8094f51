"""Markdown tables of benchmark results.

>>> from benchmarks.report import markdown_table
>>> print(markdown_table(["a", "b"], [[1, 2.5]]))
| a | b |
|---|---|
| 1 | 2.50 |
"""

from __future__ import annotations

import math


def fmt(x) -> str:
    if isinstance(x, float):
        if math.isnan(x):
            return "-"
        if abs(x) >= 1000:
            return f"{x:,.0f}"
        if abs(x) >= 10:
            return f"{x:.1f}"
        return f"{x:.3g}" if abs(x) < 1 else f"{x:.2f}"
    return str(x)


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
