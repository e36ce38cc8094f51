"""What a job of several processes refuses before any rank starts, in one line."""

from __future__ import annotations

import pytest

from tierec.config import ConfigError, load_config
from tierec.distributed.config_check import check_job_config


@pytest.mark.parametrize("overrides, says", [
    (["dist.backend=nccl"], "dist.backend"),  # NCCL needs CUDA
    (["train.device=cuda:1"], "train.device"),  # each process takes the GPU of its local rank
])
def test_refused_before_any_rank(overrides: list[str], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        check_job_config(load_config(None, overrides), 2)


def test_the_defaults_pass() -> None:
    check_job_config(load_config(None), 2)
    check_job_config(load_config(None, ["train.device=cuda"]), 2)  # a GPU per process (or shared, on gloo)


def test_hot_rows_with_pruning_pass() -> None:  # a replica keeps each row's own dims (test_hot_pruned.py)
    check_job_config(load_config(None, ["dist.hot_rows=64", "prune.enabled=true"]), 2)
    check_job_config(load_config(None, ["dist.hot_rows=64", "prune.enabled=true", "dist.group_size=2"]), 4)
