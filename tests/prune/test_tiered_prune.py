"""Pruning with the tiered store: the chunks live in the tiers, and nothing changes but where.

A pruned collection whose chunks sit mostly on disk behind a small fast tier
must end with exactly the weights, optimizer state, importance and dims of the
same collection all in memory, through pruning steps and regrowth; a training
run must give the same metrics; and the row-level store policies are refused.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from tierec.batch import SparseFeatures
from tierec.config import ConfigError, OptimizerConfig, OptimizerKind, PruneConfig, load_config
from tierec.embedding import EmbeddingCollection, TableConfig
from tierec.prune import PrunedGroup, Pruner
from tierec.prune.group import chunk_store_name
from tierec.prune.tiered_pool import TieredChunkPool
from tierec.storage import storage_factory
from tierec.store.spec import TierSpec
from tierec.train.checkpoint import load_checkpoint
from tierec.train.components import Components
from tierec.train.trainer import Trainer

from prune_helpers import SMALL

FEATURES = ("a", "b")
DIM, CHUNK = 8, 2


def _collection(kind: OptimizerKind, cfg: PruneConfig, spec: TierSpec | None) -> EmbeddingCollection:
    opt = OptimizerConfig(kind=kind, lr=0.05)
    tables = [TableConfig(name=n, dim=DIM, features=[n], optimizer=opt) for n in FEATURES]
    if spec is None:
        return EmbeddingCollection(tables, FEATURES, group_factory=storage_factory(prune=cfg))

    def make(ts, seed, device):
        pool = TieredChunkPool(CHUNK, PrunedGroup.dim_state_of(opt, DIM), spec, seed=seed, name=chunk_store_name(ts))
        return PrunedGroup(ts, cfg, seed=seed, device=device, pool=pool)

    return EmbeddingCollection(tables, FEATURES, group_factory=make)


def _step(coll: EmbeddingCollection, ids: np.ndarray, s: int) -> None:
    out = coll(SparseFeatures.one_hot(FEATURES, torch.from_numpy(ids)))  # [B, 2, D]
    target = torch.randn(out.shape, generator=torch.Generator().manual_seed(s))
    scale = torch.tensor([1.0, 0.05]).view(1, 2, 1)  # feature "b" matters less
    (((out - target) ** 2) * scale).sum().backward()


@pytest.mark.parametrize("kind", [OptimizerKind.ROWWISE_ADAGRAD, OptimizerKind.ADAGRAD, OptimizerKind.ADAM])
def test_tiered_chunks_train_and_prune_exactly_like_memory(kind: OptimizerKind) -> None:
    cfg = PruneConfig(enabled=True, chunk=CHUNK, target_ratio=3.0, decay=0.5, regrow_margin=1.0)
    with tempfile.TemporaryDirectory() as disk:
        record = 4 * CHUNK * (1 + (0 if kind is not OptimizerKind.ADAM else 2) + (1 if kind is OptimizerKind.ADAGRAD else 0))
        spec = TierSpec(cache_bytes=record * 400, host_bytes=record * 100, disk_dir=disk)  # most chunks on disk
        mem, tier = _collection(kind, cfg, None), _collection(kind, cfg, spec)
        pm, pt = Pruner(mem, cfg), Pruner(tier, cfg)
        g = np.random.default_rng(0)
        for s in range(1, 31):
            ids = (np.minimum(g.zipf(1.2, size=(48, 2)), 2000) + 1000 * s % 7).astype(np.int64)  # new ids keep coming
            _step(mem, ids, s)
            _step(tier, ids, s)
            if s % 5 == 0:
                a, b = pm.step(), pt.step()
                assert (a.pruned, a.regrown, a.threshold) == (b.pruned, b.regrown, b.threshold)
        assert pm.counts() == pt.counts() and pm.counts()[0] > 0
        sa, sb = mem.state_dict(), tier.state_dict()
        assert sa.keys() == sb.keys()
        for k in sa:
            assert torch.equal(sa[k], sb[k]), k
        store = tier.groups[0].chunks.store
        stats = store.stats()[f"{FEATURES[0]}+1.chunks"]
        assert stats["rows_disk"] > stats["rows_cache"] > 0 and stats["disk_read_rows"] > 0
        # evaluation reads the same embeddings, unknown ids included
        mem.eval(), tier.eval()
        probe = SparseFeatures.one_hot(FEATURES, torch.tensor([[1001, 5], [123456789, 1002]]))
        assert torch.equal(mem(probe), tier(probe))
        tier.groups[0].close()


def test_pruned_chunks_leave_the_tiers() -> None:
    with tempfile.TemporaryDirectory() as disk:
        pool = TieredChunkPool(CHUNK, {}, TierSpec(cache_bytes=4 * CHUNK * 8, host_bytes=0, disk_dir=disk))
        ids = pool.alloc(50)
        store = pool.store
        assert store.index.num_rows == 50 and store.disk.live_rows >= 50 - 8
        pool.free(ids[:40])
        assert store.index.num_rows == 10 and store.disk.live_rows <= 10 and pool.num_live == 10
        again = pool.alloc(5)  # chunk numbers are reused, with fresh zero contents
        assert set(again.tolist()) <= set(ids[:40].tolist())
        assert not pool.read(again)["weights"].any()
        pool.close()


def test_training_with_store_and_pruning_matches_pruning_alone(tmp_path: Path) -> None:
    plain = Trainer(load_config(None, SMALL), tmp_path / "mem").fit()
    tiered_over = SMALL + ["store.enabled=true", "store.cache_size=48KiB", "store.host_size=8KiB", f"store.disk_path={tmp_path / 'disk'}"]
    tiered = Trainer(load_config(None, tiered_over), tmp_path / "tier").fit()
    assert tiered["test_auc"] == plain["test_auc"] and tiered["prune"]["dim_hist"] == plain["prune"]["dim_hist"]
    assert tiered["store"]["rows_disk"] > 0 and tiered["store"]["disk_read_rows"] > 0
    a, _ = load_checkpoint(tmp_path / "mem" / "checkpoints")
    b, _ = load_checkpoint(tmp_path / "tier" / "checkpoints")
    emb = [k for k in a if k.startswith("emb/")]
    assert emb and all(torch.equal(a[k], b[k]) for k in emb)


def test_reading_chunks_ahead_changes_no_number(tmp_path: Path) -> None:
    """store.prefetch with pruning: the chunks of the next window's rows are read ahead from disk (and the
    cached ones kept), and the run ends with the same weights and metrics as reading them on demand."""
    over = SMALL + ["data.synthetic.train_rows=20480", "data.synthetic.cardinality_scale=0.05", "store.enabled=true",
                    "store.cache_size=160KiB", "store.host_size=8KiB"]
    runs = {pf: Trainer(load_config(None, over + [f"store.prefetch={pf}", f"store.disk_path={tmp_path / ('disk-' + pf)}"]),
                        tmp_path / pf).fit() for pf in ("false", "true")}
    ahead = runs["true"]["store"]["pipeline"]
    assert ahead["staged_used_rows"] > 0  # chunks read ahead were used
    # the windows' rows kept in the fast tier move other rows: about as many rows come from disk (three
    # batches ahead 0.2% more here, one batch ahead fewer), most of those read ahead were used
    assert runs["true"]["store"]["disk_read_rows"] <= 1.01 * runs["false"]["store"]["disk_read_rows"]
    assert ahead["staged_used_rows"] > 0.5 * ahead["staged_rows"]
    assert runs["true"]["test_auc"] == runs["false"]["test_auc"]
    assert runs["true"]["prune"]["dim_hist"] == runs["false"]["prune"]["dim_hist"]
    a, _ = load_checkpoint(tmp_path / "false" / "checkpoints")
    b, _ = load_checkpoint(tmp_path / "true" / "checkpoints")
    emb = [k for k in a if k.startswith("emb/")]
    assert emb and all(torch.equal(a[k], b[k]) for k in emb)


@pytest.mark.parametrize("bad", ["store.admit_after=3", "store.max_rows=100", "store.ttl_steps=10"])
def test_row_level_store_policies_are_refused_with_pruning(bad: str) -> None:
    cfg = load_config(None, SMALL + ["store.enabled=true", "store.cache_size=4KiB", bad])
    with pytest.raises(ConfigError, match=bad.split("=")[0]):
        Components.build(cfg, ["C1"], n_dense=1)


def test_resume_with_store_and_pruning_gives_the_uninterrupted_weights(tmp_path: Path) -> None:
    over = SMALL + [
        "prune.every=3",
        "embedding.optimizer.kind=adam",  # 24-byte chunk records (weights and two moments)
        "store.enabled=true",
        "store.cache_size=144KiB",
        "store.host_size=24KiB",
        f"store.disk_path={tmp_path / 'disk'}",
    ]
    full = Trainer(load_config(None, over), tmp_path / "full").fit()
    Trainer(load_config(None, over + ["train.max_steps=6"]), tmp_path / "part").fit()  # stops at a pruning step
    resumed = Trainer(load_config(None, over), tmp_path / "part", resume=True).fit()
    a, _ = load_checkpoint(tmp_path / "full" / "checkpoints")
    b, _ = load_checkpoint(tmp_path / "part" / "checkpoints")
    emb = [k for k in a if k.startswith("emb/")]
    assert emb and a.keys() == b.keys()
    for k in emb:
        assert torch.equal(a[k], b[k]), k
    assert full["test_auc"] == resumed["test_auc"]
    assert full["store"]["rows_disk"] > 0 and full["store"]["disk_read_rows"] > 0  # checkpoints held chunks on disk
