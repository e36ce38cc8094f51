"""``tierec inspect FILE``: each column's inferred role, with counts and the reason, and a schema TOML to edit.

Reads a bounded sample (the first ``max_rows`` rows, 100,000 by default) of a
CSV / TSV / ``::``-separated file with or without a header, a raw Criteo TSV
(label, 13 integer and 26 hex columns), or a Parquet file. How a text file is
written (encoding, delimiter, quoting, header) is :mod:`tierec.data.sniff`'s
guess. For every column it counts the values read, distinct values, missing
(empty) and malformed ones (not a number in a numeric or label column), and
infers a role, each with its reason (:attr:`ColumnReport.reason`):

- ``label``: a 0/1 column (named like a label first), else a numeric column named
  like a label or rating, else a column of few small whole numbers (a rating
  scale such as 1-5 or -10..10); not 0/1, it gets a proposed threshold. Without
  any, a count column (times used, plays) is proposed with a threshold;
- ``timestamp``: whole numbers that are Unix times (seconds or milliseconds):
  left out of the features and proposed as the split column;
- ``numeric``: numbers (letters in no more than a few values); except whole
  numbers named like ids or codes, or, without a header, spread evenly over
  their range like ids (``categorical``);
- ``categorical``: anything else, including a column with letters mixed with
  digits in some values (an ISBN);
- ``multi-valued``: categorical values holding a separator in >= 5% of rows;
- ``key`` / ``constant``: a categorical column with a different value in (nearly)
  every one of >= 1,000 rows, or a column with one value: left out.

The schema TOML is :func:`tierec.data.inspect_toml.schema_toml`.

>>> import tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "t.csv")
>>> _ = open(path, "w").write("user,price,tags,clicked\\nu1,2.5,a|b,1\\nu2,3,b,0\\nu1,,a|c,0\\n")
>>> report = inspect_file(path)
>>> [(c.name, c.role) for c in report.columns]
[('user', 'categorical'), ('price', 'numeric'), ('tags', 'multi-valued'), ('clicked', 'label')]
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tierec.data.errors import DataError
from tierec.data.inspect_implicit import NegativesProposal, propose_negatives
from tierec.data.inspect_names import COUNT_NAMES as _COUNT_NAMES
from tierec.data.inspect_names import joined_words as _words
from tierec.data.sniff import Sample, number, read_sample

DEFAULT_SAMPLE_ROWS = 100_000
_LABEL_NAMES = re.compile(r"^(label|labels|click|clicks|clicked|is_click|target|y|conversion|converted|purchase|purchased)$", re.I)
_RATING_NAMES = re.compile(r"rating|score|stars", re.I)
_TIME_NAMES = re.compile(r"(^|_)(time|timestamp|ts|date|datetime|unixtime|unix_time)$", re.I)
_ID_NAMES = re.compile(r"(^|_)(id|ids|uid|iid|user|users|item|items|movie|product|ad|advertiser|campaign|query|session|userid|itemid)$", re.I)
# Integer codes, not quantities: Criteo's and Avazu's anonymised C1, C14, ..., and columns named like a kind of thing.
_CODE_NAMES = re.compile(r"(^|_)(c\d+|type|pos|position|category|code|class|kind|occupation|gender|zip|zipcode|country|city)$", re.I)
_LETTER = re.compile(r"[A-Za-z]")
_DIGIT = re.compile(r"[0-9]")
_SEPARATORS = ("|", ";", ",")
_HEX = re.compile(r"^[0-9a-fA-F]{8}$")
CRITEO_FIELDS = 40
KEY_MIN_ROWS = 1_000  # a column with a different value in (nearly) every one of at least this many rows is a row key
NEAR_UNIQUE = 0.9  # ... "nearly": this share of its values distinct
UNIX_SECONDS = (1e8, 4.2e9)  # 1973 .. 2103
UNIX_MILLISECONDS = (1e11, 4.2e12)


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
    low: float = math.inf  # the smallest number
    median: float = math.nan  # of the numbers
    increasing: float = 0.0  # share of consecutive numbers that do not decrease
    coded: int = 0  # values that are not numbers but mix letters and digits (ISBN 034545104X)
    example: str = ""  # one such value
    separator: str = ""  # for a multi-valued column
    role: str = ""  # label | numeric | categorical | multi-valued | key | constant | timestamp
    reason: str = ""  # why that role, one short clause
    threshold: float = math.nan  # a label's proposed label_threshold (nan: 0/1 labels)
    positives: float = math.nan  # the share of sample rows at or above it
    threshold_reason: str = ""  # why that threshold

    @property
    def malformed(self) -> int:
        """Values that are not numbers in a numeric or label column (0 for the other roles)."""
        return self.values - self.missing - self.numbers if self.role in ("numeric", "label") else 0

    @property
    def left_out(self) -> bool:
        return self.role in ("key", "constant", "timestamp", "count")


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
    notes: list[str] = field(default_factory=list)  # about the file as a whole (encoding, order)
    grouped_by: str = ""  # a categorical column whose values come in one run each (the file is sorted by it)
    negatives: NegativesProposal | None = None  # no label: sampled negatives for a user and an item column

    def column(self, role: str) -> list[ColumnReport]:
        return [c for c in self.columns if c.role == role]


def _stats(name: str, values: list[str | None], delimiter: str) -> tuple[ColumnReport, dict[str, int], list[float]]:
    c = ColumnReport(name=name, values=len(values))
    seen: set[str] = set()
    with_sep = {s: 0 for s in _SEPARATORS if s != delimiter}
    nums: list[float] = []
    binary = True
    for v in values:
        if v is None or v == "":
            c.missing += 1
            continue
        seen.add(v)
        x = number(v)
        if x is None:
            binary = False
            if _LETTER.search(v) and _DIGIT.search(v):
                c.coded += 1
                c.example = c.example or v
            for s in with_sep:
                if s in v:
                    with_sep[s] += 1
            continue
        nums.append(x)
        if x == int(x):
            c.integers += 1
        if x not in (0.0, 1.0):
            binary = False
    c.numbers = len(nums)
    c.distinct = len(seen)
    c.binary = binary and c.numbers > 0
    if nums:
        a = np.asarray(nums)
        c.low, c.high, c.median = float(a.min()), float(a.max()), float(np.median(a))
        c.increasing = float(np.mean(np.diff(a) >= 0)) if a.size > 1 else 0.0
    return c, with_sep, nums


def _column(name: str, values: list[str | None], delimiter: str, named: bool = True) -> ColumnReport:
    """One column's counts, role and reason; ``named``: the name is the file's (not c0, c1, ... of a headerless file)."""
    c, with_sep, _ = _stats(name, values, delimiter)
    present = c.values - c.missing
    if c.distinct <= 1:
        c.role = "constant"
        value = next((v for v in values if v), "")
        c.reason = "every value is empty" if not present else f"one value ({value!r}) in every row" + (
            f" that has one ({c.missing:,} are empty)" if c.missing else "")
        return c
    if present and c.numbers > present / 2 and c.coded < max(1, 0.005 * present):
        _numeric_role(c, named)
    else:
        c.role = "categorical"
        c.reason = f"letters with digits in {c.coded:,} values (e.g. {c.example!r}): codes, not numbers" if c.coded else "text"
    if present and c.role == "categorical" and c.numbers <= present / 2:
        sep, count = max(with_sep.items(), key=lambda kv: kv[1], default=("", 0))
        if count >= 0.05 * present:
            c.role, c.separator = "multi-valued", sep
            c.reason = f"{sep!r} inside {count:,} values: several values per row"
    if c.role == "categorical" and present >= KEY_MIN_ROWS and c.distinct >= NEAR_UNIQUE * present:
        c.role = "key"  # (nearly) every id seen once: no signal to learn, but what `predict --key` wants
        c.reason = f"{c.distinct:,} distinct values in {present:,} rows: nearly every value seen once, nothing to learn"
    return c


def _numeric_role(c: ColumnReport, named: bool) -> None:
    whole = c.integers == c.numbers
    seconds = UNIX_SECONDS[0] <= c.low and c.high <= UNIX_SECONDS[1]
    millis = UNIX_MILLISECONDS[0] <= c.low and c.high <= UNIX_MILLISECONDS[1]
    if whole and (seconds or millis) and (c.distinct >= 10 or (named and _TIME_NAMES.search(_words(c.name)))):
        c.role = "timestamp"
        scale = 1000 if millis else 1
        years = "-".join(str(1970 + int(x / scale / 31_557_600)) for x in (c.low, c.high))
        order = "increasing through the file" if c.increasing >= 0.99 else "not in time order in the file"
        c.reason = f"Unix times ({years}; {order}): the split column, not a feature (test rows come after training rows)"
        return
    if whole and not c.binary and named and (id_named(c.name) or code_named(c.name)):
        c.role, c.reason = "categorical", "whole numbers named like ids or codes"
        return
    if whole and not named and c.low >= 0 and c.distinct >= 100 and c.median >= 0.2 * c.high:
        c.role = "categorical"
        c.reason = f"{c.distinct:,} whole numbers spread evenly over {c.low:.0f}..{c.high:.0f} (median {c.median:.0f}): ids, not amounts"
        return
    c.role = "numeric"
    c.reason = f"numbers from {c.low:g} to {c.high:g}"
    if c.numbers < c.values - c.missing:
        c.reason += f" ({c.values - c.missing - c.numbers:,} values are not: malformed, skipped in training)"


def _propose_threshold(c: ColumnReport, nums: list[float]) -> None:
    """A label_threshold for a label that is not 0/1, and the share of rows it makes positive."""
    a = np.asarray(nums)
    if c.low < 0 < c.high:  # a scale around 0 (jokes, -10..10): the ratings of 0 and above
        c.threshold = 0.0
        why = "ratings of 0 and above"
    elif c.role == "label" and c.reason.startswith("counts"):
        values = np.unique(a)
        at_least = np.array([(a >= v).mean() for v in values])
        c.threshold = float(values[np.argmax(at_least <= 0.5)]) if (at_least <= 0.5).any() else float(values[-1])
        why = "the heavier half of the uses"
    else:  # a scale from low to high (1-5): the top quarter of it
        c.threshold = c.low + math.ceil(0.75 * (c.high - c.low))
        why = f"the top of the {c.low:g}..{c.high:g} scale"
    c.positives = float((a >= c.threshold).mean()) if a.size else math.nan
    c.threshold_reason = f"values >= {c.threshold:g} ({why}, {c.positives:.0%} of the rows read) are positives"


def _choose_label(columns: list[ColumnReport], values: dict[str, list[float]], counts_too: bool = True) -> None:
    """The label among the numeric columns; ``counts_too``: a count column when there is no other."""
    numeric = [c for c in columns if c.role == "numeric"]
    binary = [c for c in numeric if c.binary]
    named = [c for c in binary if _LABEL_NAMES.match(c.name)]
    rating = [c for c in numeric if not c.binary and (_RATING_NAMES.search(c.name) or _LABEL_NAMES.match(c.name))]
    scale = [c for c in numeric if not c.binary and c.integers == c.numbers and 2 <= c.distinct <= 21 and -10 <= c.low and c.high <= 10]
    counts = [c for c in numeric if c.integers == c.numbers and c.low >= 0 and (_COUNT_NAMES.search(_words(c.name)) or len(numeric) == 1)]
    why = {"named": "0/1 values, named like a label", "binary": "0/1 values", "rating": "numbers named like a rating",
           "scale": "few small whole numbers: a rating scale",
           "counts": "counts (no 0/1 or rating column: every row is a use; the label says which uses are heavy)"}
    kinds = (("named", named), ("binary", binary), ("rating", rating), ("scale", scale)) + ((("counts", counts),) if counts_too else ())
    for kind, group in kinds:
        if group:
            pick = group[0]
            pick.role, pick.reason = "label", why[kind]
            if not pick.binary:
                _propose_threshold(pick, values[pick.name])
            return


def _grouped(columns: list[ColumnReport], cols: dict[str, list[str]]) -> str:
    """A categorical column whose values each come in one run (the file is sorted by it), or ""."""
    for c in columns:
        v = cols.get(c.name)
        if c.role != "categorical" or not v or c.distinct < 20 or 2 * c.distinct > len(v):
            continue
        runs = 1 + sum(a != b for a, b in zip(v, v[1:]))
        if runs == c.distinct:
            return c.name
    return ""


def inspect_file(
    path: str | Path, max_rows: int = DEFAULT_SAMPLE_ROWS, fmt: str = "auto", *,
    delimiter: str = "", header: bool | None = None, encoding: str = "",
) -> InspectReport:
    """Read up to ``max_rows`` rows of ``path`` and infer each column's role (see the module docstring).

    ``delimiter``, ``header`` and ``encoding`` say how a text file is written instead of guessing it.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: no such file")
    if max_rows < 1:
        raise DataError(f"--rows must be >= 1, got {max_rows}")
    if encoding:
        try:
            "".encode(encoding)
        except LookupError:
            raise DataError(f"--encoding {encoding!r} is not an encoding Python knows") from None
    if fmt == "parquet" or (fmt == "auto" and p.suffix.lower() in (".parquet", ".pq")):
        return _inspect_parquet(p, max_rows)
    if not delimiter and fmt in ("tsv", "criteo"):
        delimiter = "\t"
    s = read_sample(p, max_rows, delimiter=delimiter, header=header, encoding=encoding)
    if not s.rows:
        raise DataError(f"{p}: no rows" + (" below the header" if s.header else ""))
    if _is_criteo(s) and fmt in ("auto", "criteo", "tsv") and header is not True:
        return _criteo_report(p, s)
    text_format = "tsv" if s.delimiter == "\t" else "csv"
    report = InspectReport(str(p), text_format, len(s.rows), s.header, s.delimiter, malformed_rows=s.bad_width,
                           truncated=s.more, notes=list(s.notes))
    cols = {name: [r[j] for r in s.rows] for j, name in enumerate(s.names)}
    report.columns = [_column(name, cols[name], s.delimiter, named=s.header) for name in s.names]
    values = {c.name: [x for x in (number(v) for v in cols[c.name] if v) if x is not None] for c in report.columns}
    _choose_label_or_negatives(report, values, cols)
    report.grouped_by = _grouped(report.columns, cols)
    return report


def _choose_label_or_negatives(report: InspectReport, values: dict[str, list[float]], cols: dict[str, list[str | None]]) -> None:
    """A label column; without a 0/1, rating or scale one, sampled negatives for a user and an item column if there are
    such, else a count column as the label."""
    _choose_label(report.columns, values, counts_too=False)
    if report.column("label"):
        return
    report.negatives = propose_negatives(report.columns, report.header, cols)
    if report.negatives is None:
        _choose_label(report.columns, values)
        return
    for c in report.columns:
        if c.name in report.negatives.counts:
            c.role, c.reason = "count", report.negatives.counts[c.name]


def _is_criteo(s: Sample) -> bool:
    rows = s.rows if not s.header else s.rows
    if s.delimiter != "\t" or s.header or not rows or len(rows[0]) != CRITEO_FIELDS:
        return False
    sample = rows[:100]
    labels_ok = all(r[0] in ("0", "1") for r in sample)
    hex_ok = sum(bool(_HEX.match(v)) for r in sample for v in r[14:] if v) > 0.9 * sum(bool(v) for r in sample for v in r[14:])
    return labels_ok and hex_ok


def _criteo_report(p: Path, s: Sample) -> InspectReport:
    names = ["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))]
    report = InspectReport(str(p), "criteo", len(s.rows), False, "\t", malformed_rows=s.bad_width, truncated=s.more, notes=list(s.notes))
    for j, name in enumerate(names):
        c = _column(name, [r[j] for r in s.rows], "\t")
        c.role = "label" if j == 0 else ("numeric" if j < 14 else "categorical")
        c.reason = "the Criteo layout"
        report.columns.append(c)
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
    values: dict[str, list[float]] = {}
    texts: dict[str, list[str | None]] = {}
    for name in table.column_names:
        col = table.column(name)
        if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            lists = col.to_pylist()
            c = ColumnReport(name=name, values=len(lists), role="multi-valued", separator="", reason="a list column")
            c.missing = sum(v is None or len(v) == 0 for v in lists)
            c.distinct = len({x for v in lists if v for x in v})
            report.columns.append(c)
            continue
        text = [None if v is None else (str(v) if not isinstance(v, float) else repr(v)) for v in col.to_pylist()]
        report.columns.append(_column(name, text, ""))
        values[name] = [x for x in (number(v) for v in text if v) if x is not None]
        texts[name] = text
    _choose_label_or_negatives(report, values, texts)
    return report
