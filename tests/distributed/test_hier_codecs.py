"""The cross-group codecs and their error feedback against the uncompressed values (one process)."""

from __future__ import annotations

import doctest
import importlib

import numpy as np
import pytest
import torch

from tierec.config import ConfigError, DistConfig
from tierec.distributed.codecs import DenseResiduals, RowResiduals, SegmentedCodec, codec, decode_flat
from tierec.distributed.cross import replica_sum_rows
from tierec.distributed.mesh_shape import MeshShape

# Bound of one round trip, relative to a value (16-bit floats) or to the row's range (int8: half a step).
BOUND = {"none": 0.0, "fp16": 2.0**-11, "bf16": 2.0**-8}


def _rows(n: int = 64, d: int = 16, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scales = torch.logspace(-4, 2, n).unsqueeze(1)  # rows of very different magnitudes
    return torch.randn(n, d, generator=g) * scales


@pytest.mark.parametrize("name", ["none", "fp16", "bf16"])
def test_float_codecs_round_trip(name: str) -> None:
    c, x = codec(name), _rows()
    payload = c.encode(x)
    assert payload.dtype == torch.uint8 and payload.shape == (64, c.row_bytes(16))
    y = c.decode(payload, 16)
    tiny = 2.0**-25 if name == "fp16" else 0.0  # fp16 is subnormal below 2^-14: half its smallest step
    assert ((y - x).abs() <= BOUND[name] * x.abs() + tiny).all()
    assert torch.equal(y, x) == (name == "none")


def test_int8_rowwise_round_trip() -> None:
    c, x = codec("int8"), _rows()
    assert c.row_bytes(16) == 24  # 16 one-byte values, a float32 offset and scale
    y = c.decode(c.encode(x), 16)
    step = (x.amax(1) - x.amin(1)) / 255  # [N] the row's quantisation step
    assert ((y - x).abs() <= step.unsqueeze(1) * 0.5001 + 1e-12).all()  # per row, not per tensor
    const = torch.full((2, 5), 3.25)
    assert torch.equal(c.decode(c.encode(const), 5), const)  # a constant row is exact


@pytest.mark.parametrize("name", ["fp16", "bf16", "int8"])
def test_error_feedback_keeps_the_sum_of_sends(name: str) -> None:
    """Sending rows repeatedly, in changing subsets: with feedback the total received stays within one
    step of the total meant; without it, the error of every send adds up."""
    c, x = codec(name), _rows(32, 8, seed=1) + 0.3
    keys = np.arange(32, dtype=np.int64) * 7
    tabs = np.zeros(32, dtype=np.int32)
    res = RowResiduals(8)
    meant, got_ef, got_plain = torch.zeros(32, 8), torch.zeros(32, 8), torch.zeros(32, 8)
    rng = np.random.default_rng(0)
    for _ in range(60):
        sel = np.sort(rng.choice(32, size=20, replace=False))
        at = torch.from_numpy(sel)
        meant[at] += x[at]
        got_ef[at] += c.decode(res.encode(c, keys[sel], tabs[sel], x[at]), 8)
        got_plain[at] += c.decode(c.encode(x[at]), 8)
    one_send = (c.decode(c.encode(x), 8) - x).abs().amax(1)  # [N] one round trip's worst error per row
    err_ef = (got_ef - meant).abs().amax(1)
    err_plain = (got_plain - meant).abs().amax(1)
    assert (err_ef <= 2 * one_send + 1e-5 * meant.abs().amax(1)).all()  # the last send's residual, plus float sums
    assert err_plain.sum() > 5 * err_ef.sum()
    assert len(res) == 32


def test_dense_error_feedback() -> None:
    c, res = codec("int8"), DenseResiduals()
    x = torch.linspace(-1, 1, 1000) ** 3
    total = torch.zeros(1000)
    for _ in range(50):
        total += decode_flat(c, res.encode("b", c, x), 1000)
    assert (total - 50 * x).abs().max() < 2 / 255  # one step of the block's range, not 50


def test_segmented_codec_keeps_segments_apart() -> None:
    x = torch.cat([torch.randn(10, 4) * 1e-3, torch.randn(10, 1).abs() * 100], 1)  # weights, then an accumulator
    seg = SegmentedCodec(codec("int8"), [4, 1])
    y = seg.decode(seg.encode(x), 5)
    assert (y[:, :4] - x[:, :4]).abs().max() < 1e-5  # a row-wise range over both would lose the weights
    whole = codec("int8").decode(codec("int8").encode(x), 5)
    assert (whole[:, :4] - x[:, :4]).abs().max() > 1e-3


def test_one_replica_sum_is_a_dedupe() -> None:
    k, t, s = replica_sum_rows(np.array([5, 5, 9]), np.array([0, 1, 0], dtype=np.int32), torch.eye(3), codec("none"), None, None)
    assert k.tolist() == [5, 5, 9] and t.tolist() == [0, 1, 0] and torch.equal(s, torch.eye(3))


def test_config_keys() -> None:
    cfg = DistConfig(group_size=2, cross_group="average", sync_every=4, compress="int8")
    assert (cfg.group_size, cfg.cross_group, cfg.sync_every, cfg.compress) == (2, "average", 4, "int8")
    for bad, key in [({"group_size": -1}, "dist.group_size"), ({"cross_group": "x"}, "dist.cross_group"),
                     ({"sync_every": 0}, "dist.sync_every"), ({"compress": "int4"}, "dist.compress")]:
        with pytest.raises(ConfigError, match=key):
            DistConfig(**bad)


def test_mesh_shape() -> None:
    assert MeshShape.resolve(0, world=4).is_flat  # 0: today's flat run (on any number of nodes)
    m = MeshShape.resolve(3, world=6)  # e.g. two nodes of 3
    assert (m.replicas, m.group_size, m.group_ranks(1), m.replica_ranks(2)) == (2, 3, [3, 4, 5], [2, 5])
    assert MeshShape.resolve(4, world=4).is_flat  # an explicit g = W is flat
    with pytest.raises(ConfigError, match=r"^dist.group_size 3 must divide the world size 4$"):
        MeshShape.resolve(3, world=4)


@pytest.mark.parametrize("name", ["tierec.distributed.mesh", "tierec.distributed.mesh_shape", "tierec.distributed.codecs", "tierec.distributed.cross",
                                  "tierec.distributed.dense_sync", "tierec.distributed.row_sync"])
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


def test_jobs_refuse_a_group_size_that_does_not_divide() -> None:
    from tierec.distributed.mesh_shape import check_mesh

    check_mesh(DistConfig(), 4)  # 0: one flat group, also across nodes
    check_mesh(DistConfig(group_size=4), 4)
    check_mesh(DistConfig(group_size=2), 4)  # 2 groups of 2: the trainer runs the mesh
    with pytest.raises(ConfigError, match=r"^dist.group_size 3 must divide the world size 4$"):
        check_mesh(DistConfig(group_size=3), 4)


@pytest.mark.parametrize("name", ["none", "fp16", "bf16", "int8"])
def test_no_rows(name: str) -> None:
    c = codec(name)
    assert c.decode(c.encode(torch.zeros(0, 4)), 4).shape == (0, 4)
    k, t, s = replica_sum_rows(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int32), torch.zeros(0, 4), c,
                               RowResiduals(4), None)
    assert k.shape == (0,) and s.shape == (0, 4)


def test_a_multi_node_flat_job_says_how_to_make_a_group_per_node() -> None:
    from tierec.config import load_config
    from tierec.distributed import DistContext
    from tierec.distributed.job import Job

    two_nodes = Job(load_config(None), DistContext(rank=0, world_size=4, local_world_size=2))
    assert two_nodes.layout() == ("4 processes on 2 nodes as one group; dist.group_size = 2 would make a group "
                                  "per node (docs/distributed.md)")
    assert Job(load_config(None), DistContext(rank=0, world_size=4, local_world_size=4)).layout() == ""
    assert Job(load_config(None)).layout() == ""
