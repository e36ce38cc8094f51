"""store.horizon: next uses from the ids of upcoming batches, as a plain search finds them; eviction by them
changes no number with fp32 cold rows, gives the same numbers on every path with compact ones, and reads
fewer rows from disk."""

from __future__ import annotations

import numpy as np
import pytest

from tierec.config import ConfigError, load_config
from tierec.embedding.table import TableConfig
from tierec.store.tiered_group import TieredGroup
from tierec.store.horizon import Horizon
from tierec.store.spec import Counter, TierSpec
from tierec.train.trainer import Trainer


def _plain_next_use(batches: list[np.ndarray], lid: int, step: int, length: int) -> int:
    """The first step in step + 1 .. step + length whose batch (batches[s - 1]) holds ``lid``; 0 if none."""
    for s in range(step + 1, min(step + length, len(batches)) + 1):
        if lid in batches[s - 1]:
            return s
    return 0


@pytest.mark.parametrize("length", [1, 3, 8])
def test_next_uses_are_those_of_a_plain_search_whenever_batches_were_foreseen(length: int) -> None:
    """Rows are made by the lookups (an id's first batch); a batch is foreseen at least ``length`` steps ahead,
    sometimes more, so some of its ids have no row yet when it is foreseen; rows are deleted now and then."""
    rng = np.random.default_rng(length)
    n_ids, steps = 300, 60
    batches = [np.unique(rng.zipf(1.3, size=400) % n_ids) for _ in range(steps)]  # over the 1024 entries held
    h = Horizon(length)
    made = np.zeros(n_ids, dtype=bool)  # the store's rows: lid = id
    foreseen = 0
    for step in range(steps):
        target = min(steps, step + length + int(rng.integers(0, 4)))
        while foreseen < target:
            b = batches[foreseen]
            h.foresee(b, np.zeros(b.size, dtype=np.int32), np.where(made[b], b, -1), step=step)
            foreseen += 1
        rows = np.flatnonzero(made)
        want = [_plain_next_use(batches, x, step, length) for x in rows]
        assert h.next_use(rows, step).tolist() == want, step
        if step % 7 == 6 and rows.size:  # a few rows deleted; their ids come back as new rows
            gone = rows[:3]
            h.forget(gone, gone, np.zeros(gone.size, dtype=np.int32))
            made[gone] = False
        h.advance(step + 1)  # lookup step + 1 looks up batches[step] and makes its new rows
        b = batches[step]
        new = b[~made[b]]
        made[new] = True
        h.resolve(new, np.zeros(new.size, dtype=np.int32), new, step + 1)
    assert not h.active


@pytest.mark.parametrize("exact", [True, False])
def test_a_row_made_after_its_uses_were_foreseen_counts_them_only_when_exact(exact: bool) -> None:
    h = Horizon(4, exact=exact)
    zero = np.zeros(1, dtype=np.int32)
    h.foresee(np.array([7]), zero, np.array([-1]), step=0)  # step 1: id 7 has no row yet
    h.foresee(np.array([7]), zero, np.array([-1]), step=0)  # step 2: nor here
    h.advance(1)
    h.resolve(np.array([7]), zero, np.array([3]), step=1)  # lookup 1 makes its row, lid 3
    assert h.next_use(np.array([3]), step=1).tolist() == ([2] if exact else [0])


def test_ranked_puts_rows_used_soon_above_all_and_clear_forgets_them() -> None:
    h = Horizon(4)
    zero = np.zeros(1, dtype=np.int32)
    h.foresee(np.array([2]), zero, np.array([2]), step=0)  # step 1
    h.foresee(np.array([0]), zero, np.array([0]), step=0)  # step 2
    score = np.array([5.0, 1.0, 9.0, 3.0])
    r = h.ranked(score, np.array([0, 1, 2, -1]), step=0)
    assert r[1] == 1.0 and r[3] == 3.0  # not foreseen: their counts
    assert r[2] > r[0] > score.max()  # used at step 1, then at step 2: both above every count
    h.clear()
    assert h.next_use(np.arange(3), step=0).tolist() == [0, 0, 0] and not h.active


DIM = 8
REC = 4 * (DIM + 1)


def _zipf_batches(seed: int, n: int, rows: int = 4000, size: int = 600) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.unique((rng.zipf(1.2, size=size) - 1) % rows).astype(np.int64) for _ in range(n)]


def _disk_reads(tmp_path, horizon: int, batches: list[np.ndarray], cold: str) -> int:
    spec = TierSpec(cache_bytes=500 * REC, host_bytes=400 * REC, disk_dir=str(tmp_path / f"{cold}{horizon}"),
                    cold_precision=cold, horizon=horizon)
    g = TieredGroup([TableConfig(name="t", dim=DIM, features=["f"])], spec, seed=0)
    zeros = [np.zeros(b.size, dtype=np.int32) for b in batches]
    for b, z in zip(batches[:horizon], zeros):
        g.foresee(b, z)
    for i, (b, z) in enumerate(zip(batches, zeros)):
        if horizon and i + horizon < len(batches):
            g.foresee(batches[i + horizon], zeros[i + horizon])
        g.lookup(b, z, insert=True)
    reads = int(g.counters[0, Counter.DISK_READ_ROWS])
    g.close()
    return reads


def test_the_fast_tier_s_copies_of_next_uses_inside_the_horizon_are_the_rows_next_uses(tmp_path) -> None:
    """What eviction reads instead of the horizon's array (FastTier.next_use): after every lookup, a slot's copy
    inside the horizon is its row's next use; the pipeline stopping (release_staged) forgets every copy."""
    batches = _zipf_batches(1, 80)
    spec = TierSpec(cache_bytes=500 * REC, host_bytes=400 * REC, disk_dir=str(tmp_path / "d"), horizon=12, interval=25)
    g = TieredGroup([TableConfig(name="t", dim=DIM, features=["f"])], spec, seed=0)
    zeros = [np.zeros(b.size, dtype=np.int32) for b in batches]
    for b, z in zip(batches[:12], zeros):
        g.foresee(b, z)
    inside_seen = 0
    for i, (b, z) in enumerate(zip(batches, zeros)):
        if i + 12 < len(batches):
            g.foresee(batches[i + 12], zeros[i + 12])
        g.lookup(b, z, insert=True)
        step = g.train_steps
        hint, lids = g.fast.next_use, g.fast.slot_lid
        inside = np.flatnonzero((hint > step) & (hint <= step + 12))
        assert (lids[inside] >= 0).all() and (hint[lids < 0] == 0).all()
        assert g.horizon.next_at[lids[inside]].tolist() == hint[inside].tolist(), i
        inside_seen += inside.size
    assert inside_seen > 1000
    g.release_staged()
    assert not g.fast.next_use.any()
    g.close()


@pytest.mark.parametrize("cold", ["fp32", "int8"])
def test_a_horizon_reads_fewer_rows_from_disk(tmp_path, cold: str) -> None:
    batches = _zipf_batches(0, 120)
    without, with_16 = _disk_reads(tmp_path, 0, batches, cold), _disk_reads(tmp_path, 16, batches, cold)
    assert 0 < with_16 < 0.95 * without


BASE = ["data.synthetic.train_rows=12288", "data.synthetic.test_rows=2048", "train.batch_size=1024", "train.progress=false",
        "train.plots=false", "train.epochs=2", "embedding.dim=8", "store.enabled=true", "store.cache_size=192KiB",
        "store.host_size=64KiB"]


def _fit(tmp_path, name: str, extra: list[str]) -> dict:
    cfg = load_config(None, BASE + extra + [f"store.disk_path={tmp_path / name / 'disk'}"])
    return Trainer(cfg, tmp_path / name, echo=lambda _: None).fit()


def test_a_horizon_changes_no_number_with_fp32_cold_rows(tmp_path) -> None:
    a = _fit(tmp_path, "off", ["store.horizon=0"])
    b = _fit(tmp_path, "on", ["store.horizon=6"])
    assert a["test_auc"] == b["test_auc"] and a["final_train_loss"] == b["final_train_loss"]
    assert b["store"]["pipeline"]["horizon"] == 6 and b["store"]["pipeline"]["foresee_s"] > 0
    assert b["store"]["disk_read_rows"] != a["store"]["disk_read_rows"]  # it moved other rows


def test_with_int8_cold_rows_every_path_gives_the_numbers_of_the_sequential_one(tmp_path) -> None:
    common = ["store.cold_precision=int8", "store.horizon=6"]
    # lookups ahead on a thread in both (with a lossy codec store.lookup_ahead sets the pinning rule of every
    # lookup, so it is part of the config, not of the path); the windows read ahead pull batches further
    a = _fit(tmp_path, "sequential", common + ["store.prefetch=false"])
    b = _fit(tmp_path, "ahead", common + ["store.prefetch=true", "store.prefetch_depth=3"])
    assert a["test_auc"] == b["test_auc"] and a["final_train_loss"] == b["final_train_loss"]
    assert a["store"]["disk_read_rows"] == b["store"]["disk_read_rows"]  # the same rows moved
    c = _fit(tmp_path, "none", ["store.cold_precision=int8", "store.horizon=0"])
    assert c["final_train_loss"] != a["final_train_loss"]  # rounding follows the rows that moved


def test_a_negative_horizon_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="store.horizon must be >= 0"):
        load_config(None, ["store.horizon=-1"])


def test_foresee_gives_the_lids_of_a_probe_under_the_lock_when_its_probe_beside_a_lookup_is_stale(tmp_path, monkeypatch) -> None:
    """``foresee`` probes beside a running lookup (``Directory.find_beside``), then under the store's lock again
    where that probe may be stale: the pairs it found no row for (a lookup may have made them since), and every
    pair where rows were deleted since. A stand-in for the probe beside, answering as if every pair had no row yet
    or (every other call) with wrong lids and a deletion count gone by, leaves the foreseen lids and the horizon's
    next uses those of a store that probes as usual, at every step."""
    batches = _zipf_batches(4, 40)
    zeros = [np.zeros(b.size, dtype=np.int32) for b in batches]

    def made(name: str) -> TieredGroup:
        spec = TierSpec(cache_bytes=500 * REC, host_bytes=400 * REC, disk_dir=str(tmp_path / name), horizon=6,
                        cold_precision="int8")
        return TieredGroup([TableConfig(name="t", dim=DIM, features=["f"])], spec, seed=0)

    plain, stale = made("plain"), made("stale")
    calls = []

    def beside(keys: np.ndarray, tabs: np.ndarray) -> tuple[np.ndarray, int]:
        calls.append(keys.size)
        if len(calls) % 2:
            return np.full(keys.size, -1, dtype=np.int64), stale.index.deletions
        return np.zeros(keys.size, dtype=np.int64), stale.index.deletions - 1

    def foresee(j: int) -> None:
        a, b = plain.foresee(batches[j], zeros[j]), stale.foresee(batches[j], zeros[j])
        assert a.lids.tolist() == b.lids.tolist() == plain.index.find(batches[j], zeros[j]).tolist(), j

    monkeypatch.setattr(stale.index, "find_beside", beside)
    for j in range(6):
        foresee(j)
    for i in range(len(batches)):
        if i + 6 < len(batches):
            foresee(i + 6)
        for g in (plain, stale):
            g.lookup(batches[i], zeros[i], insert=True)
        assert plain.horizon.next_at[: plain.index.high].tolist() == stale.horizon.next_at[: stale.index.high].tolist(), i
    assert len(calls) == len(batches) and int(plain.counters[0, Counter.DISK_READ_ROWS]) > 0
    assert int(plain.counters[0, Counter.DISK_READ_ROWS]) == int(stale.counters[0, Counter.DISK_READ_ROWS])
    plain.close()
    stale.close()
