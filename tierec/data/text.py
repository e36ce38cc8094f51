"""Streaming reader for delimited text: Criteo TSV, CSV and TSV with a schema.

Files are never loaded whole. One pass counts lines (:class:`LineIndex`, numpy
over a memory map, so a split can start at any line); then ``pyarrow.csv``
streams the split's byte range as string columns, and :class:`BlockParser`
turns them into ids and floats with numba. A row is one physical line (values
may not contain newlines), so problems are reported by 1-based file line.

>>> import tempfile, os
>>> from tierec.data.schema import criteo_schema
>>> from tierec.data.errors import ProblemReport
>>> path = os.path.join(tempfile.mkdtemp(), "tiny.txt")
>>> row = "\\t".join(["1"] + ["2"] * 13 + ["a1"] * 26)
>>> _ = open(path, "w").write(row + "\\n" + row + "\\n")
>>> f = TextFile.open(path, criteo_schema())
>>> f.data_lines, sum(b.size for b in f.blocks(0, 2, ProblemReport(path), strict=False))
(2, 2)
"""

from __future__ import annotations

import io
import re
import sys
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from tierec.data.blocks import RowBlock
from tierec.data.columns import BlockParser
from tierec.data.errors import DataError, ProblemReport, strict_error
from tierec.data.loader import prefetch
from tierec.data.schema import Schema, require_unique_columns
from tierec.paths import quote

_SCAN_CHUNK = 1 << 26  # bytes per newline-counting step
BLOCK_BYTES = 1 << 20  # pyarrow CSV block; 1 MiB streams fastest single-threaded


@dataclass(frozen=True)
class LineIndex:
    """Newline counts of a file, enough to find where any line starts."""

    size: int  # bytes
    n_lines: int  # physical lines; a last line without a newline counts
    cum_newlines: np.ndarray  # [n_chunks] newlines up to the end of each scan chunk

    @staticmethod
    def scan(path: Path) -> LineIndex:
        size = path.stat().st_size
        if size == 0:
            return LineIndex(0, 0, np.zeros(0, np.int64))
        mm = np.memmap(path, dtype=np.uint8, mode="r")
        counts = [int(np.count_nonzero(mm[a : a + _SCAN_CHUNK] == 10)) for a in range(0, size, _SCAN_CHUNK)]
        cum = np.cumsum(np.asarray(counts, np.int64))
        n_lines = int(cum[-1]) + (0 if mm[size - 1] == 10 else 1)
        del mm
        return LineIndex(size, n_lines, cum)

    def offset_of(self, path: Path, line0: int) -> int:
        """Byte offset where 0-based physical line ``line0`` starts (``size`` past the end)."""
        if line0 <= 0:
            return 0
        if line0 >= self.n_lines:
            return self.size
        c = int(np.searchsorted(self.cum_newlines, line0))  # chunk holding newline number line0
        before = int(self.cum_newlines[c - 1]) if c else 0
        start = c * _SCAN_CHUNK
        mm = np.memmap(path, dtype=np.uint8, mode="r")
        pos = np.flatnonzero(mm[start : start + _SCAN_CHUNK] == 10)[line0 - before - 1]
        return start + int(pos) + 1

    def first_longer(self, path: Path, line0: int, end: int, limit: int) -> int | None:
        """0-based number of the first line from ``line0`` (before byte ``end``) longer than ``limit`` bytes."""
        assert limit <= _SCAN_CHUNK  # a chunk without a newline then holds part of such a line
        mm = np.memmap(path, dtype=np.uint8, mode="r")
        pos, line = self.offset_of(path, line0), line0  # pos: where line ``line`` starts
        while pos < end:
            stop = min(pos + _SCAN_CHUNK, end)
            newlines = pos + np.flatnonzero(mm[pos:stop] == 10)
            if newlines.size == 0:
                return line if stop - pos > limit else None  # (stop < pos + chunk: the file's last line)
            starts = np.concatenate([[pos], newlines[:-1] + 1])
            long = np.flatnonzero(newlines + 1 - starts > limit)
            if long.size:
                return line + int(long[0])
            line += newlines.size
            pos = int(newlines[-1]) + 1
        return None


@dataclass(frozen=True)
class TextFile:
    """An opened, validated delimited file: its columns and line count."""

    path: Path
    display: str  # the path as the user wrote it, for messages
    schema: Schema
    names: tuple[str, ...]  # all columns, in file order
    index: LineIndex

    @property
    def data_lines(self) -> int:
        return self.index.n_lines - (1 if self.schema.header else 0)

    @property
    def num_rows(self) -> int:
        """Data lines: an upper bound of the rows when some are malformed."""
        return self.data_lines

    def new_report(self) -> ProblemReport:
        return ProblemReport(self.display, "line")

    def column(self, name: str) -> Iterator[tuple[np.ndarray, pa.Array]]:
        """One column as bytes with the 0-based data row of each value (rows of the wrong width left out)."""
        head = 1 if self.schema.header else 0
        tracker = _LineTracker(first_line=head + 1)

        def on_invalid(row: pacsv.InvalidRow) -> str:
            tracker.invalid.append((-1 if row.number is None else row.number + head, ""))
            return "skip"

        begin = self.index.offset_of(self.path, head)
        for batch in pacsv.open_csv(
            _byte_range(self.path, begin, self.index.size, self.schema.delimiter),
            read_options=pacsv.ReadOptions(use_threads=False, block_size=BLOCK_BYTES, column_names=list(self.names)),
            parse_options=self._parse_options(on_invalid),
            convert_options=pacsv.ConvertOptions(include_columns=[name], column_types={name: pa.binary()}),
        ):
            lines, _ = tracker.advance(batch.num_rows)
            yield lines - (head + 1), batch.column(0)

    def _parse_options(self, on_invalid: Callable[[pacsv.InvalidRow], str]) -> pacsv.ParseOptions:
        s = self.schema
        return pacsv.ParseOptions(
            delimiter=s.delimiter if len(s.delimiter) == 1 else _STAND_IN.decode(),
            quote_char='"' if s.quoting else False,
            ignore_empty_lines=False,
            invalid_row_handler=on_invalid,
        )

    @staticmethod
    def open(path: str | Path, schema: Schema, label_optional: bool = False) -> TextFile:
        """Open and validate; with ``label_optional`` a file without the label column is read unlabeled."""
        p = Path(path)
        display = str(path)
        if not p.exists():
            raise DataError(f"{display}: no such file")
        if not p.is_file():
            raise DataError(f"{display}: not a file")
        index = LineIndex.scan(p)
        if index.size == 0:
            raise DataError(f"{display}: file is empty")
        refuse_binary(p, display)
        if schema.header:
            with p.open("rb") as fh:
                names = _header_names(fh.readline(), schema, display)
            require_unique_columns(names, display, "its header")
            if index.n_lines <= 1:
                raise DataError(f"{display}: file has a header but no data rows")
            if label_optional and schema.label not in names:
                schema = schema.without_label()
        else:
            names = schema.columns
            require_unique_columns(names, display, "data.schema.columns")
            with p.open("rb") as fh:
                first = _header_names(fh.readline(), schema, display)
            trailing = len(first) > 1 and first[-1] == ""  # "a,b,c," : a separator after the last field
            fields = len(first) - trailing
            if label_optional and schema.label in names and fields == len(names) - 1:  # one field fewer: no label
                schema = schema.without_label()
                names = schema.columns
            if trailing and fields == len(names):
                names = (*names, "")  # the empty field after the trailing separator, never read
        absent = [c for c in schema.needed if c not in names]
        if absent:
            raise DataError(f"{display}: schema names column(s) {absent} that the file does not have; it has {list(names)}")
        return TextFile(p, display, schema, tuple(names), index)

    def blocks(self, first: int, stop: int, report: ProblemReport, strict: bool, block_bytes: int = BLOCK_BYTES) -> Iterator[RowBlock]:
        """Well-formed rows of data lines ``first..stop-1`` (0-based, header excluded).

        pyarrow stops at a row it cannot even decode (bad UTF-8 with the wrong
        field count) and at a line longer than its block (``block_bytes``); such
        a row is counted like any malformed row, and reading goes on after it.
        """
        head = 1 if self.schema.header else 0
        _quiet_undecodable_rows()
        while first < stop:
            try:
                yield from self._segment(first, stop, report, strict, block_bytes)
                return
            except _UnreadableRow as u:
                resume = u.resume_line - head - 1  # 0-based data lines
                bad = min(max(u.line - head - 1, resume), stop - 1)  # (after rows joined by a quote, only roughly)
                yield from self.blocks(resume, bad, report, strict, block_bytes)  # its block's rows before it
                _report([(u.line, u.why)], report, strict, self.display, BlockParser(self.schema), None)
                first = bad + 1

    def _segment(self, first: int, stop: int, report: ProblemReport, strict: bool, block_bytes: int) -> Iterator[RowBlock]:
        if stop <= first:
            return
        head = 1 if self.schema.header else 0
        begin = self.index.offset_of(self.path, first + head)
        end = self.index.offset_of(self.path, stop + head)
        tracker = _LineTracker(first_line=first + head + 1)  # file lines are 1-based
        expected = len(self.names)
        s = self.schema

        def on_invalid(row: pacsv.InvalidRow) -> str:
            number = -1 if row.number is None else row.number + first + head
            tracker.invalid.append((number, f"expected {expected} {s.delimiter_name}-separated fields, found {row.actual_columns}"))
            return "skip"

        def record_batches() -> Iterator[pa.RecordBatch]:  # runs in a prefetch thread
            with _byte_range(self.path, begin, end, s.delimiter) as stream:
                yield from pacsv.open_csv(
                    stream,
                    read_options=pacsv.ReadOptions(use_threads=False, block_size=block_bytes, column_names=list(self.names)),
                    parse_options=self._parse_options(on_invalid),
                    convert_options=pacsv.ConvertOptions(
                        include_columns=list(s.needed),
                        column_types={c: pa.binary() for c in s.needed},  # bytes: a non-UTF-8 value costs its row only
                        strings_can_be_null=False,
                        quoted_strings_can_be_null=False,
                    ),
                )

        parser = BlockParser(s)
        batches = prefetch(record_batches, depth=2, name="tierec-csv")
        try:
            for batch in batches:
                block, err = parser.parse(batch)
                bad_rows = np.flatnonzero(err > 0)  # (err < 0: filtered out, not malformed)
                lines, invalid = tracker.advance(batch.num_rows)  # [m] file line of every accepted row
                bad: list[Problem] = [(int(lines[r]), (batch, int(r))) for r in bad_rows]
                problems: list[Problem] = sorted([*invalid, *bad], key=lambda x: x[0])
                _report(problems, report, strict, self.display, parser, err)
                report.count_rows(batch.num_rows + len(invalid))
                block = block.with_rows(lines - (head + 1))  # 0-based data rows
                yield block.select(err == 0) if err.any() else block
        except pa.ArrowInvalid as e:
            m = _STOPPED_AT.search(str(e))
            if m:
                raise _UnreadableRow(first + head + int(m.group(1)), tracker.next_line,
                                     f"not valid UTF-8 text, and not {expected} fields") from None
            long = self.index.first_longer(self.path, tracker.next_line - 1, end, block_bytes) if _STRADDLES in str(e) else None
            if long is not None:  # a line longer than pyarrow's block: that line is the malformed row
                length = self.index.offset_of(self.path, long + 1) - self.index.offset_of(self.path, long)
                raise _UnreadableRow(long + 1, tracker.next_line,
                                     f"a line of {length:,} bytes, longer than the reader's block of {block_bytes:,} bytes") from None
            raise DataError(f"{self.display}: {quote(str(e).splitlines()[0], 160)}") from None
        finally:
            batches.close()
        trailing = list(tracker.invalid)
        _report(trailing, report, strict, self.display, parser, None)  # rejected lines after the last row
        joined = (stop + head + 1) - tracker.next_line - len(trailing)  # lines pyarrow read as part of other rows
        if joined > 0:
            message = f"{joined} line(s) joined into other rows (an unbalanced quote?); they were not read"
            if strict:
                raise strict_error(self.display, "line", tracker.next_line, message)
            report.add(tracker.next_line, message)
            report.count_more(joined - 1)


_STAND_IN = b"\x1f"  # ASCII unit separator: what a delimiter of several characters becomes for pyarrow


def _byte_range(path: Path, begin: int, end: int, delimiter: str) -> Any:
    """Bytes ``begin..end`` of a file as a stream for pyarrow: a zero-copy view, or with a delimiter of
    several characters (MovieLens' ``::``) replaced by one byte, line by line, as pyarrow reads it."""
    if len(delimiter) <= 1:
        mm = pa.memory_map(str(path))
        mm.seek(begin)
        return pa.BufferReader(mm.read_buffer(end - begin))  # zero-copy view of the split
    return io.BufferedReader(_Replaced(path, begin, end, delimiter.encode("utf-8")), buffer_size=BLOCK_BYTES)


class _Replaced(io.RawIOBase):
    """A byte range of a file with ``old`` replaced by :data:`_STAND_IN`, cut at newlines (which no delimiter holds)."""

    def __init__(self, path: Path, begin: int, end: int, old: bytes) -> None:
        super().__init__()
        self._file = path.open("rb")
        self._file.seek(begin)
        self._left, self._old = end - begin, old
        self._out, self._tail = b"", b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._out and (self._left or self._tail):
            chunk = self._file.read(min(BLOCK_BYTES, self._left))
            self._left -= len(chunk)
            data = self._tail + chunk
            cut = data.rfind(b"\n") + 1 if self._left else len(data)
            self._out, self._tail = data[:cut].replace(self._old, _STAND_IN), data[cut:]
        n = min(len(b), len(self._out))
        b[:n] = self._out[:n]
        self._out = self._out[n:]
        return n

    def close(self) -> None:
        self._file.close()
        super().close()


_MAGIC = {b"\x1f\x8b": "gzip-compressed", b"BZh": "bzip2-compressed", b"\xfd7zXZ\x00": "xz-compressed",
          b"\x28\xb5\x2f\xfd": "zstd-compressed", b"PK\x03\x04": "a zip archive", b"PAR1": "a Parquet file"}


def refuse_binary(p: Path, display: str) -> None:
    """A one-line error for a file that is not text at all (compressed, an archive, random bytes)."""
    with p.open("rb") as fh:
        head = fh.read(1 << 16)
    for magic, what in _MAGIC.items():
        if head.startswith(magic):
            raise DataError(f"{display}: is {what}, not delimited text; decompress or convert it first")
    nul = head.find(b"\x00")
    if nul >= 0:
        raise DataError(f"{display}: is not a text file (a NUL byte at offset {nul})")
    undecodable = len(head) - len(head.decode("utf-8", errors="ignore").encode("utf-8"))
    if undecodable > max(64, len(head) // 20):
        raise DataError(f"{display}: is not a text file ({undecodable} of its first {len(head)} bytes are not UTF-8)")


_STOPPED_AT = re.compile(r"^CSV parse error: Row #(\d+): Expected \d+ columns")
_STRADDLES = "straddling object straddles two block boundaries"  # pyarrow: a row longer than its block


def _drop_undecodable_row_noise(hook: Callable[[Any], None]) -> Callable[[Any], None]:
    def hook_(unraisable: Any) -> None:
        where = getattr(unraisable.object, "__qualname__", "")
        if isinstance(unraisable.exc_value, UnicodeDecodeError) and where.startswith("TextFile._segment"):
            return  # pyarrow could not decode a rejected row for our handler; the row is reported as malformed
        hook(unraisable)

    hook_.tierec_filter = True  # type: ignore[attr-defined]
    return hook_


def _quiet_undecodable_rows() -> None:
    """Keep pyarrow's "Exception ignored" traceback for an undecodable row off the user's terminal."""
    if not getattr(sys.unraisablehook, "tierec_filter", False):
        sys.unraisablehook = _drop_undecodable_row_noise(sys.unraisablehook)


class _UnreadableRow(Exception):
    """pyarrow stopped at a row it could not read (bad UTF-8 and the wrong field count, a line longer than its block)."""

    def __init__(self, line: int, resume_line: int, why: str) -> None:
        super().__init__(why)
        self.line = line  # 1-based file line of the row
        self.resume_line = resume_line  # 1-based file line of the first row not yet handed out
        self.why = why  # the malformed row's problem


def _header_names(line: bytes, schema: Schema, display: str) -> list[str]:
    line = line.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark is not part of the first name
    if len(schema.delimiter) > 1:
        line = line.replace(schema.delimiter.encode("utf-8"), _STAND_IN)
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        raise DataError(f"{display}: the header line is not UTF-8 text: {quote(line)}") from None
    try:
        table = pacsv.read_csv(
            io.BytesIO(line),
            parse_options=pacsv.ParseOptions(
                delimiter=schema.delimiter if len(schema.delimiter) == 1 else _STAND_IN.decode(), quote_char='"' if schema.quoting else False
            ),
        )
    except pa.ArrowInvalid as e:
        raise DataError(f"{display}: cannot read the header line: {e}") from None
    return list(table.column_names)


Problem = tuple[int, "str | tuple[pa.RecordBatch, int]"]  # (file line, message or (batch, row) to describe)


def _report(
    problems: list[Problem], report: ProblemReport, strict: bool, display: str, parser: BlockParser, err: np.ndarray | None
) -> None:
    """Record problems in line order: ``(line, message)`` or ``(line, (batch, row))``."""
    for line, what in problems:
        column = "" if isinstance(what, str) else parser.codes[int(err[what[1]]) - 1]  # type: ignore[index]
        fatal = not isinstance(what, str) and parser.is_fatal(what[0], what[1], int(err[what[1]]))  # type: ignore[index]
        if not (report.wants_examples or strict or fatal):
            report.count_more(1, column)
            continue
        message = what if isinstance(what, str) else parser.problem(what[0], what[1], int(err[what[1]]))  # type: ignore[index]
        if strict or fatal:
            raise strict_error(display, "line", line, message)
        report.add(line, message, column)


class _LineTracker:
    """Maps accepted rows back to file lines, given the lines pyarrow rejected."""

    def __init__(self, first_line: int) -> None:
        self.next_line = first_line
        self.invalid: deque[tuple[int, str]] = deque()  # (line, message), in file order

    def advance(self, m: int) -> tuple[np.ndarray, list[tuple[int, str]]]:
        """Consume a batch of ``m`` accepted rows: their file lines [m] and the rejected lines among them."""
        end = self.next_line + m - 1
        popped: list[tuple[int, str]] = []
        while self.invalid and self.invalid[0][0] <= end:
            popped.append(self.invalid.popleft())
            end += 1
        lines = np.arange(self.next_line, end + 1, dtype=np.int64)
        if popped:
            lines = lines[~np.isin(lines, np.array([line for line, _ in popped], np.int64))]
        self.next_line = end + 1
        return lines, popped
