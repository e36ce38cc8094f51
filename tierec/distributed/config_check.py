"""A job's config: what no job of W processes can run, and the same config on every rank.

``check_job_config`` refuses, before any process starts (``tierec train --nproc N``
calls it in the launcher) and again on every rank, what a job of W processes
cannot run: a ``dist.group_size`` that does not divide W, ``dist.backend =
"nccl"`` without CUDA, one GPU named for all processes; one line naming the keys.

Each rank hashes its resolved config (``RANK_SPECIFIC`` keys aside); the hashes
are all-gathered, and on a mismatch the configs themselves, so that every rank
fails with the same one line naming the first differing key. A job whose nodes
were started with different seeds, learning rates, batch sizes or dims would
otherwise train silently to a worse model, or die in a collective.

>>> from tierec.config import load_config
>>> config_hash(load_config(None)) == config_hash(load_config(None, ["train.progress=false"]))
True
>>> config_hash(load_config(None)) == config_hash(load_config(None, ["train.batch_size=64"]))
False
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch.distributed as dist

from tierec.config import Config, ConfigError, first_difference, flatten_dict, to_dict
from tierec.distributed.backends import Backends
from tierec.distributed.mesh_shape import check_mesh

# Keys that may differ between ranks: what is printed and the local thread count.
RANK_SPECIFIC = ("train.progress", "train.threads", "data.prefetch_batches")


def _comparable(cfg: Config) -> dict[str, Any]:
    d = json.loads(json.dumps(to_dict(cfg), default=str))
    for key in RANK_SPECIFIC:
        section, name = key.split(".")
        d.get(section, {}).pop(name, None)
    return d


def check_job_config(cfg: Config, world_size: int) -> None:
    """Raise ConfigError for what a job of ``world_size`` processes cannot run (no process group needed)."""
    check_mesh(cfg.dist, world_size)
    device = cfg.train.device
    if device.startswith("cuda:"):
        raise ConfigError(f"train.device = {device!r} names one GPU; with several processes use \"cuda\" "
                          "(local rank r takes GPU r, processes share GPUs where there are fewer)")
    Backends.resolve(cfg.dist.backend, device)  # NCCL without CUDA: refused here


def config_hash(cfg: Config) -> str:
    return hashlib.sha256(json.dumps(_comparable(cfg), sort_keys=True).encode()).hexdigest()


def check_same_config(cfg: Config, rank: int, world_size: int, group: Any = None) -> None:
    """Raise ConfigError on every rank if any rank's config differs from rank 0's (a collective)."""
    if world_size <= 1:
        return
    hashes: list[Any] = [None] * world_size
    dist.all_gather_object(hashes, config_hash(cfg), group=group)
    if len(set(hashes)) == 1:
        return
    configs: list[Any] = [None] * world_size
    dist.all_gather_object(configs, _comparable(cfg), group=group)
    for r in range(1, world_size):
        key = first_difference(configs[0], configs[r])
        if key is not None:
            a, b = flatten_dict(configs[0]).get(key), flatten_dict(configs[r]).get(key)
            raise ConfigError(f"ranks disagree on the config: {key} is {a!r} on rank 0 but {b!r} on rank {r}; "
                              "start every rank with the same config")
