"""The 2-D mesh and the cross-group collectives on 4 spawned ranks (2 groups of 2), against plain reductions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hier_workers import CODECS, mesh_worker, rows_of
from tierec.distributed.launch import spawn

# Relative tolerance of each codec on one send (of the row's or block's range for int8).
TOL = {"none": 1e-6, "fp16": 2e-3, "bf16": 1.6e-2, "int8": 8e-3}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("hier")
    spawn(mesh_worker, 4, (str(out), 2), timeout_s=240)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(4)]


def _reference_rows(ranks: list[int]) -> dict[tuple[int, int], torch.Tensor]:
    ref: dict[tuple[int, int], torch.Tensor] = {}
    for r in ranks:
        k, t, v = rows_of(r)
        for key, tab, val in zip(k.tolist(), t.tolist(), v):
            ref[(tab, key)] = ref.get((tab, key), torch.zeros_like(val)) + val
    return ref


def test_mesh_groups(results: list[dict]) -> None:
    for rank, res in enumerate(results):
        assert (res["replica"], res["shard"]) == (rank // 2, rank % 2)
        assert res["group_ctx"] == (rank % 2, 2)
        assert res["shard_sum"] == sum(range(rank // 2 * 2, rank // 2 * 2 + 2))  # the ranks of its group
        assert res["replica_sum"] == rank % 2 + (rank % 2 + 2)  # the same shard in both groups
        assert res["sparse_size"] == 2.0


@pytest.mark.parametrize("name", CODECS)
def test_replica_row_sums_match_the_uncompressed_sum(results: list[dict], name: str) -> None:
    for shard in (0, 1):
        ranks = [shard, shard + 2]
        ref = _reference_rows(ranks)
        k0, t0, s0 = results[ranks[0]][f"rows/{name}"]
        k1, t1, s1 = results[ranks[1]][f"rows/{name}"]
        assert np.array_equal(k0, k1) and np.array_equal(t0, t1) and torch.equal(s0, s1)  # replicas identical
        assert {(int(t), int(k)) for k, t in zip(k0, t0)} == set(ref)  # the union of the rows
        want = torch.stack([ref[(int(t), int(k))] for k, t in zip(k0, t0)])
        scale = max(rows_of(r)[2].abs().max().item() for r in ranks)
        err = (s0 - want).abs().max().item()
        assert err <= TOL[name] * scale * 2, (name, err, scale)
        if name != "none":
            assert err > 0  # the codec did lose something: the comparison is not vacuous


@pytest.mark.parametrize("name", CODECS)
def test_dense_hook_matches_ddp(results: list[dict], name: str) -> None:
    for res in results:
        plain = torch.stack(res["dense/plain"])
        got = torch.stack(res[f"dense/{name}"])
        err = (got - plain).abs().max().item()
        assert err <= TOL[name] * plain.abs().max().item() * 4, (name, err)
    traffic = results[0][f"dense_traffic/{name}"]
    assert traffic["cross/dense"] > 0 and traffic["dense"] > 0
    if name != "none":  # compressed: fewer bytes cross groups than uncompressed
        assert traffic["cross/dense"] < results[0]["dense_traffic/none"]["cross/dense"]


@pytest.mark.parametrize("name", CODECS)
def test_dense_average(results: list[dict], name: str) -> None:
    for shard in (0, 1):
        a0, b0 = results[shard][f"avg/{name}"]
        a1, b1 = results[shard + 2][f"avg/{name}"]
        assert torch.equal(b0, b1)  # the replicas end identical
        want = (a0 + a1) / 2
        torch.testing.assert_close(b0, want, rtol=0, atol=max(TOL[name] * 0.02, 1e-6))


@pytest.mark.parametrize("name", CODECS)
def test_row_gradient_sync(results: list[dict], name: str) -> None:
    for shard in (0, 1):
        ranks = [shard, shard + 2]
        ref = _reference_rows(ranks)
        k0, s0 = results[ranks[0]][f"rowgrad/{name}"]
        k1, s1 = results[ranks[1]][f"rowgrad/{name}"]
        assert np.array_equal(k0, k1) and torch.equal(s0, s1)
        want = torch.stack([ref[(int(k) % 2, int(k))] for k in k0])  # rows_of puts id k in table k % 2
        assert len(k0) == len(ref)
        scale = max(rows_of(r)[2].abs().max().item() for r in ranks)
        assert (s0 - want).abs().max().item() <= TOL[name] * scale * 2


@pytest.mark.parametrize("name", CODECS)
def test_row_average(results: list[dict], name: str) -> None:
    for shard in (0, 1):
        b0, a0 = results[shard][f"rowavg/{name}"]
        b1, a1 = results[shard + 2][f"rowavg/{name}"]
        for t in ("t", "u"):
            ids0, ids1 = a0[t]["ids"].tolist(), a1[t]["ids"].tolist()
            assert sorted(ids0) == sorted(ids1)  # every replica holds the union
            assert set(ids0) == set(b0[t]["ids"].tolist()) | set(b1[t]["ids"].tolist())
            for key in ("weights", "opt.sum"):
                got0 = dict(zip(ids0, a0[t][key]))
                got1 = dict(zip(ids1, a1[t][key]))
                pre0 = dict(zip(b0[t]["ids"].tolist(), b0[t][key]))
                pre1 = dict(zip(b1[t]["ids"].tolist(), b1[t][key]))
                for i in ids0:
                    assert torch.equal(got0[i], got1[i])  # replicas identical
                    if i in pre0 and i in pre1:  # touched by both: the mean of both records
                        want = (pre0[i] + pre1[i]) / 2
                        tol = 1e-6 if name == "none" else TOL[name] * float(want.abs().max() + 1e-3) * 4
                        torch.testing.assert_close(got0[i], want, rtol=0, atol=tol)
