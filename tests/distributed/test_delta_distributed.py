"""Delta checkpoints on 2 processes: every rank publishes its own changed rows, and a full checkpoint plus
its deltas restores on every rank bitwise the state of a full checkpoint at the last delta's step, on 2
processes and on 1 (a checkpoint of any world size restores on any other, deltas included)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from delta_workers import restored_worker
from dist_workers import SMALL, train_worker
from tierec.distributed.launch import spawn
from tierec.train.checkpoint import Checkpoint

TIERED = ["store.enabled=true", "store.memory_budget=96KiB", "store.cache_size=48KiB", "store.host_size=0",
          "store.interval=3", "store.ttl_steps=2", "data.synthetic.cardinality_scale=0.01"]  # rows expire: the deltas carry deleted ids


def _restored(over: list[str], run_dir: Path, full: str, out: Path, nproc: int) -> list[dict[str, torch.Tensor]]:
    out.mkdir()
    spawn(restored_worker, nproc, (over, str(run_dir), full, str(out)))
    return [torch.load(out / f"rank{r}.pt") for r in range(nproc)]


HOT = ["model.name=deepfm", "dist.hot_rows=64", "dist.hot_refresh_every=3", "dist.hot_min_share=0.01"]  # replicas
# dims, importance and claims change at every pruning step (3, 6, 9); rows at dim 0 are evicted (deleted in a delta)
PRUNED = ["prune.enabled=true", "prune.chunk=4", "prune.every=3", "prune.target_ratio=2", "prune.min_dim=0"]


@pytest.mark.parametrize("storage", ["plain", "tiered", "hot", "pruned", "tiered+pruned"])
def test_two_process_full_plus_deltas_is_the_full_checkpoint(tmp_path: Path, storage: str) -> None:
    tiered = storage.startswith("tiered")
    over = SMALL + ["train.eval_every=0", "train.max_steps=9"] + {"hot": HOT, "pruned": PRUNED, "tiered+pruned": PRUNED}.get(storage, [])
    if tiered:  # with pruning the tiers hold chunks: no time-to-live (pruning deletes rows at dim 0 instead)
        over += [o for o in TIERED if not (storage == "tiered+pruned" and o.startswith("store.ttl_steps"))]
        over += [f"store.disk_path={tmp_path / 'disk'}"]
    # step 2 (full: no base yet), 4 (delta of 2), 5 (full), 6, 8 (deltas of 5), 9 (the end: full)
    spawn(train_worker, 2, (over + ["train.checkpoint_every=5", "train.delta_every=2"], str(tmp_path / "d"), False))
    ckpts = tmp_path / "d" / "checkpoints"
    names = sorted(p.name for p in ckpts.iterdir() if p.name.startswith(("step_", "delta_")))
    assert names == ["delta_00000006_of_00000005", "delta_00000008_of_00000005", "step_00000005", "step_00000009"]
    with Checkpoint(ckpts / "delta_00000008_of_00000005") as delta:
        assert delta.world_size == 2 and delta.meta["delta"] == {"base": 5, "previous": 6}
        assert {f[:11] for f in delta.row_files} == {"rows-00000-", "rows-00001-"}  # each rank's changed rows
    if storage in ("tiered", "pruned", "tiered+pruned"):  # rows expired (store.ttl_steps) or evicted at dim 0: a delta names them,
        deleted = []  # in the part of the rank that held them
        for name in names[:2]:
            with Checkpoint(ckpts / name) as delta:
                deleted += [k for r in range(2) for k, v in delta.state(r).items() if k.startswith("deleted/") and v.numel()]
        assert deleted

    spawn(train_worker, 2, (over + ["train.checkpoint_every=8"], str(tmp_path / "r"), False))
    for nproc in (2, 1):  # the same job's checkpoints restored on 2 processes, then on 1
        ref = _restored(over, tmp_path / "r", "step_00000008", tmp_path / f"ref_state{nproc}", nproc)
        got = _restored(over, tmp_path / "d", "step_00000005", tmp_path / f"delta_state{nproc}", nproc)
        if storage.endswith("pruned"):  # rows really at other dims: their values are compared at their own dims
            dims = [v for k, v in ref[0].items() if k.endswith(".dims")]
            assert any(k.endswith(".chunked.weights") for k in ref[0]) and any(int(d.min()) < 8 for d in dims)
        for r, (a, b) in enumerate(zip(ref, got)):
            assert a.keys() == b.keys(), (nproc, r)
            assert int(a["position"][0]) == 8
            for k in a:
                if k.endswith(".store.freq"):  # cold tiers' quantised access counts, decayed on restore (as on 1 process)
                    assert bool(torch.isclose(a[k], b[k], rtol=0.15).all()), (nproc, r, k)
                else:
                    assert torch.equal(a[k], b[k]), (nproc, r, k)


def test_a_mesh_of_groups_is_refused_in_one_line(tmp_path: Path) -> None:
    over = SMALL + ["train.max_steps=2", "train.delta_every=1", "dist.group_size=1"]  # 2 groups of 1 rank
    codes = spawn(train_worker, 2, (over, str(tmp_path / "run"), False), check=False, log_dir=tmp_path)
    assert all(codes)
    log = (tmp_path / "rank0.log").read_text()
    assert "train.delta_every does not run on a mesh of groups yet; set dist.group_size = 0" in log


def test_one_process_deltas_restore_on_two(tmp_path: Path) -> None:
    """The other way: a pruned run's full checkpoint + deltas saved on 1 process, restored on 2, is bitwise the
    full checkpoint at the last delta's step restored on 2 (each rank keeps the rows it owns)."""
    over = SMALL + ["train.eval_every=0", "train.max_steps=9"] + PRUNED
    spawn(train_worker, 1, (over + ["train.checkpoint_every=5", "train.delta_every=2"], str(tmp_path / "d"), False))
    spawn(train_worker, 1, (over + ["train.checkpoint_every=8"], str(tmp_path / "r"), False))
    with Checkpoint(tmp_path / "d" / "checkpoints" / "delta_00000008_of_00000005") as delta:
        assert delta.world_size == 1
    ref = _restored(over, tmp_path / "r", "step_00000008", tmp_path / "ref_state", 2)
    got = _restored(over, tmp_path / "d", "step_00000005", tmp_path / "delta_state", 2)
    assert all(any(k.endswith(".ids") and v.numel() for k, v in part.items()) for part in ref)  # both ranks hold rows
    for r, (a, b) in enumerate(zip(ref, got)):
        assert a.keys() == b.keys() and int(a["position"][0]) == 8, r
        for k in a:
            assert torch.equal(a[k], b[k]), (r, k)
