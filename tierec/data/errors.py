"""Data errors and the malformed-row report.

A *bad source* (missing or empty file, a schema naming a column the file does not
have) raises :class:`DataError`, a one-line :class:`~tierec.config.ConfigError`
the CLI prints without a traceback. A *bad row* (wrong field count, a dense value
that is not a number, a categorical value that is not hex) is skipped and counted
in a :class:`ProblemReport`; at the end of a pass the report is emitted as ONE
:class:`MalformedRowsWarning`. With ``DataConfig.strict`` the first bad row raises
:class:`MalformedRowError` instead, naming file, line and problem.

>>> report = ProblemReport(path="train.txt", unit="line")
>>> report.add(17, "expected 40 tab-separated fields, found 39")
>>> report.malformed, report.summary()
(1, 'train.txt: skipped 1 malformed row (line 17: expected 40 tab-separated fields, found 39)')
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from tierec.config import ConfigError

class DataError(ConfigError):
    """A data source cannot be read at all; the message is one line."""


MAX_EXAMPLES = 5  # malformed rows quoted in the report
# A column malformed in more than half of the rows read is a wrong schema, not dirty data: checked
# once this many rows were read, and at the end of every pass.
MAJORITY_MIN_ROWS = 500


class NoSplitError(DataError):
    """The source has no such split (e.g. no test rows were set aside)."""


class MalformedRowError(DataError):
    """A malformed row with ``DataConfig.strict`` set: ``file:line: problem``."""


class MalformedRowsWarning(UserWarning):
    """Malformed rows were skipped during a pass over a source."""


@dataclass
class ProblemReport:
    """Malformed rows seen in one pass over one file.

    ``unit`` is ``"line"`` for text files (1-based physical line numbers, the header
    is line 1) and ``"row"`` for Parquet (1-based row numbers).
    """

    path: str
    unit: str = "line"
    malformed: int = 0
    examples: list[tuple[int, str]] = field(default_factory=list)  # (line, problem), the first few
    rows_read: int = 0  # rows seen in this pass, well-formed or not
    by_column: dict[str, int] = field(default_factory=dict)  # malformed rows per column at fault ("" = field count)

    def add(self, line: int, problem: str, column: str = "") -> None:
        self.malformed += 1
        self.by_column[column] = self.by_column.get(column, 0) + 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append((line, problem))

    def count_more(self, n: int, column: str = "") -> None:
        """Count ``n`` malformed rows without quoting them (the examples are full)."""
        self.malformed += n
        self.by_column[column] = self.by_column.get(column, 0) + n

    def count_rows(self, n: int) -> None:
        """``n`` more rows were read; raises DataError once a column is malformed in most of them."""
        self.rows_read += n
        self.check_columns(MAJORITY_MIN_ROWS)

    def check_columns(self, min_rows: int = 1) -> None:
        """DataError if, after at least ``min_rows`` rows, one column is malformed in more than half of them."""
        if self.rows_read < min_rows:
            return
        for column, bad in self.by_column.items():
            if column and 2 * bad > self.rows_read:
                quoted = [(line, p) for line, p in self.examples if p.startswith(f"column {column}:")] or self.examples
                example = f"; first: {self.unit} {quoted[0][0]}: {quoted[0][1]}" if quoted else ""
                raise DataError(
                    f"{self.path}: column {column} is malformed in {bad} of the {self.rows_read} rows read{example}"
                    " (is the column declared with the right role in data.schema?)"
                )

    @property
    def wants_examples(self) -> bool:
        return len(self.examples) < MAX_EXAMPLES

    @property
    def first_lines(self) -> list[int]:
        return [line for line, _ in self.examples]

    def summary(self) -> str:
        if not self.malformed:
            return f"{self.path}: no malformed rows"
        plural = "row" if self.malformed == 1 else "rows"
        first_line, first_problem = self.examples[0]
        lines = ", ".join(str(x) for x in self.first_lines)
        more = ", ..." if self.malformed > len(self.examples) else ""
        head = f"{self.path}: skipped {self.malformed} malformed {plural}"
        if len(self.examples) == 1:
            return f"{head} ({self.unit} {first_line}: {first_problem})"
        return f"{head} ({self.unit}s {lines}{more}; first: {self.unit} {first_line}: {first_problem})"

    def warn(self) -> None:
        """Emit the one end-of-pass warning if any row was skipped."""
        if self.malformed:
            warnings.warn(self.summary(), MalformedRowsWarning, stacklevel=3)

    @staticmethod
    def merged(path: str, reports: list[ProblemReport]) -> ProblemReport:
        """One report counting the rows of several (their examples in order, up to the limit)."""
        out = ProblemReport(path, reports[0].unit if reports else "line")
        for r in reports:
            out.malformed += r.malformed
            out.examples.extend(r.examples[: MAX_EXAMPLES - len(out.examples)])
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "unit": self.unit,
            "malformed": self.malformed,
            "examples": [[line, problem] for line, problem in self.examples],
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ProblemReport:
        return ProblemReport(
            path=str(d["path"]),
            unit=str(d.get("unit", "line")),
            malformed=int(d["malformed"]),
            examples=[(int(a), str(b)) for a, b in d.get("examples", [])],
        )


def strict_error(path: str, unit: str, line: int, problem: str) -> MalformedRowError:
    """The exception for a malformed row in strict mode."""
    where = f"{path}:{line}" if unit == "line" else f"{path}: row {line}"
    return MalformedRowError(f"{where}: {problem}")
