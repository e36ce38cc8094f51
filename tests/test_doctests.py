"""The runnable examples in module docstrings: every listed module has some, and they pass."""

from __future__ import annotations

import doctest
import importlib
import tempfile
from pathlib import Path

import pytest

DATA = [
    "tierec.data", "tierec.data.blocks", "tierec.data.columns", "tierec.data.errors", "tierec.data.hashing",
    "tierec.data.kernels", "tierec.data.loader", "tierec.data.parquet", "tierec.data.planted", "tierec.data.schema",
    "tierec.data.preprocess", "tierec.data.shards", "tierec.data.source", "tierec.data.synth_kernels", "tierec.data.synthetic", "tierec.data.text",
    "tierec.data.interactions", "tierec.data.negatives", "tierec.data.implicit", "tierec.data.inspect_implicit", "tierec.data.inspect_names",
    "tierec.data.follow",
]  # fmt: skip
EMBEDDING = ["tierec.embedding.ahead", "tierec.embedding.arena", "tierec.embedding.collection", "tierec.embedding.group", "tierec.embedding.hash_index"]
STORE = [
    "tierec.store", "tierec.store.sizes", "tierec.store.spec", "tierec.store.directory", "tierec.store.host",
    "tierec.store.disk", "tierec.store.codec", "tierec.store.hotness", "tierec.store.tiered_group", "tierec.store.moves", "tierec.store.fast_tier", "tierec.store.admission", "tierec.store.eviction", "tierec.store.demotion", "tierec.store.plan", "tierec.store.pipeline", "tierec.store.staging",
    "tierec.store.monitor", "benchmarks.tiers_sim", "benchmarks.tiers_memory", "benchmarks.tiers", "benchmarks.disk_layout",
]  # fmt: skip

CORE = ["tierec.errors", "tierec.train.stopping", "tierec.device", "tierec.batch", "tierec.paths", "tierec.train.runfiles",
        "tierec.train.readlock", "tierec.train.integrity", "tierec.train.memory",
        "tierec.train.preflight", "tierec.models.scaling", "tierec.train.dense_stats", "tierec.version",
        "tierec.warmup", "tierec.config_reference", "tierec.data_config", "tierec.data.row_filter", "tierec.tune.space", "tierec.train.passes"]
SERVING = [
    "tierec.serving", "tierec.serving.manifest", "tierec.serving.rows", "tierec.serving.table_file", "tierec.serving.sorted_runs",
    "tierec.serving.inputs", "tierec.serving.program", "tierec.serving.publish", "tierec.serving.tables",
    "tierec.serving.export", "tierec.serving.scorer", "tierec.serving.server", "tierec.serving.overlay",
    "tierec.serving.follow",
]  # fmt: skip

DISTRIBUTED = ["tierec.distributed.backends", "tierec.distributed.layout", "tierec.distributed.reducers",
               "tierec.distributed.group_shard", "tierec.distributed.sharded", "tierec.distributed.hot",
               "tierec.distributed.hierarchical", "tierec.distributed.job", "tierec.distributed.exchange",
               "tierec.distributed.row_copy"]


LISTED = DATA + EMBEDDING + STORE + CORE + SERVING + DISTRIBUTED
ROOT = Path(__file__).resolve().parents[1]


def _modules_with_examples() -> list[str]:
    """Every module of tierec and benchmarks whose source holds a docstring example (``>>> ``)."""
    out = []
    for path in sorted([*(ROOT / "tierec").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]):
        if ">>> " in path.read_text(encoding="utf-8"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


@pytest.fixture(autouse=True)
def _temp_in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The examples' ``tempfile.mkdtemp()`` directories go under pytest's own (pruned) temp directory, not /tmp."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


@pytest.mark.parametrize("name", LISTED)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


@pytest.mark.parametrize("name", [m for m in _modules_with_examples() if m not in LISTED])
def test_every_other_module_s_examples(name: str) -> None:
    """The modules not listed above: their examples pass too (a module added later is checked without a list)."""
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
