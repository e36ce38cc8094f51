"""Everything a run must save to continue exactly: one flat tensor dict plus a JSON skeleton.

>>> from tierec.config import load_config
>>> from tierec.train.components import Components
>>> from tierec.train.state import restore_state, snapshot_state
>>> parts = Components.build(load_config(None, ["embedding.dim=4"]), ["C1"], n_dense=1)
>>> tensors, skeleton = snapshot_state(parts)
>>> restore_state(parts, tensors, skeleton)
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from tierec.train.checkpoint import capture_rng_state, flatten_state, restore_rng_state, unflatten_state
from tierec.train.components import Components


def embedding_collections(parts: Components) -> list[tuple[str, Any]]:
    """(checkpoint prefix, collection) of each embedding collection a run has."""
    return [(name, c) for name, c in (("emb", parts.embeddings), ("wide", parts.wide)) if c is not None]


def snapshot_state(parts: Components) -> tuple[dict[str, Tensor], Any]:
    """Embedding rows (with their optimizer state), dense model and optimizer, RNG states."""
    state: dict[str, Any] = {
        "model": parts.model.state_dict(),
        "optimizer": parts.optimizer.state_dict(),
        "rng": capture_rng_state(),
    }
    tensors, skeleton = flatten_state(state)
    for name, coll in embedding_collections(parts):
        tensors.update({f"{name}/{k}": v for k, v in coll.state_dict().items()})
    return tensors, skeleton


def restore_state(parts: Components, tensors: dict[str, Tensor], skeleton: Any) -> None:
    dense = {k: v for k, v in tensors.items() if "/" not in k}
    state = unflatten_state(dense, skeleton)
    parts.model.load_state_dict(state["model"])
    parts.optimizer.load_state_dict(state["optimizer"])
    restore_rng_state(state["rng"])
    for name, coll in embedding_collections(parts):
        prefix = f"{name}/"
        coll.load_state_dict({k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)})


def load_rows(parts: Components, tensors: dict[str, Tensor]) -> None:
    """The embedding rows of one more shard of a sharded checkpoint (each rank keeps the rows it owns)."""
    for name, coll in embedding_collections(parts):
        prefix = f"{name}/"
        coll.load_state_dict({k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)})
