"""An export's ``manifest.json``: what a scorer needs besides the files it names.

The manifest says which tierec wrote the export and from which training step;
how a row of raw values becomes model input exactly as in training (the
:class:`InputSchema`: columns, id scheme, dense transform, whether values come
as the file's text or typed as Parquet had them); the features in the model's
order with the table and pooling of each; and each table's file, dim, layout
(whole rows, or pruned rows at their own dims) and precision.

>>> m = ExportManifest(tierec_version="0.1.0", step=7, model="dlrm", dense_precision="fp32", precision="fp32",
...     program="model.pt2", uses_wide=False,
...     schema=InputSchema(dense=("I1",), categorical=("C1",), multi_valued=(), separator="|",
...                        dense_transform="log1p", encoding="hex", values="text", label="label"),
...     features=(FeatureEntry(name="C1", table="C1", wide_table=None, mean=False),),
...     tables=(TableEntry(name="C1", file="tables/C1.safetensors", dim=4, layout="whole", rows=3),))
>>> ExportManifest.from_json(m.to_json()) == m
True
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

FORMAT_NAME = "tierec-export"
FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
PROGRAM_FILE = "model.pt2"
TABLES_DIR = "tables"
PRECISIONS = ("fp32", "fp16", "int8")
LAYOUTS = ("whole", "ragged")  # whole: [n, dim] rows; ragged: each row at its own dim (pruned tables)


class ExportError(ValueError):
    """A missing, damaged or foreign export, or an export that cannot be written; one line."""


@dataclass(frozen=True, kw_only=True)
class InputSchema:
    """How raw values become ids and dense features, as the training reader did (tierec/data/columns.py).

    ``values``: ``"text"`` when training read a text file (CSV, TSV, Criteo), so every value is
    taken as the text the file would hold; ``"typed"`` when it read Parquet or synthetic data,
    so numbers and strings keep their types (Parquet's hashing rules).
    """

    dense: tuple[str, ...]
    categorical: tuple[str, ...]
    multi_valued: tuple[str, ...]
    separator: str
    dense_transform: str  # "none" | "log1p"
    encoding: str  # "hash" | "hex"
    values: str  # "text" | "typed"
    label: str  # the training file's label column; ignored when present in a row to score


@dataclass(frozen=True, kw_only=True)
class FeatureEntry:
    """One sparse feature in the model's order: its table, its first-order table, its pooling."""

    name: str
    table: str
    wide_table: str | None
    mean: bool  # mean pooling (else sum)


@dataclass(frozen=True, kw_only=True)
class TableEntry:
    name: str
    file: str  # relative to the export directory
    dim: int
    layout: str  # "whole" | "ragged"
    rows: int


@dataclass(frozen=True, kw_only=True)
class ExportManifest:
    tierec_version: str
    step: int  # the training step of the checkpoint exported
    model: str  # model.name
    dense_precision: str  # the run's train.precision: the dense program runs under the same autocast
    precision: str  # of the tables' rows: fp32 | fp16 | int8 (row-wise, uint8 with a scale and bias per row)
    program: str  # the torch.export program: (dense [B, n_dense], emb [B, F, D], wide [B, F]) -> logits [B]
    uses_wide: bool  # whether the program reads wide (first-order terms)
    schema: InputSchema
    features: tuple[FeatureEntry, ...]
    tables: tuple[TableEntry, ...]
    source_checkpoint: str = ""

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT_NAME, "format_version": FORMAT_VERSION, **asdict(self)}, indent=1)

    @staticmethod
    def from_json(text: str, where: str = MANIFEST_FILE) -> ExportManifest:
        try:
            d: Any = json.loads(text)
        except ValueError as e:
            raise ExportError(f"{where} is not valid JSON ({e})") from None
        if not isinstance(d, dict) or d.get("format") != FORMAT_NAME:
            raise ExportError(f"{where} is not a tierec export manifest")
        if d.get("format_version", 0) > FORMAT_VERSION:
            raise ExportError(f"{where} has export format {d['format_version']}; this tierec reads {FORMAT_VERSION}")
        try:
            return ExportManifest(
                **{k: v for k, v in d.items() if k not in ("format", "format_version", "schema", "features", "tables")},
                schema=InputSchema(**{k: tuple(v) if isinstance(v, list) else v for k, v in d["schema"].items()}),
                features=tuple(FeatureEntry(**f) for f in d["features"]),
                tables=tuple(TableEntry(**t) for t in d["tables"]),
            )
        except (KeyError, TypeError) as e:
            raise ExportError(f"{where} lacks or has an unknown field ({e})") from None

    def table(self, name: str) -> TableEntry:
        for t in self.tables:
            if t.name == name:
                return t
        raise ExportError(f"the manifest names table {name!r} for a feature but lists no such table")
