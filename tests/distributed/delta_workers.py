"""What the 2-process delta checkpoint tests run on every spawned rank (importable by name)."""

from __future__ import annotations

from pathlib import Path

import torch

from tierec.distributed import DistContext


def restored_worker(ctx: DistContext, overrides: list[str], run_dir: str, full: str, out: str) -> None:
    """Restore checkpoint ``full`` of ``run_dir`` (and its deltas) on this rank; save what the rank holds:
    dense state, counters, position and its rows in id order (a pruned row's values at its own dims), as
    ``out/rank{r}.pt``."""
    from tierec.config import load_config
    from tierec.data import open_dataset
    from tierec.train.state import row_chunks, snapshot_state
    from tierec.train.trainer import Trainer

    cfg = load_config(None, overrides)
    trainer = Trainer(cfg, run_dir, ctx=ctx)
    parts = trainer._build(open_dataset(cfg.data).source("train", cfg.train.batch_size))
    meta = trainer._restore_with_deltas(parts, Path(run_dir) / "checkpoints" / full)
    tensors, _ = snapshot_state(parts)
    # a restore's own I/O adds to the tiers' disk/host counters (columns 9-12): compared are the training's
    state = {k: v[:9] if k.endswith("store.counters") else v for k, v in tensors.items() if "store.clock" not in k}
    state["position"] = torch.tensor([meta["position"][k] for k in ("step", "epoch", "batch_in_epoch")])
    rows: dict[str, list[dict[str, torch.Tensor]]] = {}
    for label, records in row_chunks(parts):
        rows.setdefault(label, []).append(records)
    for label, chunks in rows.items():
        order = torch.argsort(torch.cat([c["ids"] for c in chunks]))
        for key in chunks[0]:
            if key != "store.slot":
                state[f"{label}.{key}"] = _by_id(torch.cat([c[key] for c in chunks]), order, chunks, key)
    torch.save(state, Path(out) / f"rank{ctx.rank}.pt")


def _by_id(values: torch.Tensor, order: torch.Tensor, chunks: list[dict[str, torch.Tensor]], key: str) -> torch.Tensor:
    """A record field in id order; a pruned row's ``chunked.*`` values (its own dims' worth) move with it."""
    if not key.startswith("chunked."):
        return values[order]
    dims = torch.cat([c["dims"] for c in chunks]).long()
    parts = torch.split(values, (dims * values.numel() // max(int(dims.sum()), 1)).tolist())
    return torch.cat([parts[i] for i in order.tolist()]) if parts else values
