"""Row filters: keep only the rows where a simple condition on one column holds (``data.schema.filter``).

A filter is ``COLUMN OP NUMBER`` with OP one of ``==  !=  <  <=  >  >=``, e.g. ``rating != 0`` for a
ratings file where 0 means "not rated". The column is read as a number (a value that is not one fails
every condition but ``!=``); rows that fail are dropped before training and evaluation, and are not
malformed rows (they are neither counted nor reported as such).

>>> import numpy as np
>>> f = RowFilter.parse("rating != 0")
>>> f.column, f.keep(np.array([0.0, 3.0, np.nan])).tolist()
('rating', [False, True, True])
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tierec.config import ConfigError

_OPS: dict[str, Callable[[np.ndarray, float], np.ndarray]] = {
    "==": operator.eq, "!=": operator.ne, "<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt,
}
_SYNTAX = re.compile(r"^\s*(?P<column>[^\s=!<>]+)\s*(?P<op>==|!=|<=|>=|<|>)\s*(?P<value>\S+)\s*$")


@dataclass(frozen=True)
class RowFilter:
    column: str
    op: str
    value: float

    @staticmethod
    def parse(text: str, key: str = "data.schema.filter") -> RowFilter:
        m = _SYNTAX.match(text)
        if m is None:
            raise ConfigError(f"{key} {text!r} is not COLUMN OP NUMBER (OP one of {' '.join(_OPS)}), e.g. \"rating != 0\"")
        try:
            value = float(m["value"])
        except ValueError:
            raise ConfigError(f"{key} {text!r}: {m['value']!r} is not a number") from None
        return RowFilter(m["column"], m["op"], value)

    def keep(self, values: np.ndarray) -> np.ndarray:
        """[n] bool: the rows whose value (float64, NaN where not a number) meets the condition."""
        with np.errstate(invalid="ignore"):
            return np.asarray(_OPS[self.op](values, self.value), dtype=bool)

    def __str__(self) -> str:
        return f"{self.column} {self.op} {self.value:g}"
