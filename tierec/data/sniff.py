"""How a delimited text file is written: its encoding, delimiter, quoting, header and trailing separator.

:func:`read_sample` reads the first rows of a file as bytes, line by line, so no
byte can stop it: a line that is not UTF-8 is read as latin-1 and counted (or every
line is decoded with ``encoding`` when given, bytes that do not fit replaced).
The delimiter is the candidate that splits the first lines into the same number
(at least two) of fields most consistently (``\\t``, ``::``, ``,``, ``;``, ``|``, then
a space); quoted fields are read as the csv module reads them. The first line is
a header when none of its fields is a number and either a column below it is
mostly numbers or its values appear nowhere below; ``header`` says it instead.

>>> import tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "b.csv")
>>> _ = open(path, "wb").write(b'"276725";"034545104X";"0"\\r\\n"276726";"0155061224";"5"\\r\\n"27672\\xe9";"0446";"0"\\r\\n')
>>> s = read_sample(path, 100)
>>> s.delimiter, s.quoting, s.header, s.rows[1], s.undecodable
(';', True, False, ['276726', '0155061224', '5'], 1)
"""

from __future__ import annotations

import csv
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tierec.data.errors import DataError
from tierec.data.text import refuse_binary

CANDIDATES = ("\t", "::", ",", ";", "|", " ")
DELIMITER_NAMES = {"tab": "\t", "\\t": "\t", "comma": ",", "semicolon": ";", "pipe": "|", "space": " "}
_SNIFF_LINES = 200
_CONSISTENT = 0.9  # share of the first lines a delimiter must split into the same number of fields


@dataclass
class Sample:
    """The first rows of a text file and how it is written."""

    delimiter: str
    quoting: bool  # some fields are quoted
    header: bool
    names: list[str]  # the header's names, or c0, c1, ...
    rows: list[list[str]]  # data rows of the common width (the header excluded)
    more: bool  # the file has more lines than were read
    bad_width: int  # data rows with another number of fields (left out of ``rows``)
    trailing: bool  # lines end with the delimiter (the empty last field is dropped)
    encoding: str  # "utf-8", or the encoding asked for
    undecodable: int = 0  # lines that were not UTF-8 (read as latin-1)
    notes: list[str] = field(default_factory=list)


def delimiter_option(text: str) -> str:
    """``--delimiter`` as written: a character or several, or tab / comma / semicolon / pipe / space / ``\\t``."""
    return DELIMITER_NAMES.get(text.lower(), text)


def number(text: str) -> float | None:
    """The value of a field that is a finite number, else None."""
    try:
        x = float(text)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def read_sample(
    path: str | Path, max_rows: int, *, delimiter: str = "", header: bool | None = None, encoding: str = ""
) -> Sample:
    """The first ``max_rows`` data rows of a text file, and its dialect (see the module docstring)."""
    p = Path(path)
    refuse_binary(p, str(path))
    lines, more, undecodable = _lines(p, max_rows + 1, encoding)  # + 1: a header line is not a data row
    if not lines:
        raise DataError(f"{p}: the file is empty")
    delimiter = delimiter or _guess_delimiter(lines[:_SNIFF_LINES])
    quoting = delimiter != "\t" and any('"' in line for line in lines[:_SNIFF_LINES])
    rows = _split(lines, delimiter, quoting)
    ends = [line.endswith(delimiter) for line in lines[:_SNIFF_LINES] if line]
    trailing = len(delimiter) > 0 and sum(ends) >= _CONSISTENT * len(ends) and len(rows[0]) > 1
    if trailing:
        rows = [r[:-1] if r and r[-1] == "" else r for r in rows]
    width = Counter(len(r) for r in rows[1 : _SNIFF_LINES + 1] or rows).most_common(1)[0][0]
    has_header = looks_like_header(rows) if header is None else header
    names = rows[0] if has_header else [f"c{j}" for j in range(width)]
    if has_header and len(names) != width:
        names = (names + [f"c{j}" for j in range(len(names), width)])[:width]
    data = rows[1:] if has_header else rows
    good = [r for r in data if len(r) == width]
    more = more or len(good) > max_rows
    sample = Sample(delimiter, quoting, has_header, names, good[:max_rows], more, len(data) - len(good), trailing,
                    encoding or "utf-8", undecodable)
    if undecodable and not encoding:
        sample.notes.append(
            f"{undecodable:,} of the first {len(lines):,} lines are not UTF-8 (read here as latin-1); training skips such rows,"
            " so convert the file first (iconv -f latin1 -t utf-8)"
        )
    return sample


def _lines(p: Path, limit: int, encoding: str) -> tuple[list[str], bool, int]:
    """Up to ``limit`` non-empty lines without their line ends, whether more follow, and how many were not UTF-8."""
    out: list[str] = []
    bad = 0
    with p.open("rb") as f:
        for i, raw in enumerate(f):
            if i == 0:
                raw = raw.removeprefix(b"\xef\xbb\xbf")
            raw = raw.rstrip(b"\r\n")
            if not raw.strip():
                continue
            if len(out) >= limit:
                return out, True, bad
            if encoding:
                out.append(raw.decode(encoding, errors="replace"))
                continue
            try:
                out.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                bad += 1
                out.append(raw.decode("latin-1"))
    return out, False, bad


def _split(lines: list[str], delimiter: str, quoting: bool) -> list[list[str]]:
    if len(delimiter) > 1:
        return [[v.strip('"') if quoting else v for v in line.split(delimiter)] for line in lines]
    if not quoting:
        return [line.split(delimiter) for line in lines]
    out = []
    for line in lines:  # one line, one row, as the reader reads them
        try:
            out.append(next(csv.reader([line], delimiter=delimiter, quotechar='"'), [""]))
        except csv.Error:  # a stray carriage return or NUL: the fields as they stand
            out.append(line.split(delimiter))
    return out


def _guess_delimiter(lines: list[str]) -> str:
    """The candidate splitting the most lines into the same number (>= 2) of fields; ties: more fields, then order."""
    quoting = any('"' in line for line in lines)
    scored = []
    for k, d in enumerate(CANDIDATES):
        width, count = Counter(len(r) for r in _split(lines, d, quoting and d != "\t")).most_common(1)[0]
        if width >= 2 and count >= _CONSISTENT * len(lines):
            scored.append((d != " ", count, width, -k, d))  # a space only when nothing else splits the lines
    return max(scored)[-1] if scored else ","


def looks_like_header(rows: list[list[str]]) -> bool:
    """No field of the first row is a number, and a column below it is mostly numbers or its values appear nowhere below."""
    first, rest = rows[0], rows[1:101]
    if any(number(v) is not None for v in first) or not any(v for v in first):
        return False
    if not rest:
        return True
    for j, v in enumerate(first):
        below = [r[j] for r in rest if len(r) > j]
        if v and below and sum(number(x) is not None for x in below) > len(below) / 2:
            return True
    return all(v == "" or v not in {r[j] for r in rest if len(r) > j} for j, v in enumerate(first)) and len(set(first)) == len(first)
