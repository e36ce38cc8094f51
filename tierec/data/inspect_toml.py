"""What ``tierec inspect`` prints (:func:`describe`) and writes (:func:`schema_toml`): every guess with its reason.

The TOML is a config file for ``tierec train --config``: ``[data]`` (the source,
its format, a split by time when a timestamp was seen) and ``[data.schema]``
(how the file is written, the label and its threshold, the features), with a
comment on each column saying why it has its role or was left out.

>>> import tempfile, os
>>> from tierec.data.inspect import inspect_file
>>> path = os.path.join(tempfile.mkdtemp(), "t.csv")
>>> _ = open(path, "w").write("user,price,tags,clicked\\nu1,2.5,a|b,1\\nu2,3,b,0\\nu1,,a|c,0\\n")
>>> print([line for line in schema_toml(inspect_file(path)).splitlines() if line.startswith("label")][0])
label = "clicked"  # 0/1 values, named like a label
"""

from __future__ import annotations

import json
from pathlib import Path

from tierec.data.inspect import ColumnReport, InspectReport
from tierec.data.inspect_implicit import NEGATIVES

_FORMAT_DELIMITERS = {"csv": ",", "tsv": "\t"}


def describe(report: InspectReport) -> str:
    """The table ``tierec inspect`` prints: one line per column, then the notes (why columns were left out)."""
    sample = f"first {report.rows:,} rows" + (" (more in the file)" if report.truncated else " (the whole file)")
    how = f"{'a header line' if report.header else 'no header line'}"
    if report.format in ("csv", "tsv"):
        how += f", delimiter {json.dumps(report.delimiter)}"
    lines = [f"{report.path}: {report.format}, {how}, {sample}", f"{'column':<16} {'role':<26} {'distinct':>9} {'missing':>9} {'malformed':>9}"]
    for c in report.columns:
        role = c.role + (f" (separator {c.separator!r})" if c.separator else "")
        if c.role == "label" and not c.binary:
            role += f" (>= {c.threshold:g})" if c.threshold else " (not 0/1: threshold)"
        if c.left_out:
            role = {"key": "row key", "constant": "constant", "timestamp": "timestamp: split", "count": "count"}[c.role] + " (left out)"
        lines.append(f"{c.name:<16} {role:<26} {c.distinct:>9,} {c.missing:>9,} {c.malformed:>9,}")
    if report.malformed_rows:
        lines.append(f"{report.malformed_rows:,} rows with a different number of fields than the first (skipped here, and in training)")
    lines += [f"note: {n}" for n in report.notes]
    if report.negatives is not None:
        n = report.negatives
        lines.append(f"note: no label column: every row is a use; {NEGATIVES} sampled negatives per row for user {n.user!r}"
                     f" and item {n.item!r} ({n.reason})")
    lines += [f"note: {c.name}: {c.reason}" + (f"; {c.threshold_reason}" if c.threshold_reason else "")
              for c in report.columns if c.left_out or c.role == "label"]
    return "\n".join(lines)


def _toml_list(names: list[str]) -> str:
    return "[" + ", ".join(json.dumps(n) for n in names) + "]"


def _split_lines(report: InspectReport) -> list[str]:
    times = report.column("timestamp")
    if times:
        return [
            f'split = "column"  # {times[0].name} holds Unix times: the latest rows are the test split (and validation just before)',
            f"split_column = {json.dumps(times[0].name)}",
        ]
    if report.grouped_by:
        return [
            f'split = "hash"  # the rows are sorted by {report.grouped_by}: a tail split would test on {report.grouped_by} values never trained on',
        ]
    return []


def _negative_lines(report: InspectReport) -> list[str]:
    n = report.negatives
    if n is None:
        return []
    out = [
        f"negatives = {NEGATIVES}  # no label column: every row is a use (label 1); each gets {NEGATIVES} rows with an item its user"
        " has not used in training (label 0), the rest of the row as it is",
        f"user_column = {json.dumps(n.user)}  # {n.reason}",
        f"item_column = {json.dumps(n.item)}",
        'negative_sampling = "uniform"  # over the items seen (test: in training and test); "popularity": as often as used (harder)',
    ]
    if n.item_features:
        out.append(f"item_features = {_toml_list(list(n.item_features))}  # one value per item in the sample: a negative takes"
                   " its own item's")
    return out


def _label_lines(report: InspectReport) -> list[str]:
    labels = report.column("label")
    if report.negatives is not None and not labels:
        return ["# no label: data.negatives makes the labels (the file has no column named by label)"]
    if not labels:
        return ['label = "label"  # no 0/1, rating or count column found: name the label column']
    c = labels[0]
    out = [f"label = {json.dumps(c.name)}  # {c.reason}"]
    if not c.binary:
        out.append(f"label_threshold = {c.threshold:g}  # {c.threshold_reason}")
    return out


def _column_comments(report: InspectReport) -> list[str]:
    out = ["# columns, as read from the sample:"]
    for c in report.columns:
        what = "left out: " if c.left_out else ""
        also = "; one value per item: an item feature" if report.negatives and c.name in report.negatives.item_features else ""
        out.append(f"#   {c.name}: {c.role}, {what}{c.reason}{also}" + (f"; {c.threshold_reason}" if c.threshold_reason else ""))
    return out


def schema_toml(report: InspectReport) -> str:
    """A config file with ``[data]`` and ``[data.schema]`` for ``tierec train --config``: edit it, then train."""
    out = [
        f"# Written by `tierec inspect {report.path}` from its first {report.rows:,} rows: the roles are guesses; edit them.",
        "# Then: tierec train --config THIS_FILE --run-dir runs/NAME",
        *[f"# note: {n}" for n in report.notes],
        "",
        "[data]",
        f"source = {json.dumps(str(Path(report.path).resolve()))}",
        f"format = {json.dumps(report.format)}",
        *_split_lines(report),
        *_negative_lines(report),
        "",
        "[data.schema]",
    ]
    if report.format == "criteo":
        out.append('preset = "criteo"  # label, I1..I13 (log1p), C1..C26 (hex ids)')
        return "\n".join(out) + "\n"
    if report.format in ("csv", "tsv") and report.delimiter != _FORMAT_DELIMITERS[report.format]:
        out.append(f"delimiter = {json.dumps(report.delimiter)}")
    if report.format in ("csv", "tsv") and not report.header:
        out.append("header = false")
        out.append(f"columns = {_toml_list([c.name for c in report.columns])}  # no header line: named by position")
    out += _label_lines(report)
    numeric = report.column("numeric")
    out.append(f"dense = {_toml_list([c.name for c in numeric])}")
    if any(c.high > 100 for c in numeric):
        # a linear map of raw counts in the thousands saturates the first layers; log(1 + max(x, 0)) keeps their order
        top = max(c.high for c in numeric)
        out.append(f'dense_transform = "log1p"  # numbers up to {top:,.0f}; "none" keeps them as they are')
    out.append(f"categorical = {_toml_list([c.name for c in report.columns if c.role in ('categorical', 'multi-valued')])}")
    multi = report.column("multi-valued")
    if multi:
        out.append(f"multi_valued = {_toml_list([c.name for c in multi])}")
        seps = {c.separator for c in multi if c.separator}
        if seps:
            out.append(f"separator = {json.dumps(sorted(seps)[0])}" + ("  # columns use different separators" if len(seps) > 1 else ""))
    for c in report.column("key"):
        out.append(f"# score new data with `tierec predict ... --key {c.name}` ({c.name} is a row key)")
    out += _column_comments(report)
    return "\n".join(out) + "\n"
