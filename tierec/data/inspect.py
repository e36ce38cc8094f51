"""``tierec inspect FILE``: each column's inferred role, with counts, and a schema TOML to edit.

Reads a bounded sample (the first ``max_rows`` rows, 100,000 by default) of a
CSV / TSV file with or without a header, a raw Criteo TSV (no header, label,
13 integer and 26 hex columns), or a Parquet file. For every column it counts
the values read, distinct values, missing (empty) and malformed ones (not a
number in a column that is mostly numbers), and infers a role:

- ``label``: a column of 0/1 values (the first one named like a label, else the
  first 0/1 column), or a numeric column named like a label or rating (then
  ``data.schema.label_threshold`` must turn it into clicks: the TOML says so);
- ``numeric``: mostly numbers -> ``data.schema.dense``; except integer columns
  named like ids (``user``, ``item_id``, ``movieId``, ...) or codes (``C14``,
  ``banner_pos``, ``device_type``, ...), which are categorical;
- ``categorical``: anything else;
- ``key``: a categorical column with a different value in every row (at least
  1,000 rows read): a row key, left out of the features (each id would be seen
  once) and named in the TOML for ``tierec predict --key``;
- ``multi-valued``: categorical values holding a separator (``|``, ``;``, or
  ``,`` in a TSV) in at least 5% of the rows, with the separator.

The schema TOML (:func:`schema_toml`) is a config file for ``tierec train --config``.

>>> import tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "t.csv")
>>> _ = open(path, "w").write("user,price,tags,clicked\\nu1,2.5,a|b,1\\nu2,3,b,0\\nu1,,a|c,0\\n")
>>> report = inspect_file(path)
>>> [(c.name, c.role) for c in report.columns]
[('user', 'categorical'), ('price', 'numeric'), ('tags', 'multi-valued'), ('clicked', 'label')]
>>> print(schema_toml(report).split("[data.schema]")[1].strip().splitlines()[0])
label = "clicked"
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from tierec.data.errors import DataError

DEFAULT_SAMPLE_ROWS = 100_000
_LABEL_NAMES = re.compile(r"^(label|labels|click|clicks|clicked|is_click|target|y|conversion|converted|purchase|purchased)$", re.I)
_RATING_NAMES = re.compile(r"rating|score|stars", re.I)
_ID_NAMES = re.compile(r"(^|_)(id|ids|uid|iid|user|users|item|items|movie|product|ad|advertiser|campaign|query|session|userid|itemid)$", re.I)
# Integer codes, not quantities: Criteo's and Avazu's anonymised C1, C14, ..., and columns named like a kind of thing.
_CODE_NAMES = re.compile(r"(^|_)(c\d+|type|pos|position|category|code|class|kind|occupation|gender|zip|zipcode|country|city)$", re.I)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")  # movieId -> movie_Id, ItemID -> Item_ID
_SEPARATORS = ("|", ";", ",")
_HEX = re.compile(r"^[0-9a-fA-F]{8}$")
CRITEO_FIELDS = 40
KEY_MIN_ROWS = 1_000  # a column with a different value in every one of at least this many rows is a row key


def _words(name: str) -> str:
    return _CAMEL.sub("_", name.strip()).replace("-", "_").replace(" ", "_")


def id_named(name: str) -> bool:
    """Whether a column's name says it holds ids (``user``, ``item_id``, ``movieId``, ``ItemID``, ``ad-id``)."""
    return bool(_ID_NAMES.search(_words(name)))


def code_named(name: str) -> bool:
    """Whether a column's name says its integers are codes (``C14``, ``banner_pos``, ``device_type``, ``occupation``)."""
    return bool(_CODE_NAMES.search(_words(name)))


@dataclass
class ColumnReport:
    name: str
    values: int = 0  # rows read that have this column
    missing: int = 0  # empty / null
    distinct: int = 0  # distinct non-missing values
    numbers: int = 0  # non-missing values that parse as numbers
    integers: int = 0  # ... that are whole numbers
    binary: bool = False  # every number is 0 or 1, and every value a number
    high: float = -math.inf  # the largest number
    separator: str = ""  # for a multi-valued column
    role: str = ""  # label | numeric | categorical | multi-valued | key

    @property
    def malformed(self) -> int:
        """Values that are not numbers in a numeric or label column (0 for the other roles)."""
        return self.values - self.missing - self.numbers if self.role in ("numeric", "label") else 0


@dataclass
class InspectReport:
    path: str
    format: str  # csv | tsv | parquet | criteo
    rows: int  # rows read (the sample)
    header: bool
    delimiter: str
    columns: list[ColumnReport] = field(default_factory=list)
    malformed_rows: int = 0  # text rows with the wrong number of fields (not counted in the columns)
    truncated: bool = False  # the file has more rows than were read

    def column(self, role: str) -> list[ColumnReport]:
        return [c for c in self.columns if c.role == role]


def _number(text: str) -> float | None:
    try:
        x = float(text)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def _sample_text(path: Path, max_rows: int) -> tuple[str, list[list[str]], bool, int]:
    """(delimiter, rows of fields, more rows left, rows with a field count unlike the first row's)."""
    with path.open(newline="") as f:
        first = f.readline()
        if not first:
            raise DataError(f"{path}: the file is empty")
        delimiter = "\t" if "\t" in first else ","
        f.seek(0)
        rows: list[list[str]] = []
        bad = 0
        width = None
        more = False
        for row in csv.reader(f, delimiter=delimiter):
            if len(rows) + bad >= max_rows + 1:  # + 1: a header line does not count as a data row
                more = True
                break
            if width is None:
                width = len(row)
            if len(row) != width:
                bad += 1
                continue
            rows.append(row)
    return delimiter, rows, more, bad


def _looks_like_header(rows: list[list[str]]) -> bool:
    """The first row has no numbers where the following rows mostly have them, or only distinct non-numbers."""
    if len(rows) < 2:
        return all(_number(v) is None for v in rows[0])
    first, rest = rows[0], rows[1 : 101]
    for j, v in enumerate(first):
        if _number(v) is None and v != "":
            below = sum(_number(r[j]) is not None for r in rest)
            if below > len(rest) / 2:
                return True
    return all(_number(v) is None and v != "" for v in first) and len(set(first)) == len(first)


def _is_criteo(rows: list[list[str]], delimiter: str) -> bool:
    if delimiter != "\t" or not rows or len(rows[0]) != CRITEO_FIELDS:
        return False
    sample = rows[:100]
    labels_ok = all(r[0] in ("0", "1") for r in sample)
    hex_ok = sum(bool(_HEX.match(v)) for r in sample for v in r[14:] if v) > 0.9 * sum(bool(v) for r in sample for v in r[14:])
    return labels_ok and hex_ok


def _column(name: str, values: list[str | None], delimiter: str, named: bool = True) -> ColumnReport:
    """One column's counts and role; ``named``: the name is the file's (not c0, c1, ... of a headerless file)."""
    c = ColumnReport(name=name, values=len(values))
    seen: set[str] = set()
    with_sep = {s: 0 for s in _SEPARATORS if s != delimiter}
    binary = True
    for v in values:
        if v is None or v == "":
            c.missing += 1
            continue
        seen.add(v)
        x = _number(v)
        if x is None:
            binary = False
            for s in with_sep:
                if s in v:
                    with_sep[s] += 1
            continue
        c.numbers += 1
        c.high = max(c.high, x)
        if x == int(x):
            c.integers += 1
        if x not in (0.0, 1.0):
            binary = False
    c.distinct = len(seen)
    present = c.values - c.missing
    c.binary = binary and present > 0
    numeric = present > 0 and c.numbers > present / 2
    if numeric:
        codes = c.integers == c.numbers and not c.binary and named and (id_named(name) or code_named(name))
        c.role = "categorical" if codes else "numeric"
    else:
        c.role = "categorical"
        if present:
            sep, count = max(with_sep.items(), key=lambda kv: kv[1], default=("", 0))
            if count >= 0.05 * present:
                c.role, c.separator = "multi-valued", sep
    if c.role == "categorical" and present >= KEY_MIN_ROWS and c.distinct == present:
        c.role = "key"  # every id seen once: no signal to learn, but what `predict --key` wants
    return c


def _choose_label(columns: list[ColumnReport]) -> None:
    binary = [c for c in columns if c.binary and c.role == "numeric"]
    named = [c for c in binary if _LABEL_NAMES.match(c.name)]
    rating = [c for c in columns if c.role == "numeric" and (_RATING_NAMES.search(c.name) or _LABEL_NAMES.match(c.name))]
    pick = (named or binary or rating or [None])[0]
    if pick is not None:
        pick.role = "label"


def inspect_file(path: str | Path, max_rows: int = DEFAULT_SAMPLE_ROWS, fmt: str = "auto") -> InspectReport:
    """Read up to ``max_rows`` rows of ``path`` and infer each column's role (see the module docstring)."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: no such file")
    if max_rows < 1:
        raise DataError(f"--rows must be >= 1, got {max_rows}")
    if fmt == "parquet" or (fmt == "auto" and p.suffix.lower() in (".parquet", ".pq")):
        return _inspect_parquet(p, max_rows)
    delimiter, rows, more, bad = _sample_text(p, max_rows)
    if not rows:
        raise DataError(f"{p}: no rows")
    if _is_criteo(rows, delimiter) and fmt in ("auto", "criteo", "tsv"):
        rows = rows[:max_rows]
        names = ["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))]
        report = InspectReport(str(p), "criteo", len(rows), False, delimiter, malformed_rows=bad, truncated=more)
        for j, name in enumerate(names):
            c = _column(name, [r[j] for r in rows], delimiter)
            c.role = "label" if j == 0 else ("numeric" if j < 14 else "categorical")
            report.columns.append(c)
        return report
    header = _looks_like_header(rows)
    names = rows[0] if header else [f"c{j}" for j in range(len(rows[0]))]
    data = rows[1:] if header else rows
    data, more = data[:max_rows], more or len(data) > max_rows
    report = InspectReport(str(p), "tsv" if delimiter == "\t" else "csv", len(data), header, delimiter, malformed_rows=bad, truncated=more)
    report.columns = [_column(name, [r[j] for r in data], delimiter, named=header) for j, name in enumerate(names)]
    _choose_label(report.columns)
    return report


def _inspect_parquet(p: Path, max_rows: int) -> InspectReport:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        f = pq.ParquetFile(p)
    except pa.ArrowException as e:
        raise DataError(f"{p}: not a Parquet file ({e})") from None
    batches, n = [], 0
    for b in f.iter_batches(batch_size=min(max_rows, 65536)):
        batches.append(b.slice(0, max_rows - n))
        n += min(len(b), max_rows - n)
        if n >= max_rows:
            break
    table = pa.Table.from_batches(batches, schema=f.schema_arrow)
    report = InspectReport(str(p), "parquet", table.num_rows, True, "", truncated=f.metadata.num_rows > table.num_rows)
    for name in table.column_names:
        col = table.column(name)
        if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            values = col.to_pylist()
            c = ColumnReport(name=name, values=len(values), role="multi-valued", separator="")
            c.missing = sum(v is None or len(v) == 0 for v in values)
            c.distinct = len({x for v in values if v for x in v})
            report.columns.append(c)
            continue
        values = [None if v is None else (str(v) if not isinstance(v, float) else repr(v)) for v in col.to_pylist()]
        report.columns.append(_column(name, values, ""))
    _choose_label(report.columns)
    return report


def describe(report: InspectReport) -> str:
    """The table ``tierec inspect`` prints: one line per column, then the totals."""
    sample = f"first {report.rows:,} rows" + (" (more in the file)" if report.truncated else " (the whole file)")
    head = f"{report.path}: {report.format}, {'a header line' if report.header else 'no header line'}, {sample}"
    lines = [head, f"{'column':<16} {'role':<26} {'distinct':>9} {'missing':>9} {'malformed':>9}"]
    for c in report.columns:
        role = c.role + (f" (separator {c.separator!r})" if c.separator else "")
        if c.role == "label" and not c.binary:
            role += " (not 0/1: threshold)"
        if c.role == "key":
            role = "row key (left out)"
        lines.append(f"{c.name:<16} {role:<26} {c.distinct:>9,} {c.missing:>9,} {c.malformed:>9,}")
    if report.malformed_rows:
        lines.append(f"{report.malformed_rows:,} rows with a different number of fields than the first (skipped here, and in training)")
    return "\n".join(lines)


def _toml_list(names: list[str]) -> str:
    return "[" + ", ".join(json.dumps(n) for n in names) + "]"


def schema_toml(report: InspectReport) -> str:
    """A config file with ``[data]`` and ``[data.schema]`` for ``tierec train --config``: edit it, then train."""
    out = [
        f"# Written by `tierec inspect {report.path}` from its first {report.rows:,} rows: the roles are guesses; edit them.",
        f"# Then: tierec train --config THIS_FILE --run-dir runs/NAME",
        "",
        "[data]",
        f"source = {json.dumps(str(Path(report.path).resolve()))}",
        f"format = {json.dumps(report.format)}",
        "",
        "[data.schema]",
    ]
    if report.format == "criteo":
        out.append('preset = "criteo"  # label, I1..I13 (log1p), C1..C26 (hex ids)')
        return "\n".join(out) + "\n"
    labels = report.column("label")
    if labels:
        out.append(f"label = {json.dumps(labels[0].name)}")
        if not labels[0].binary:
            out.append("label_threshold = 4  # the label is not 0/1: values >= this are clicks; set it for your data")
    else:
        out.append('label = "label"  # no 0/1 column found: name the label column')
    dense = [c.name for c in report.column("numeric")]
    categorical = [c.name for c in report.columns if c.role in ("categorical", "multi-valued")]
    multi = report.column("multi-valued")
    out.append(f"dense = {_toml_list(dense)}")
    if any(c.high > 100 for c in report.column("numeric")):
        # a linear map of raw counts in the thousands saturates the first layers; log(1 + max(x, 0)) keeps their order
        out.append('dense_transform = "log1p"  # numbers up to ' + f"{max(c.high for c in report.column('numeric')):,.0f}" + '; "none" keeps them as they are')
    out.append(f"categorical = {_toml_list(categorical)}")
    if multi:
        out.append(f"multi_valued = {_toml_list([c.name for c in multi])}")
        seps = {c.separator for c in multi if c.separator}
        if seps:
            out.append(f"separator = {json.dumps(sorted(seps)[0])}" + ("  # columns use different separators" if len(seps) > 1 else ""))
    for c in report.column("key"):
        out.append(f"# left out: {c.name!r} has a different value in each of {c.distinct:,} rows (a row key, nothing to learn);")
        out.append(f"# score new data with `tierec predict ... --key {c.name}`")
    if report.format in ("csv", "tsv"):
        if not report.header:
            out.append("header = false")
            out.append(f"columns = {_toml_list([c.name for c in report.columns])}")
    return "\n".join(out) + "\n"
