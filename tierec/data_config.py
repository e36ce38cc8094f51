"""The ``[data]`` section of the configuration: where the rows come from, their schema, the split, and the
synthetic generator. :mod:`tierec.config` re-exports these classes with the rest of the configuration.

>>> DataConfig(source="train.csv", test_fraction=0.2).test_fraction
0.2
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tierec.errors import ConfigError


@dataclass(kw_only=True)
class SchemaConfig:
    """Which columns of a CSV/TSV/Parquet file are label, dense and categorical."""

    label: str = "label"  # the label column (0/1, or a number turned into 0/1 by label_threshold)
    # nan (the default: leave it unset) = labels must be 0 or 1 (or a probability in between); any other number,
    # 0 and negatives included, is a threshold: a numeric label >= it is a click (1), below it 0, e.g. 4 for ratings
    # 1-5, 0 for ratings -10..10. A label that is not a number, or outside [0, 1] without a threshold, is an error.
    label_threshold: float = math.nan
    dense: list[str] = field(default_factory=list)  # numeric columns (missing values read as 0)
    categorical: list[str] = field(default_factory=list)  # id columns (any string or integer; hashed to 64-bit ids unless categorical_encoding says hex)
    multi_valued: list[str] = field(default_factory=list)  # categorical columns holding several values
    separator: str = "|"  # between values of a multi-valued column
    header: bool = True  # CSV/TSV: first line names the columns
    # Column names when the file has no header line (in file order).
    columns: list[str] = field(default_factory=list)
    # "criteo": label, I1..I13, C1..C26 with hex ids and log1p dense (then leave dense/categorical empty).
    preset: str = ""
    dense_transform: str = ""  # "none" | "log1p"; "" = log1p for the criteo preset, else none
    categorical_encoding: str = ""  # "hash" | "hex"; "" = hex for the criteo preset, else hash
    # CSV/TSV field delimiter, one character or several (MovieLens' "::"); "" = from the format ("," for csv, tab for tsv).
    delimiter: str = ""
    # keep only the rows where COLUMN OP NUMBER holds, e.g. "rating != 0" (0 = not rated); OP one of == != < <= > >=;
    # other rows are dropped before training and evaluation (not counted as malformed); "" = every row
    filter: str = ""

    def __post_init__(self) -> None:
        if not self.label:
            raise ConfigError("data.schema.label must name the label column (predict reads files without it by itself)")
        if self.preset not in {"", "criteo"}:
            raise ConfigError(f"data.schema.preset {self.preset!r} is not one of '', 'criteo'")
        if self.preset and (self.dense or self.categorical):
            raise ConfigError("data.schema.preset sets the dense and categorical columns; leave data.schema.dense/categorical empty")
        if self.dense_transform not in {"", "none", "log1p"}:
            raise ConfigError(f"data.schema.dense_transform {self.dense_transform!r} is not one of none, log1p")
        if self.categorical_encoding not in {"", "hash", "hex"}:
            raise ConfigError(f"data.schema.categorical_encoding {self.categorical_encoding!r} is not one of hash, hex")
        if any(ch in self.delimiter for ch in '\r\n"\x1f'):
            raise ConfigError(f"data.schema.delimiter must not hold a line end, a quote or \\x1f, got {self.delimiter!r}")
        if not self.separator:
            raise ConfigError("data.schema.separator must not be empty")
        missing = [c for c in self.multi_valued if c not in self.categorical]
        if missing and not self.preset:  # a preset's columns are checked when the schema is resolved
            raise ConfigError(f"data.schema.multi_valued names columns that are not categorical: {missing}")


@dataclass(kw_only=True)
class SyntheticConfig:
    """The built-in Criteo-shaped synthetic data set with a planted model."""

    train_rows: int = 1_000_000  # rows of the training stream
    test_rows: int = 100_000  # rows of the test stream (a stream of its own, never seen in training)
    validation_rows: int = 0  # see data.validation_rows
    seed: int = 0  # seed of the generator and of the planted model
    n_dense: int = 13  # dense columns (the rest are 26 categorical ones, as Criteo)
    # Criteo Kaggle cardinalities are multiplied by this (at least 2 ids per feature).
    cardinality_scale: float = 0.01
    # Power-law exponent of id popularity (0 = uniform). At 1.3 the hottest 1% of a large
    # feature's ids take about 90% of its accesses (see tierec/data/synthetic.py).
    zipf: float = 1.3
    ids_per_feature: int = 1  # > 1 for multi-hot bags
    positive_rate: float = 0.25  # mean click probability of the planted model

    def __post_init__(self) -> None:
        if self.train_rows <= 0 or self.test_rows <= 0:
            raise ConfigError("data.synthetic.train_rows and synthetic.test_rows must be positive")
        if not 0 < self.cardinality_scale <= 100:
            raise ConfigError("data.synthetic.cardinality_scale must be in (0, 100] (ids must fit in 32 bits)")
        if self.zipf < 0:
            raise ConfigError("data.synthetic.zipf must be >= 0")
        if self.n_dense < 0:
            raise ConfigError("data.synthetic.n_dense must be >= 0")
        if self.ids_per_feature < 1:
            raise ConfigError("data.synthetic.ids_per_feature must be >= 1")
        if not 0 < self.positive_rate < 1:
            raise ConfigError("data.synthetic.positive_rate must be in (0, 1)")


@dataclass(kw_only=True)
class DataConfig:
    # "synthetic", a file (.txt/.tsv/.csv/.parquet), a directory of shards from `tierec preprocess`, or (with
    # data.follow) a directory of such files that grows.
    source: str = "synthetic"
    # auto | synthetic | criteo | csv | tsv | parquet | shards
    format: str = "auto"
    schema: SchemaConfig = field(default_factory=SchemaConfig)
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    # Held-out split of a file: its last `test_rows` rows, or else its last `test_fraction`.
    test_rows: int = 0
    test_fraction: float = 0.1  # fraction of a file held out for test when test_rows = 0
    # Validation split (train.eval_every, early stopping, checkpoints/best): `validation_rows` rows, or else a
    # `validation_fraction` of the file, just before the test rows (tail) or by hash (synthetic data: a stream
    # of its own, data.synthetic.validation_rows). None by default; when train.eval_every asks for evaluations,
    # 10% of a file (synthetic: as many rows as its test split), written to the run's config.toml.
    validation_rows: int = 0
    validation_fraction: float = 0.0  # fraction of a file for validation when validation_rows = 0
    # "tail": test (and validation) are the last rows of the file; "hash": each row goes to train, validation or
    # test by a stable hash of `split_key` (a categorical column, e.g. "user", so a user's rows stay together) or,
    # with split_key = "", of its row number. Fractions come from the *_fraction keys (or *_rows / file rows).
    # "column": the rows with the largest values of `split_column` (e.g. a Unix timestamp) are test, the
    # validation rows just below them (equal values stay in one split; rows without a number train).
    split: str = "tail"
    split_key: str = ""  # with split = "hash": the categorical column whose value decides the split ("" = the row number)
    split_column: str = ""  # with split = "column": the column whose largest values are test (e.g. a timestamp)
    # Training order: chunks of `shuffle_chunk_rows` rows (file ranges, shard record batches) in a new order each
    # epoch, then a shuffle buffer of `shuffle_buffer` rows; seeded by train.seed, so a resumed run sees the same rows.
    shuffle: bool = True
    shuffle_buffer: int = 65536  # rows in the shuffle buffer
    shuffle_chunk_rows: int = 65536  # rows per chunk shuffled as a whole (file ranges, shard record batches)
    strict: bool = False  # malformed rows are errors instead of being skipped and counted
    # A separate test file (overrides the split).
    test_source: str = ""
    prefetch_batches: int = 4  # background loader queue depth
    # Dense features (after their transform) are scaled by the model's first layer with the mean and standard
    # deviation of the training split's first `dense_stats_rows` rows (0 = all); a constant column is dropped.
    # "shrink": (x - mean) / max(std, 1), centred and brought down to unit variance, never amplified (a column
    # already of order 1 keeps its spread); "standard": (x - mean) / std; "none": as they are. The statistics are
    # part of the model: checkpoints and exports.
    dense_scaling: str = "shrink"
    dense_stats_rows: int = 1_000_000  # rows read for the dense statistics (0 = the whole training split)
    # Implicit feedback (a log of uses, plays, purchases: every row a positive): K > 0 adds K rows per positive with
    # the same user and context and a sampled item the user has not used in training (labels 1 and 0; docs/data.md,
    # "Implicit feedback"). Test and validation negatives are the same in every run with the same negative_seed.
    negatives: int = 0
    user_column: str = ""  # with negatives: the schema's categorical column of the user
    item_column: str = ""  # with negatives: the schema's categorical column of the item (the one that is sampled)
    # with negatives: "uniform" over the items seen (in training; for evaluation, in training and that split), or "popularity": as often as they are used there
    negative_sampling: str = "uniform"
    negative_seed: int = 0  # with negatives: the seed of every sampled negative (not train.seed: the test set stays fixed)
    # with negatives: categorical columns that describe the item (a price class, a category): a negative row takes its
    # sampled item's value (the first seen in training) instead of the positive's
    item_features: list[str] = field(default_factory=list)
    # with negatives, a file that has its label column too: false refuses it (labels would mix with sampled ones);
    # true keeps its labels and samples negatives for its positive rows only
    negatives_keep_label: bool = False

    # Streaming (`tierec train --follow` sets it): `source` is a directory that grows; every file in it is trained
    # once, all its rows, in name order, as it arrives, until the run is stopped (SIGTERM) or train.max_steps.
    # Names starting with "." or ending in .tmp / .part are ignored (write there, then rename). Which files are
    # done is in every checkpoint, so --resume continues exactly. Evaluation: data.test_source only.
    follow: bool = False
    follow_poll_s: float = 2.0  # seconds between looks at the directory when no file is ready
    # a file is taken once it has not changed (its modification time) for this long; 0 = at once (files renamed in)
    follow_settle_s: float = 5.0

    def __post_init__(self) -> None:
        self._check_negatives()
        if not (math.isfinite(self.follow_poll_s) and self.follow_poll_s > 0):
            raise ConfigError(f"data.follow_poll_s must be a positive number of seconds, got {self.follow_poll_s}")
        if not (math.isfinite(self.follow_settle_s) and self.follow_settle_s >= 0):
            raise ConfigError(f"data.follow_settle_s must be >= 0 seconds, got {self.follow_settle_s}")
        if self.follow and (self.source == "synthetic" or self.format in {"synthetic", "shards"}):
            raise ConfigError("data.follow trains the new files of a directory: set data.source to that directory "
                              "(and data.format, if not auto, to criteo, csv, tsv or parquet)")  # fmt: skip
        if self.follow and self.negatives:
            raise ConfigError("data.follow with data.negatives: sampling needs every user's items from one pass over the "
                              "training data, which a growing directory does not have; set data.negatives = 0")  # fmt: skip
        if self.follow and (self.validation_rows or self.validation_fraction):
            raise ConfigError("data.follow trains every row of every file: it has no validation split; leave "
                              "data.validation_rows and data.validation_fraction at 0 (evaluate on data.test_source)")  # fmt: skip
        if self.dense_scaling not in {"shrink", "standard", "none"}:
            raise ConfigError(f"data.dense_scaling {self.dense_scaling!r} is not one of shrink, standard, none")
        if self.dense_stats_rows < 0:
            raise ConfigError("data.dense_stats_rows must be >= 0 (0 = the whole training split)")
        formats = {"auto", "synthetic", "criteo", "csv", "tsv", "parquet", "shards"}
        if self.format not in formats:
            raise ConfigError(f"data.format {self.format!r} is not one of {sorted(formats)}")
        if not 0 <= self.test_fraction < 1:
            raise ConfigError("data.test_fraction must be in [0, 1)")
        if self.test_rows < 0:
            raise ConfigError("data.test_rows must be >= 0")
        if self.validation_rows < 0 or not 0 <= self.validation_fraction < 1:
            raise ConfigError("data.validation_rows must be >= 0 and data.validation_fraction in [0, 1)")
        if self.test_fraction + self.validation_fraction >= 1:
            raise ConfigError("data.test_fraction + data.validation_fraction must be below 1")
        if self.split not in {"tail", "hash", "column"}:
            raise ConfigError(f"data.split {self.split!r} is not one of tail, hash, column")
        if self.split_key and self.split != "hash":
            raise ConfigError("data.split_key needs data.split = \"hash\"")
        if (self.split == "column") != bool(self.split_column):
            raise ConfigError("data.split_column names the column of data.split = \"column\" (set both, or neither)")
        if self.shuffle_buffer < 1 or self.shuffle_chunk_rows < 1:
            raise ConfigError("data.shuffle_buffer and data.shuffle_chunk_rows must be >= 1")
        if self.prefetch_batches < 1:
            raise ConfigError(f"data.prefetch_batches must be >= 1, got {self.prefetch_batches}")

    def _check_negatives(self) -> None:
        if self.negatives < 0:
            raise ConfigError(f"data.negatives must be >= 0 (0 = off), got {self.negatives}")
        if self.negative_seed < 0:
            raise ConfigError(f"data.negative_seed must be >= 0, got {self.negative_seed}")
        if self.negative_sampling not in {"uniform", "popularity"}:
            raise ConfigError(f"data.negative_sampling {self.negative_sampling!r} is not one of uniform, popularity")
        if not self.negatives:  # (the other keys stay: --set data.negatives=0 turns sampling off alone)
            return
        if not self.user_column or not self.item_column:
            key = "data.user_column" if not self.user_column else "data.item_column"
            raise ConfigError(f"data.negatives = {self.negatives} needs {key} (a categorical column of the schema)")
        if self.user_column == self.item_column:
            raise ConfigError(f"data.user_column and data.item_column are both {self.user_column!r}; name two columns")
        clash = [c for c in self.item_features if c in (self.user_column, self.item_column)]
        if clash:
            raise ConfigError(f"data.item_features names {clash[0]!r}, the user or item column itself; list other item columns")
