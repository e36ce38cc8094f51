"""benchmarks/hierarchical.py on a tiny run: DLRM with the dense hook on a 2x2 mesh equals the flat run."""

from __future__ import annotations

import pytest

from benchmarks.hierarchical import run_spawned, variants


def test_flat_and_2x2_gradients_agree_and_count_bytes() -> None:
    a = {"steps": 4, "warmup": 1, "batch": 256, "dim": 16, "cardinality_scale": 0.002, "test_rows": 1024}
    by_name = {v["name"]: v for v in variants([], ["none", "int8"])}
    flat = run_spawned(a, by_name["flat"])
    grad = run_spawned(a, by_name["2x2 gradients none"])
    int8 = run_spawned(a, by_name["2x2 gradients int8"])
    assert grad["auc"] == pytest.approx(flat["auc"], abs=1e-4)  # exact mode: the flat run's model
    assert 0 < int8["bytes_across"] < grad["bytes_across"] < flat["bytes_across"]
    assert flat["bytes_inside"] > 0 and grad["bytes_inside"] > 0
