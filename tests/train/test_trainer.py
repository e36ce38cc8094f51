"""End-to-end training: metrics files, exact resume, eval/predict, the CLI's error handling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tierec.cli import main
from tierec.config import load_config
from tierec.train.checkpoint import load_checkpoint
from tierec.train.trainer import Trainer
from tierec.version import tierec_version

SMALL = [
    "data.synthetic.train_rows=6144",
    "data.synthetic.test_rows=2048",
    "data.synthetic.cardinality_scale=0.001",
    "train.batch_size=512",
    "train.progress=false",
    "embedding.dim=8",
]


def _final_tensors(run_dir: Path) -> dict[str, torch.Tensor]:
    tensors, _ = load_checkpoint(run_dir / "checkpoints")
    return tensors


@pytest.mark.parametrize("model", ["dlrm", "deepfm"])
def test_resume_gives_the_uninterrupted_weights(tmp_path: Path, model: str) -> None:
    over = SMALL + [f"model.name={model}", "model.dropout=0.1", "embedding.optimizer.kind=adam"]
    full = Trainer(load_config(None, over), tmp_path / "full").fit()
    # stop after 5 of 12 steps (checkpoint at 5), then resume to the end
    Trainer(load_config(None, over + ["train.max_steps=5"]), tmp_path / "part").fit()
    resumed = Trainer(load_config(None, over), tmp_path / "part", resume=True).fit()
    assert full["steps"] == resumed["steps"] == 12
    a, b = _final_tensors(tmp_path / "full"), _final_tensors(tmp_path / "part")
    assert a.keys() == b.keys()
    for k in a:
        if k.startswith("rng."):
            continue
        assert torch.equal(a[k], b[k]), k
    assert full["test_auc"] == resumed["test_auc"]


def test_look_ahead_trains_exactly_like_the_sequential_step(tmp_path: Path) -> None:
    """train.look_ahead (the next batch's dedupe and probe on a thread during this step) changes no number."""
    over = SMALL + ["model.name=widedeep", "train.eval_every=5"]  # a wide collection beside it, evaluations between steps
    ahead = Trainer(load_config(None, over + ["train.look_ahead=true"]), tmp_path / "ahead").fit()
    plain = Trainer(load_config(None, over + ["train.look_ahead=false"]), tmp_path / "plain").fit()
    a, b = _final_tensors(tmp_path / "ahead"), _final_tensors(tmp_path / "plain")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert ahead["test_auc"] == plain["test_auc"] and ahead["steps"] == plain["steps"] == 12


def test_run_directory_contents(tmp_path: Path) -> None:
    over = SMALL + ["train.eval_every=4", "train.checkpoint_every=6"]
    summary = Trainer(load_config(None, over), tmp_path).fit()
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    kinds = [r["kind"] for r in records]
    splits = [r["split"] for r in records if r["kind"] == "eval"]
    assert splits == ["validation"] * 3 + ["test"] and kinds[-1] == "final"  # validation at steps 4, 8, 12; test at the end
    assert (tmp_path / "config.toml").is_file()
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == summary["steps"] == 12
    assert summary["tierec_version"] == tierec_version()  # every run says which tierec wrote it
    assert 0.5 < summary["test_auc"] <= 1.0 and summary["planted_auc"] > 0.5
    assert summary["embedding_rows"] > 0 and summary["peak_memory_bytes"] > 0


def test_cli_train_eval_predict(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    args = ["train", "--run-dir", str(run), "--no-progress"]
    for o in SMALL:
        args += ["--set", o]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "test AUC" in out and "peak memory" in out
    summary = json.loads((run / "summary.json").read_text())
    assert main(["eval", str(run / "checkpoints")]) == 0
    evaluated = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert evaluated["auc"] == pytest.approx(summary["test_auc"], abs=1e-9)
    scores = tmp_path / "scores.csv"
    assert main(["predict", str(run / "checkpoints"), "--split", "test", "--out", str(scores)]) == 0
    lines = scores.read_text().split()
    assert lines[0].replace('"', "") == "row,score,label"
    values = [float(x.split(",")[1]) for x in lines[1:]]
    assert len(values) == 2048 and all(0.0 < v < 1.0 for v in values)


def test_cli_errors_are_one_line(tmp_path: Path, capsys) -> None:
    assert main(["train", "--set", "train.bogus=1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "train.bogus" in err
    assert main(["train", "--set", f"data.source={tmp_path / 'missing.csv'}", "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing.csv" in err
    assert main(["eval", str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    # a fast tier too small for one batch's rows: what to raise, in one line
    tiny = ["--set", "store.enabled=true", "--set", "store.cache_size=1KiB", "--set", f"store.disk_path={tmp_path / 'disk'}"]
    assert main(["train", "--run-dir", str(tmp_path / "t"), *[x for o in SMALL for x in ("--set", o)], *tiny]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "store.cache_size" in err


def test_every_command_has_help(capsys) -> None:
    for cmd in (["--help"], ["train", "--help"], ["eval", "--help"], ["predict", "--help"], ["preprocess", "--help"]):
        with pytest.raises(SystemExit) as e:
            main(cmd)
        assert e.value.code == 0
        assert "usage:" in capsys.readouterr().out


def test_cli_openmp_wait_policy() -> None:
    # Unset -> PASSIVE; "default" (any case) -> removed, so OpenMP's own default applies;
    # anything else is the user's and stands.
    from tierec.cli import apply_omp_wait_policy

    env: dict[str, str] = {}
    apply_omp_wait_policy(env)
    assert env == {"OMP_WAIT_POLICY": "PASSIVE"}
    env = {"OMP_WAIT_POLICY": "Default"}
    apply_omp_wait_policy(env)
    assert env == {}
    env = {"OMP_WAIT_POLICY": "ACTIVE"}
    apply_omp_wait_policy(env)
    assert env == {"OMP_WAIT_POLICY": "ACTIVE"}


@pytest.mark.parametrize("given, spins", [(None, "0"), ("default", "300000"), ("ACTIVE", "30000000000")])
def test_the_command_line_sets_the_wait_policy_before_openmp_starts(given, spins) -> None:
    # OpenMP reads OMP_WAIT_POLICY once, when torch loads it: the command line must choose before any torch
    # import (tierec.cli imports none). GNU OpenMP shows what it took as its spin count: 0 for PASSIVE, its
    # default otherwise, and "default" is no value it knows (it would warn of an invalid value).
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["OMP_DISPLAY_ENV"] = "VERBOSE"
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    done = subprocess.run([sys.executable, "-c", "import sys, tierec.cli; assert 'torch' not in sys.modules; "
                           "tierec.cli.main(['train', '--help'])"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    shown = [line for line in done.stderr.splitlines() if "GOMP_SPINCOUNT" in line]
    if not shown:
        pytest.skip("torch's OpenMP is not GNU OpenMP: nothing shows its wait policy")
    assert shown[0].split("=")[1].strip().strip("'") == spins
    assert "Invalid value" not in done.stderr


@pytest.mark.parametrize("every", [4, 5])
def test_a_last_step_that_checkpointed_is_not_saved_again(tmp_path: Path, every: int,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """12 steps: a checkpoint every 4 saves steps 4, 8 and 12 once each (the end, after the test evaluation,
    does not save step 12 again); every 5, the end saves step 12."""
    import tierec.train.trainer as trainer_module

    saved: list[int] = []
    real = trainer_module.save_checkpoint

    def counted(ckpt_dir, step, *args, **kwargs):
        saved.append(step)
        return real(ckpt_dir, step, *args, **kwargs)

    monkeypatch.setattr(trainer_module, "save_checkpoint", counted)
    out = Trainer(load_config(None, SMALL + [f"train.checkpoint_every={every}"]), tmp_path / "run").fit()
    assert out["steps"] == 12
    assert saved == ([4, 8, 12] if every == 4 else [5, 10, 12])
    _, meta = load_checkpoint(tmp_path / "run" / "checkpoints")
    assert meta["position"]["step"] == 12
