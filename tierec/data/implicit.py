"""Implicit feedback in a :class:`~tierec.data.source.Dataset`: which splits get negatives, and their passes.

:class:`ImplicitFeedback` belongs to one opened dataset with ``data.negatives > 0``.
It checks the file (no label column unless ``data.negatives_keep_label``; the user,
item and item-feature columns single-valued categorical columns of the schema),
makes one streaming pass over the training split the first time any split is read
(:class:`~tierec.data.interactions.Interactions`), and one over the validation or
test split the first time that split is read (its own pairs, excluded from its
negatives too), then wraps each split's rows in
:class:`~tierec.data.negatives.NegativeRows`. The ``all`` split (a file read whole,
for scoring) gets none.

>>> import tempfile, os
>>> from tierec.config import DataConfig, SchemaConfig
>>> from tierec.data.source import open_dataset
>>> path = os.path.join(tempfile.mkdtemp(), "plays.csv")
>>> _ = open(path, "w").write("user,item\\n" + "".join(f"u{i % 7},i{i % 20}\\n" for i in range(40)))
>>> cfg = DataConfig(source=path, schema=SchemaConfig(categorical=["user", "item"]), test_rows=10,
...                  negatives=2, user_column="user", item_column="item")
>>> data = open_dataset(cfg)
>>> src = data.source("test", 64)
>>> src.num_rows, [(b.size, int(b.labels.sum())) for b in src]
(30, [(30, 10)])
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

from tierec.config import DataConfig
from tierec.data.errors import DataError
from tierec.data.interactions import ColumnRoles, Interactions
from tierec.data.negatives import NegativeRows, NegativeSampler, NegativeSpec, negative_salt
from tierec.data.reader import Reader
from tierec.data.schema import Schema
from tierec.data.splits import Rows, SourceMeta

_SCAN_ROWS = 65536  # rows per block of a scan (a size hint)


def column_roles(cfg: DataConfig, schema: Schema, labeled: bool) -> ColumnRoles:
    """Where ``data.user_column``, ``data.item_column`` and ``data.item_features`` are among the features."""
    single = [c for c in schema.categorical if c not in schema.multi_valued]

    def index(key: str, name: str) -> int:
        if name not in single:
            raise DataError(f"{key} {name!r} must be a single-valued categorical column of the schema: {single}")
        return schema.categorical.index(name)

    attributes = tuple(index("data.item_features", c) for c in cfg.item_features)
    return ColumnRoles(index("data.user_column", cfg.user_column), index("data.item_column", cfg.item_column), attributes, labeled)


def check_label(cfg: DataConfig, reader: Reader) -> None:
    """A file with its label column and ``data.negatives``: refused unless ``data.negatives_keep_label``."""
    if reader.schema.labeled and not cfg.negatives_keep_label:
        raise DataError(
            f"{reader.display}: data.negatives = {cfg.negatives} makes the labels, but the file has its label column "
            f"{reader.schema.label!r}; set data.negatives = 0 to train on its labels, or data.negatives_keep_label = true "
            "to keep them and add negatives to its positive rows"
        )


class ImplicitFeedback:
    """The negatives of one dataset's splits (see the module docstring)."""

    def __init__(self, cfg: DataConfig, schema: Schema) -> None:
        self.cfg = cfg
        self.spec = NegativeSpec(cfg.negatives, cfg.negative_sampling == "popularity", column_roles(cfg, schema, schema.labeled))
        self._seen: dict[str, Interactions] = {}  # split -> its pass
        self._lock = threading.Lock()  # passes run in loader threads; evaluation may start one beside training

    def rows(self, split: str, rows: Rows, meta: SourceMeta, epoch: int, train_rows: Callable[[], Rows]) -> tuple[Rows, SourceMeta]:
        """``split``'s rows with negatives (``train_rows()``: the training split's rows, asked for its pass)."""
        k = self.cfg.negatives
        if self.spec.roles.keep_label:  # positives are known only by reading: the split's pass counts them
            positives = self.seen(split, lambda: rows).positives
        else:
            positives = meta.num_rows  # every row (text: lines, an upper bound like the split's own count)
        num_rows = None if meta.num_rows is None or positives is None else meta.num_rows + k * positives
        salt = negative_salt(self.cfg.negative_seed, split, epoch)

        def sampler() -> NegativeSampler:
            train = self.seen("train", train_rows)
            held = None if split == "train" else self.seen(split, lambda: rows)
            return NegativeSampler(self.spec, train, held, salt)

        return NegativeRows(rows, sampler), dataclasses.replace(meta, num_rows=num_rows, labeled=True)

    def seen(self, split: str, rows: Callable[[], Rows]) -> Interactions:
        """The pass over ``split``'s ``rows()`` (made on first use)."""
        with self._lock:
            if split not in self._seen:
                split_rows = rows()
                report = split_rows.new_report()  # malformed rows: counted here, reported by the split's own passes
                self._seen[split] = Interactions.scan(split_rows.blocks(0, _SCAN_ROWS, report), self.spec.roles)
            return self._seen[split]
