"""What `tierec tune` searches: a typed search space, its defaults by data size, and its narrowing in TOML.

Each dimension is a :class:`FloatRange` (optionally log-scaled), an :class:`IntRange` or a :class:`Choices`;
a :class:`SearchSpace` names one per tuned config key (``KEYS``). The defaults (:func:`default_space`) are
centred on the config the data's size chose (``tierec train``'s size-chosen defaults, docs/models.md):

====================  ===============================  ==========================================
dimension             config key                       default range
====================  ===============================  ==========================================
embedding_lr          embedding.optimizer.lr           lr / 10 .. lr * 10, log
dense_lr              train.dense_lr                   lr / 10 .. lr * 10, log
dim                   embedding.dim                    4, 8, 16 (< 20k rows); 8, 16, 32; 16, 32, 64 (>= 204,800)
dropout               model.dropout                    0 .. 0.3
weight_decay          embedding.optimizer.weight_decay 1e-8 .. 1e-4, log
epochs                train.epochs                     1 .. 4 (< 20k rows); 1 .. 3; 1 .. 2 (>= 204,800)
batch_size            train.batch_size                 batch / 2, batch, batch * 2 (at least 32)
first_order_lr_scale  model.first_order_lr_scale       1 .. 10, log (the first-order tables' rate)
model                 model.name                       dlrm, deepfm, dcnv2, widedeep (fixed when the
                                                       config names a model)
====================  ===============================  ==========================================

A ``[tune]`` table in a ``--config`` file (or ``--set tune...``) sets :class:`TuneConfig`; its
``[tune.space]`` narrows any dimension: a number fixes it, ``[low, high]`` is a range (a float range keeps
its log scale), a list of values is the choices of ``dim``, ``batch_size`` and ``model``. A model named in the
config (``model.name`` in a ``--config`` file or ``--set``) fixes ``model`` unless ``[tune.space]`` sets it.
The other size-chosen values are the base config's for every model (``first_order_lr_scale`` is searched).

>>> from tierec.config import load_config
>>> space = default_space(load_config(None, []), train_rows=8_000)
>>> space.dim, space.epochs
(Choices(values=(4, 8, 16)), IntRange(low=1, high=4))
>>> narrowed = narrow(space, {"dim": [8, 16], "dropout": 0.1, "embedding_lr": [1e-3, 1e-2]})
>>> narrowed.dim.values, narrowed.dropout, narrowed.embedding_lr
((8, 16), FloatRange(low=0.1, high=0.1, log=False), FloatRange(low=0.001, high=0.01, log=True))
>>> space.model, narrow(space, {"model": "deepfm"}).model.fixed
(Choices(values=('dlrm', 'deepfm', 'dcnv2', 'widedeep')), True)
>>> narrow(space, {"depth": 3})
Traceback (most recent call last):
...
tierec.errors.ConfigError: unknown tune.space key(s) ['depth']; valid keys: ['embedding_lr', 'dense_lr', 'dim', 'dropout', 'weight_decay', 'epochs', 'batch_size', 'first_order_lr_scale', 'model']
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Protocol

from tierec.config import MODEL_NAMES, Config, ConfigError, from_dict
from tierec.models import model_class

SMALL_ROWS = 20_000  # as tierec.train.sizing: below, a smaller model trained for more epochs
LARGE_ROWS = 204_800
LR_FACTOR = 10.0  # learning rates: from the size-chosen one / 10 to * 10
FIRST_ORDER_SCALES = (1.0, 10.0)  # the first-order tables' rate over the embeddings' (the size-chosen 1, 5 or 10 inside)

# The config key each dimension of the space sets.
KEYS = {
    "embedding_lr": "embedding.optimizer.lr",
    "dense_lr": "train.dense_lr",
    "dim": "embedding.dim",
    "dropout": "model.dropout",
    "weight_decay": "embedding.optimizer.weight_decay",
    "epochs": "train.epochs",
    "batch_size": "train.batch_size",
    "first_order_lr_scale": "model.first_order_lr_scale",
    "model": "model.name",
}


class Suggester(Protocol):
    """What a dimension asks of an Optuna trial (``optuna.Trial`` has these)."""

    def suggest_float(self, name: str, low: float, high: float, *, log: bool = False) -> float: ...
    def suggest_int(self, name: str, low: int, high: int) -> int: ...
    def suggest_categorical(self, name: str, choices: list[Any]) -> Any: ...


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _pair(value: Any, where: str) -> tuple[Any, Any]:
    """A number (fixed) or ``[low, high]``, as (low, high)."""
    if _is_number(value):
        return value, value
    if isinstance(value, list) and len(value) == 2 and all(_is_number(v) for v in value):
        return value[0], value[1]
    raise ConfigError(f"{where} must be a number or [low, high], got {value!r}")


@dataclass(frozen=True)
class FloatRange:
    low: float
    high: float
    log: bool = False

    def __post_init__(self) -> None:
        if not self.low <= self.high:
            raise ConfigError(f"a range needs low <= high, got [{self.low}, {self.high}]")
        if self.log and self.low <= 0:
            raise ConfigError(f"a log-scaled range needs low > 0, got [{self.low}, {self.high}]")

    def suggest(self, trial: Suggester, name: str) -> float:
        return self.low if self.low == self.high else trial.suggest_float(name, self.low, self.high, log=self.log)

    def given(self) -> Any:
        return self.low if self.low == self.high else [self.low, self.high]

    @property
    def fixed(self) -> bool:
        return self.low == self.high

    def nearest(self, value: float) -> float:
        return float(min(max(value, self.low), self.high))

    def narrowed(self, value: Any, where: str) -> FloatRange:
        low, high = _pair(value, where)
        return FloatRange(float(low), float(high), self.log and low != high)


@dataclass(frozen=True)
class IntRange:
    low: int
    high: int

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.high:
            raise ConfigError(f"an integer range needs 1 <= low <= high, got [{self.low}, {self.high}]")

    def suggest(self, trial: Suggester, name: str) -> int:
        return self.low if self.low == self.high else trial.suggest_int(name, self.low, self.high)

    def given(self) -> Any:
        return self.low if self.low == self.high else [self.low, self.high]

    @property
    def fixed(self) -> bool:
        return self.low == self.high

    def nearest(self, value: int) -> int:
        return int(min(max(value, self.low), self.high))

    def narrowed(self, value: Any, where: str) -> IntRange:
        low, high = _pair(value, where)
        if int(low) != low or int(high) != high:
            raise ConfigError(f"{where} must be integers, got {value!r}")
        return IntRange(int(low), int(high))


@dataclass(frozen=True)
class Choices:
    """A categorical dimension: positive integers (``dim``, ``batch_size``) or, with ``names``, model names."""

    values: tuple[Any, ...]
    names: bool = field(default=False, repr=False)  # model.name's values (``model``), not positive integers

    def __post_init__(self) -> None:
        if self.names and (not self.values or any(v not in MODEL_NAMES for v in self.values)):
            raise ConfigError(f"model choices must be some of {list(MODEL_NAMES)}, got {list(self.values)}")
        if not self.names and (not self.values or any(not _is_number(v) or int(v) != v or v < 1 for v in self.values)):
            raise ConfigError(f"choices must be positive integers, got {list(self.values)}")

    def suggest(self, trial: Suggester, name: str) -> Any:
        return self.values[0] if len(self.values) == 1 else trial.suggest_categorical(name, list(self.values))

    def given(self) -> Any:
        return list(self.values)

    @property
    def fixed(self) -> bool:
        return len(self.values) == 1

    def nearest(self, value: Any) -> Any:
        if self.names:
            return value if value in self.values else self.values[0]
        return min(self.values, key=lambda v: (abs(v - value), v))

    def narrowed(self, value: Any, where: str) -> Choices:
        one, what = ((lambda v: isinstance(v, str)), "a model name") if self.names else (_is_number, "a number")
        values = [value] if one(value) else value
        if not isinstance(values, list) or not all(one(v) for v in values):
            raise ConfigError(f"{where} must be {what} or a list of them, got {value!r}")
        return Choices(tuple(dict.fromkeys(v if self.names else int(v) for v in values)), self.names)


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """One dimension per tuned key (``KEYS``)."""

    embedding_lr: FloatRange
    dense_lr: FloatRange
    dim: Choices
    dropout: FloatRange
    weight_decay: FloatRange
    epochs: IntRange
    batch_size: Choices
    first_order_lr_scale: FloatRange
    model: Choices

    def sample(self, trial: Suggester) -> dict[str, Any]:
        """One point: {dimension name: value} (a fixed dimension is not asked of the trial)."""
        return {name: getattr(self, name).suggest(trial, name) for name in KEYS}

    def searched(self) -> list[str]:
        """The dimensions a trial is asked for (the others are fixed)."""
        return [name for name in KEYS if not getattr(self, name).fixed]

    def nearest(self, values: dict[str, Any]) -> dict[str, Any]:
        """The point of the searched dimensions nearest to ``values`` (a config's: {dimension: value})."""
        return {name: getattr(self, name).nearest(values[name]) for name in self.searched()}

    def given(self) -> dict[str, Any]:
        """The space as ``[tune.space]`` would give it (a log scale is the default's: the learning rates and
        weight decay): the study's record of what it searched, which narrows the defaults back to this space."""
        return {name: getattr(self, name).given() for name in KEYS}


@dataclass(kw_only=True)
class TuneConfig:
    """The ``[tune]`` table: how trials are run and judged (the ranges are in ``[tune.space]``)."""

    evals_per_epoch: int = 2  # validation AUCs reported to the pruner per epoch of a trial
    startup_trials: int = 3  # trials run whole before any is pruned (MedianPruner's n_startup_trials)
    # evaluations a trial runs before one may prune it (0: from its first on; 1, at 2 per epoch: not before its
    # first epoch ends: mid-epoch AUCs favour fast learning rates over what ends best; the MovieLens part, tune.seed
    # 0-2, model searched: test AUC -0.0012 to +0.0011 to LR at 0, +0.0011 to +0.0051 at 1)
    warmup_evals: int = 1
    seed: int = 0  # the sampler's seed (TPE)
    space: dict[str, Any] = field(default_factory=dict)  # narrowing of the default ranges (see the module's doc)

    def __post_init__(self) -> None:
        if self.evals_per_epoch < 1:
            raise ConfigError(f"tune.evals_per_epoch must be >= 1, got {self.evals_per_epoch}")
        if self.startup_trials < 0 or self.warmup_evals < 0:
            raise ConfigError("tune.startup_trials and tune.warmup_evals must be >= 0")
        unknown = sorted(set(self.space) - set(KEYS))
        if unknown:
            raise ConfigError(f"unknown tune.space key(s) {unknown}; valid keys: {list(KEYS)}")


def tune_config(data: dict[str, Any]) -> TuneConfig:
    """The ``[tune]`` table of a merged config dict (taken out of it: the rest is a tierec Config). A model the
    config names (``model.name``) fixes the space's ``model`` unless ``[tune.space]`` sets it.

    >>> tune_config({"model": {"name": "dcnv2"}}).space, tune_config({"tune": {"space": {"model": ["dlrm"]}}}).space
    ({'model': 'dcnv2'}, {'model': ['dlrm']})
    """
    table = data.pop("tune", {})
    if not isinstance(table, dict):
        raise ConfigError(f"tune must be a table, got {table!r}")
    model, space = data.get("model"), table.get("space", {})
    if isinstance(model, dict) and "name" in model and isinstance(space, dict) and "model" not in space:
        table = {**table, "space": {**space, "model": model["name"]}}
    return from_dict(TuneConfig, table, "tune")


def default_space(cfg: Config, train_rows: int | None) -> SearchSpace:
    """The default ranges for ``cfg`` (already size-chosen) on ``train_rows`` training rows (None: unknown)."""
    rows = LARGE_ROWS // 2 if train_rows is None else train_rows
    if rows < SMALL_ROWS:
        dims, epochs = (4, 8, 16), 4
    elif rows < LARGE_ROWS:
        dims, epochs = (8, 16, 32), 3
    else:
        dims, epochs = (16, 32, 64), 2
    if cfg.prune.enabled:  # a pruned table's dims are whole chunks
        dims = tuple(d for d in dims if d % cfg.prune.chunk == 0) or (cfg.embedding.dim,)
    # the base config's model first (trial 0, the defaults); not those that need first-order terms when it has them off
    models = (cfg.model.name, *(m for m in MODEL_NAMES if m != cfg.model.name
                                and not (cfg.model.first_order == "off" and model_class(m).first_order_by_design)))
    lr, dense_lr, batch = cfg.embedding.optimizer.lr, cfg.train.dense_lr, cfg.train.batch_size
    return SearchSpace(
        embedding_lr=FloatRange(lr / LR_FACTOR, lr * LR_FACTOR, log=True),
        dense_lr=FloatRange(dense_lr / LR_FACTOR, dense_lr * LR_FACTOR, log=True),
        dim=Choices(dims),
        dropout=FloatRange(0.0, 0.3),
        weight_decay=FloatRange(1e-8, 1e-4, log=True),
        epochs=IntRange(1, epochs),
        batch_size=Choices(tuple(dict.fromkeys(max(b, 32) for b in (batch // 2, batch, batch * 2)))),
        first_order_lr_scale=FloatRange(FIRST_ORDER_SCALES[0], FIRST_ORDER_SCALES[1], log=True),
        model=Choices(models, names=True),
    )


def narrow(space: SearchSpace, given: dict[str, Any]) -> SearchSpace:
    """``space`` with the dimensions ``given`` sets (``[tune.space]``) replaced."""
    unknown = sorted(set(given) - set(KEYS))
    if unknown:
        raise ConfigError(f"unknown tune.space key(s) {unknown}; valid keys: {list(KEYS)}")
    changes = {name: getattr(space, name).narrowed(value, f"tune.space.{name}") for name, value in given.items()}
    return dataclasses.replace(space, **changes)
