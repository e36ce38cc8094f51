"""The benchmark suite runs end to end on tiny sizes, and reports missing peers instead of skipping them."""

from __future__ import annotations

import json

import pytest

from benchmarks import systems
from benchmarks.run import main

TINY = ["--tables", "3", "--rows", "200", "--dim", "4", "--batch", "32", "--steps", "2", "--repeats", "2", "--quiet"]


def test_run_all_tiny(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["--which", "all", *TINY, "--test-batches", "2", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert set(res["results"]) == {"engine", "e2e", "memory"}
    engine = {r["system"]: r for r in res["results"]["engine"]["rows"]}
    assert set(engine) == set(systems.ENGINE_SYSTEMS)
    for r in engine.values():
        assert r["status"] in {"ok", "missing"}
        if r["status"] == "ok":
            assert r["samples_per_s"] > 0 and len(r["times_s"]) == 2
    assert engine["tierec"]["status"] == "ok" and engine["tierec"]["tierec_speedup"] == 1.0
    e2e = {r["system"]: r for r in res["results"]["e2e"]["rows"]}
    assert 0.0 <= e2e["tierec"]["test_auc"] <= 1.0
    mem = {r["system"]: r for r in res["results"]["memory"]["rows"]}
    assert mem["tierec"]["bytes_per_resident_row"] > (4 + 1) * 4
    assert "| tierec |" in res["markdown"]
    assert capsys.readouterr().out == ""  # --quiet


def test_missing_peer_is_reported(monkeypatch, capsys):
    def unavailable(w):
        raise systems.PeerMissing("ModuleNotFoundError: No module named 'fbgemm_gpu'")

    monkeypatch.setattr(systems, "fbgemm_tbe", unavailable)
    assert main(["--which", "engine", *TINY[:-1], "--systems", "tierec,fbgemm"]) == 0
    text = capsys.readouterr().out
    assert "| fbgemm | missing |" in text and "No module named 'fbgemm_gpu'" in text


def test_profile_tiny():
    assert main(["--which", "profile", *TINY]) == 0


def test_e2e_on_tierec_data(tmp_path):
    import pytest

    pytest.importorskip("tierec.data")
    out = tmp_path / "e2e.json"
    argv = ["--which", "e2e", "--tables", "26", "--rows", "500", "--dim", "4", "--batch", "32", "--steps", "2",
            "--repeats", "1", "--test-batches", "1", "--data", "tierec", "--systems", "tierec,torch", "--quiet"]
    assert main([*argv, "--out", str(out)]) == 0
    res = json.loads(out.read_text())["results"]["e2e"]
    assert res["data"] == "tierec" and {r["system"] for r in res["rows"]} == {"tierec", "torch"}


def test_fused_backward_benchmark_tiny():
    from benchmarks.fused_backward import main as fused_main

    assert fused_main(["--rows", "1000", "--tables", "2", "--batch", "64", "--steps", "2", "--repeats", "2", "--quiet"]) > 0


def test_e2e_with_elementwise_adagrad(tmp_path, capsys):
    # Every system runs element-wise Adagrad; TorchRec cannot fuse it and says so instead of
    # silently running another optimizer; the engine run refuses the option.
    from benchmarks.e2e import TierecTrainer, TorchTrainer
    from benchmarks.workload import Workload
    from tierec.config import OptimizerKind

    w = Workload(tables=2, rows=50, dim=4, batch=8, steps=1, optimizer="adagrad")
    assert {g.optimizer.kind for g in TierecTrainer(w).coll.groups} == {OptimizerKind.ADAGRAD}
    assert type(TorchTrainer(w).sparse_opt).__name__ == "Adagrad"
    out = tmp_path / "e2e.json"
    assert main(["--which", "e2e", *TINY, "--test-batches", "1", "--optimizer", "adagrad", "--out", str(out)]) == 0
    rows = {r["system"]: r for r in json.loads(out.read_text())["results"]["e2e"]["rows"]}
    assert rows["tierec"]["status"] == "ok" and rows["torch"]["status"] == "ok"
    assert rows["torchrec"]["status"] == "missing"
    assert main(["--which", "engine", *TINY, "--optimizer", "adagrad"]) == 2
    assert "is for --which e2e" in capsys.readouterr().err


def test_dense_interaction_benchmark_tiny():
    from benchmarks.dense_interaction import main as dense_main

    assert dense_main(["--batch", "32", "--tables", "3", "--dim", "4", "--steps", "1", "--repeats", "2", "--quiet"]) > 0


def test_popularity_rank_inverts_the_tables_permutation():
    import numpy as np

    from benchmarks.workload import Workload, ZipfSampler, popularity_rank, table_ids

    w = Workload(tables=3, rows=1000, dim=4, batch=8, zipf=1.1, seed=5)
    sampler = ZipfSampler(w.rows, w.zipf)
    for t in range(w.tables):
        ranks = sampler(np.random.default_rng(t), 500)
        ids = table_ids(w, np.random.default_rng(t), sampler, t, 500)  # the same draws, permuted
        assert np.array_equal(popularity_rank(w, t, ids), ranks)
        assert not np.array_equal(ids, ranks)


@pytest.mark.parametrize("how", [{"threads": 2}, {"threads": 1, "aio": 8}])
def test_disk_rate_reads_by_threads_and_by_native_aio(tmp_path, how):
    """Both ways of reading the device run and count: blocking preads on threads, and native AIO (which the
    benchmark refuses in one line where the kernel does)."""
    from benchmarks.disk_rate import run

    try:
        res = run(str(tmp_path), 4 << 20, 4096, seconds=0.2, **how)
    except SystemExit as e:
        assert "refuses native AIO" in str(e)
        pytest.skip(str(e))
    assert res["reads_per_s"] > 0 and res["cpu_us_per_read"] > 0 and res.get("aio_depth", 0) == how.get("aio", 0)
