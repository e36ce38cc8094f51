"""The trainable parts of a run, built from a Config: embeddings, model, dense optimizer.

Kept apart from the loop so that ``tierec eval`` and ``tierec predict`` build
exactly what ``tierec train`` saved.

>>> from tierec.config import load_config
>>> from tierec.train.components import Components
>>> c = Components.build(load_config(None, ["embedding.dim=4"]), [f"C{i}" for i in range(3)], n_dense=2)
>>> type(c.model).__name__, c.wide is None
('DLRM', True)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from tierec.batch import Batch
from tierec.config import Config, EmbeddingConfig
from tierec.embedding import EmbeddingCollection, tables_from_config
from tierec.models import CTRModel, build_model, has_first_order
from tierec.prune import Pruner
from tierec.storage import storage_factory
from tierec.store.plan import StorePlan
from tierec.train.memory import check_memory, estimate_memory
from tierec.train.precision import DenseStep

# First-order (dim-1) tables start near zero, like a logistic regression.
WIDE_INIT_SCALE = 1e-3


@dataclass(frozen=True)
class PreparedBatch:
    """What was prepared ahead for one batch, per embedding collection: what that collection's
    ``prepare`` returned for the batch (an ``Ahead``, a ``PreparedExchange``), or None where its
    forward does everything itself. Valid for that batch's :meth:`Components.embed` only."""

    embeddings: Any = None
    wide: Any = None


@dataclass
class Components:
    embeddings: EmbeddingCollection
    wide: EmbeddingCollection | None
    model: CTRModel
    optimizer: torch.optim.Optimizer
    pruner: Pruner | None = None  # prunes the dims of `embeddings` every cfg.prune.every steps
    ddp: nn.Module | None = None  # `model` wrapped for data parallelism (distributed runs), else None
    dense_step: DenseStep | None = None  # runs `model` (or `ddp`) in cfg.train.precision, compiled or not

    @staticmethod
    def build(cfg: Config, feature_names: list[str] | tuple[str, ...], n_dense: int) -> Components:
        seed, device = cfg.train.seed, cfg.train.device
        check_memory(estimate_memory(cfg, list(feature_names), n_dense), device=device)  # before allocating anything
        torch.manual_seed(seed)
        # Pruning stores the main tables as chunks; the dim-1 first-order tables are never pruned (a row of
        # one dim has no trailing chunk to drop, and a bias costs 1/dim of its id's embedding).
        # Tiered storage (cfg.store) tags tables with their store and builds their groups; a no-op when off.
        plan = StorePlan.for_run(cfg, feature_names, n_dense)
        # With both, the pruned groups' chunks are what the tiers hold (tierec/storage.py decides).
        factory = storage_factory(plan, cfg.prune if cfg.prune.enabled else None)
        emb = EmbeddingCollection(
            plan.tables(tables_from_config(cfg.embedding, feature_names)), feature_names, seed=seed, device=device, group_factory=factory
        )
        wide = None
        if has_first_order(cfg.model, n_dense):
            rate = cfg.embedding.optimizer.lr * cfg.model.first_order_lr_scale
            wide_cfg: EmbeddingConfig = dataclasses.replace(
                cfg.embedding, init_scale=WIDE_INIT_SCALE, optimizer=dataclasses.replace(cfg.embedding.optimizer, lr=rate)
            )
            wide = EmbeddingCollection(
                plan.tables(tables_from_config(wide_cfg, feature_names, dim=1, suffix=".wide")),
                feature_names,
                seed=seed + 1,
                device=device,
                group_factory=storage_factory(plan),
            )
        dims = set(emb.dims)
        if len(dims) != 1:
            raise ValueError(f"the models need one embedding dim for all features, got {sorted(dims)}")
        model = build_model(cfg.model, n_dense=n_dense, n_sparse=len(feature_names), dim=dims.pop()).to(device)
        pruner = Pruner(emb, cfg.prune) if cfg.prune.enabled else None
        step = DenseStep(model, cfg.train.precision, cfg.train.compile)
        return Components(emb, wide, model, _dense_optimizer(cfg, model), pruner, dense_step=step)

    def forward(self, batch: Batch) -> Tensor:  # -> logits [B]
        return self.dense(batch, *self.embed(batch))

    def prepare(self, batch: Batch) -> PreparedBatch:
        """Every embedding collection's ``prepare`` of ``batch`` (sharded ones start exchanging its ids),
        to be handed to that batch's :meth:`embed`. Every rank prepares the same batches in the same order."""
        emb = self.embeddings.prepare(batch.sparse)
        return PreparedBatch(emb, self.wide.prepare(batch.sparse) if self.wide is not None else None)

    def embed(self, batch: Batch, prepared: PreparedBatch | None = None) -> tuple[Tensor, Tensor | None]:
        """Pooled embeddings ``[B, F, D]`` and first-order terms ``[B, F]`` (or None) on the model's device;
        ``prepared``: what was prepared ahead for this very batch (the pipeline's stages 2 and 3)."""
        ahead = prepared if prepared is not None else PreparedBatch()
        emb = self.embeddings(batch.sparse, ahead.embeddings)
        wide = self.wide(batch.sparse, ahead.wide).squeeze(-1) if self.wide is not None else None
        return emb, wide

    def dense(self, batch: Batch, emb: Tensor, wide: Tensor | None) -> Tensor:  # -> logits [B]
        """The dense model on the batch's dense features and its embeddings, in the run's precision."""
        if self.dense_step is None:
            dense = self.ddp if self.ddp is not None else self.model
            return dense(batch.dense, emb, wide)
        return self.dense_step(batch.dense, emb, wide, module=self.ddp)

    def train(self, mode: bool = True) -> None:
        for m in self.modules():
            m.train(mode)

    def modules(self) -> list[nn.Module]:
        return [m for m in (self.embeddings, self.wide, self.model) if m is not None]

    def embedding_rows(self) -> int:
        return sum(m.num_rows() for m in (self.embeddings, self.wide) if m is not None)

    def embedding_bytes(self) -> int:  # bytes allocated by tables, optimizer state and indexes
        return sum(m.nbytes() for m in (self.embeddings, self.wide) if m is not None)


def _dense_optimizer(cfg: Config, model: nn.Module) -> torch.optim.Optimizer:
    params, lr = model.parameters(), cfg.train.dense_lr
    if cfg.train.dense_optimizer == "adam":
        return torch.optim.Adam(params, lr=lr)
    if cfg.train.dense_optimizer == "adagrad":
        return torch.optim.Adagrad(params, lr=lr)
    return torch.optim.SGD(params, lr=lr)
