"""Kernels compile once per install: after a run they are in numba's cache, and a cold cache is announced."""

from __future__ import annotations

import pytest

from tierec import warmup
from tierec.config import load_config
from tierec.train.trainer import Trainer


def test_a_run_leaves_the_kernels_cached(tmp_path) -> None:
    cfg = load_config(None, ["data.synthetic.train_rows=2048", "data.synthetic.test_rows=1024", "train.batch_size=1024",
                             "train.progress=false", "train.plots=false"])
    Trainer(cfg, tmp_path / "run", echo=lambda _: None).fit()
    assert warmup.kernels_cached()
    said: list[str] = []
    warmup.note_compilation(said.append)
    assert said == []


def test_a_cold_cache_is_announced_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(warmup, "kernels_cached", lambda: False)
    said: list[str] = []
    warmup.note_compilation(said.append)
    assert said == [warmup.NOTE]
