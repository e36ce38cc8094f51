"""Defaults chosen from the data's size: batch size, epochs, model size and optimizers for small files.

The shipped defaults (batch 2048, one epoch, embeddings dim 16 with row-wise
Adagrad lr 0.05 from init 1/sqrt(dim), dense Adam lr 0.005) are made for
millions of rows. On a file of thousands they collapse: batch 2048 leaves a
handful of steps per epoch, row-wise Adagrad's first step on a row has full size
whatever the gradient, so an id seen once carries one sample's noise, and a
model of dim 16 over 26 features overfits within its third pass (docs/models.md,
"Defaults by data size"). Before training, ``tierec train`` estimates the
training rows of a file (:func:`estimate_train_rows`: the file's size over the
mean length of its first lines, or Parquet's metadata, times 1 + ``data.negatives``; synthetic data and shard
directories keep the defaults at any size, so the synthetic benchmarks and
``make demo`` are what they were) and :func:`size_defaults` sets, for every one
of these keys the user did not give in a config file or ``--set``:

==================  ===========================  ======  =============================================
training rows       train.batch_size             epochs  other keys
==================  ===========================  ======  =============================================
< 20,000            rows / 30 down to a power    2       train.dense_lr 0.002; model.first_order "on"
                    of 2, within [32, 256]               (DLRM, DCN-v2) with first_order_lr_scale 5 (10
                                                         on id columns only), first_order_init "rates";
                                                         embedding.dim 8 (not with pruning); embedding
                                                         optimizer Adam lr 0.001 from init_scale 0.01
                                                         (lr 0.0001 on a schema of one id column)
20,000 - 65,535     rows / 100 down to a power   1       model.first_order "on" (DLRM, DCN-v2) with
                    of 2, at least 256                   first_order_lr_scale 5 (10 on id columns only), first_order_init
                                                         "rates"; embedding optimizer Adam lr 0.001 from init_scale 0.01
                                                         (lr 0.0001 on a schema of one id column)
65,536 - 204,799    the same                     1       first_order_lr_scale 5 (DLRM, DCN-v2 on id
                                                         columns only)
>= 204,800          2048 (the default)           1       the same
==================  ===========================  ======  =============================================

Logs with sampled negatives (``data.negatives > 0``) of 204,800 to 2,047,999
training rows (negatives counted) get two epochs and the row-wise Adagrad at lr
0.1 instead of one epoch at 0.05, and their first-order (per-id bias) tables start
from counted rates and learn at 5x that rate as below 20,000 rows (``model.first_order_lr_scale``; on Last.fm
DLRM 0.878 -> 0.892 and the other three models +0.009 to +0.011, on Frappe every
model within 0.0012 of before, seeds 0-2, 2026-11-27): measured on Frappe and Last.fm (about 260,000
and 250,000 rows, seed 0, DLRM and DeepFM), both raised test AUC on both logs
(Frappe 0.972 / 0.950 -> 0.986 / 0.979, Last.fm 0.866 / 0.877 -> 0.887 / 0.892;
on Last.fm more than two epochs alone, 0.873 / 0.889, or lr 0.1 alone, 0.880 /
0.881; on Frappe each alone was not measured); each epoch draws new training
negatives. Outside that
range nothing was measured and the table holds.

The per-id biases' rate from 20,000 rows on (since 2026-11-27) was measured on t30h, idsh, idst, syn50k,
syncat50k, ids3h, syn180k, critcat, ids2h, the Amazon head and the MovieLens part (seeds 0-2; figures in
docs/models.md, "Defaults by data size"): DLRM on t30h -0.0107 -> -0.0084 from logistic regression, on ids3h above
item popularity, on MovieLens 0.7635 -> 0.7705. 10x lost under row-wise Adagrad (ids3h) and with dense columns
(crit5k); DeepFM's and Wide&Deep's own first-order terms at 5x under row-wise Adagrad lost 0.024-0.026 (syn180k).

The values are written into the run's ``config.toml`` (so ``--resume``, ``eval``
and ``predict`` read them back, never choosing again) and printed.

>>> from tierec.config import load_config
>>> cfg, chosen = size_defaults(load_config(None, []), given=set(), train_rows=8_000)
>>> chosen  # doctest: +NORMALIZE_WHITESPACE
{'train.batch_size': 256, 'train.epochs': 2, 'train.dense_lr': 0.002, 'model.first_order': 'on',
 'model.first_order_lr_scale': 5.0, 'embedding.dim': 8, 'embedding.optimizer.kind': 'adam',
 'embedding.optimizer.lr': 0.001, 'embedding.init_scale': 0.01, 'model.first_order_init': 'rates'}
>>> size_defaults(load_config(None, []), given={"train.batch_size"}, train_rows=100_000)[1]
{}
>>> size_defaults(load_config(None, []), given=set(), train_rows=60_000)[1]  # doctest: +NORMALIZE_WHITESPACE
{'train.batch_size': 512, 'model.first_order': 'on', 'model.first_order_lr_scale': 5.0,
 'embedding.optimizer.kind': 'adam', 'embedding.optimizer.lr': 0.001, 'embedding.init_scale': 0.01,
 'model.first_order_init': 'rates'}
>>> size_defaults(load_config(None, []), given=set(), train_rows=100_000)[1]
{'train.batch_size': 512}
>>> size_defaults(load_config(None, []), given=set(), train_rows=5_000_000)[1]
{}
>>> ids = ["model.name=dlrm", 'data.source="ratings.csv"', 'data.schema.categorical=["user", "item"]']
>>> size_defaults(load_config(None, ids), given=set(), train_rows=5_000_000)[1]  # DLRM's added biases: 5x
{'model.first_order_lr_scale': 5.0}
>>> log = load_config(None, ["data.negatives=2", 'data.user_column="C1"', 'data.item_column="C2"'])
>>> one = load_config(None, ["model.name=dlrm", 'data.source="ratings.csv"', 'data.schema.categorical=["item"]'])
>>> size_defaults(one, given=set(), train_rows=30_000)[1]["embedding.optimizer.lr"]  # one id column: nothing to cross
0.0001
>>> size_defaults(log, given=set(), train_rows=250_000)[1], size_defaults(log, given=set(), train_rows=2_048_000)[1]  # doctest: +NORMALIZE_WHITESPACE
({'train.epochs': 2, 'embedding.optimizer.lr': 0.1, 'model.first_order_lr_scale': 5.0, 'model.first_order_init': 'rates'},
 {})
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tierec.config import Config, OptimizerKind, with_values
from tierec.models import model_class
from tierec.models.first_order import optional_first_order

SMALL_ROWS = 20_000  # below: most ids are seen once or twice; a smaller model, Adam from a small init, two epochs
LARGE_ROWS = 204_800  # from here on: the defaults (batch 2048 = 204,800 / 100)
ADAM_ROWS = 65_536  # below: Adam from a small init for the embeddings (measured better up to 54k rows, worse at 90k)
STEPS_PER_EPOCH = 100
MIN_BATCH = 256  # from 20,000 rows on
SMALL_DIM = 8  # below 20,000 rows: fewer values per id seen once or twice, and less to overfit
SMALL_DENSE_LR = 0.002
SMALL_FIRST_ORDER_LR_SCALE = 5.0  # the biases at 5x the embeddings' Adam lr (1x, 3x and 10x measured worse)
ID_ONLY_FIRST_ORDER_LR_SCALE = 10.0  # the same on id columns only, under Adam (10x beat 5x on critcat, ids2h, t30h, idsh)
IMPLICIT_MAX_ROWS = 2_048_000  # logs with sampled negatives from LARGE_ROWS to here: two epochs, Adagrad lr 0.1
IMPLICIT_EPOCHS = 2
IMPLICIT_LR = 0.1  # row-wise Adagrad (the default 0.05; 0.2 for one epoch measured between the two)
# and the first-order tables at SMALL_FIRST_ORDER_LR_SCALE times it (Last.fm, seeds 0-2: DLRM 0.8782 at 1x, 0.8858 at 3x,
# 0.8923 at 5x, 0.8955 at 10x; 5x kept, the value already used below SMALL_ROWS, not tuned further)
# Below ADAM_ROWS and on those logs, the first-order weights start from the training split's counted rates
# (tierec/train/first_order_rates.py): seeds 0-2, 2026-11-27, critcat DCN-v2 -0.0104 -> -0.0065 from logistic
# regression, every model on ids2h above item popularity, the Amazon head 0.638-0.641 -> 0.643-0.644, Last.fm DLRM
# +0.003; from 65,536 rows they lost: ids3h DLRM and DCN-v2 -0.003, the MovieLens part DeepFM, DCN-v2 and
# Wide&Deep -0.001 to -0.002 (docs/models.md)
RATES = {"model.first_order_init": "rates"}
# On a schema of one id column (no dense), what a model can learn is one score per id, and the counted rates it
# starts from are that score already; the embeddings then learn at a tenth of Adam's lr so that one epoch's noise
# does not undo it (the Amazon head, its item column only, seeds 0-2, 2026-11-28: DLRM 0.6446 -> 0.6478, DeepFM
# 0.6432 -> 0.6479, DCN-v2 0.6434 -> 0.6478, Wide&Deep 0.6432 -> 0.6479; the counted rates alone 0.6479)
ONE_ID_LR = 0.0001
_SAMPLE_BYTES = 1 << 16


def estimate_train_rows(cfg: Config) -> int | None:
    """About how many rows a file's training split has (None for synthetic data, shard directories, a missing file)."""
    data = cfg.data
    if data.source == "synthetic" or data.format == "synthetic":
        return None
    p = Path(data.source)
    if not p.is_file():
        return None
    if p.suffix.lower() in (".parquet", ".pq") or data.format == "parquet":
        import pyarrow.parquet as pq

        try:
            total = pq.ParquetFile(p).metadata.num_rows
        except Exception:  # noqa: BLE001 - unreadable: the reader names the problem later
            return None
    else:
        size = p.stat().st_size
        with p.open("rb") as f:
            head = f.read(_SAMPLE_BYTES)
        lines = head.count(b"\n")
        total = size // max(len(head) // max(lines, 1), 1) if lines else 1
    if not data.test_source:
        held = data.test_rows if data.test_rows else data.test_fraction * total
        held += data.validation_rows if data.validation_rows else data.validation_fraction * total
        total = max(int(total - held), 0)
    return total * (1 + data.negatives)  # sampled negatives are training rows too (at most K per row)


def _power_of_two_at_most(n: int) -> int:
    return 1 << max(n.bit_length() - 1, 0)


def _choices(rows: int, cfg: Config) -> dict[str, Any]:
    if rows >= LARGE_ROWS:
        implicit = cfg.data.negatives > 0 and rows < IMPLICIT_MAX_ROWS
        if not implicit:
            return _added_bias_rate(cfg)
        return {"train.epochs": IMPLICIT_EPOCHS, "embedding.optimizer.lr": IMPLICIT_LR,
                "model.first_order_lr_scale": SMALL_FIRST_ORDER_LR_SCALE, **RATES}
    adam = {"embedding.optimizer.kind": OptimizerKind.ADAM.value, "embedding.optimizer.lr": ONE_ID_LR if _one_id(cfg) else 0.001,
            "embedding.init_scale": 0.01}
    if rows >= SMALL_ROWS:
        batch = max(_power_of_two_at_most(rows // STEPS_PER_EPOCH), MIN_BATCH)
        if rows >= ADAM_ROWS:
            return {"train.batch_size": batch, **_added_bias_rate(cfg)}
        return {"train.batch_size": batch, **_biases(cfg), **adam, **RATES}
    # batch 256 from 7,680 rows on (30 steps per epoch), down to 32
    small = max(min(_power_of_two_at_most(rows // 30), MIN_BATCH), 32)
    out: dict[str, Any] = {"train.batch_size": small, "train.epochs": 2, "train.dense_lr": SMALL_DENSE_LR, **_biases(cfg)}
    if not cfg.prune.enabled:  # a pruned run chooses its rows' dims itself (and its chunk must divide them)
        out["embedding.dim"] = SMALL_DIM
    return {**out, **adam, **RATES}


def _id_only(cfg: Config) -> bool:
    """The schema, as written, has id columns and no dense one (``model.first_order = "auto"`` adds tables there)."""
    schema = cfg.data.schema
    return not schema.preset and not schema.dense and bool(schema.categorical)


def _one_id(cfg: Config) -> bool:
    """The schema is one id column and nothing else: no pair of features for a model to cross."""
    return _id_only(cfg) and len(cfg.data.schema.categorical) == 1


def _biases(cfg: Config) -> dict[str, Any]:
    """The per-id bias a logistic regression has (first-order tables, DLRM and DCN-v2; part of DeepFM and
    Wide&Deep), learning at 5x the embeddings' Adam rate, 10x on id columns only: one number in logit units moves
    too slowly at Adam's step size."""
    on = {} if model_class(cfg.model.name).first_order_by_design else {"model.first_order": "on"}
    scale = ID_ONLY_FIRST_ORDER_LR_SCALE if _id_only(cfg) else SMALL_FIRST_ORDER_LR_SCALE
    return {**on, "model.first_order_lr_scale": scale}


def _added_bias_rate(cfg: Config) -> dict[str, Any]:
    """From 65,536 rows on: 5x for the first-order tables that ``model.first_order`` adds to DLRM and DCN-v2 on a
    schema of id columns only (measured there: ids3h, MovieLens); not for DeepFM's and Wide&Deep's own first-order
    terms, which lost 0.024-0.026 at 5x under row-wise Adagrad on syn180k, nor with dense columns (not measured)."""
    if model_class(cfg.model.name).first_order_by_design or not _id_only(cfg):
        return {}
    added = optional_first_order(cfg.model, n_dense=0)  # the tables "auto" or "on" add on id columns only
    return {"model.first_order_lr_scale": SMALL_FIRST_ORDER_LR_SCALE} if added else {}


def size_defaults(cfg: Config, given: set[str], train_rows: int | None = None) -> tuple[Config, dict[str, Any]]:
    """``cfg`` with the size-chosen values for the keys not in ``given``; and what was chosen (dotted key -> value).

    ``train_rows``: the training rows (default: :func:`estimate_train_rows`). The embedding optimizer's keys go
    together: giving any ``embedding.optimizer.*`` key keeps the optimizer as configured.
    """
    rows = estimate_train_rows(cfg) if train_rows is None else train_rows
    if rows is None:
        return cfg, {}
    chosen = {}
    optimizer_given = any(k.startswith("embedding.optimizer.") for k in given)
    for key, value in _choices(rows, cfg).items():
        if key in given or (key.startswith("embedding.optimizer.") and optimizer_given):
            continue
        chosen[key] = value
    if not chosen:
        return cfg, {}
    return with_values(cfg, chosen), chosen
