"""`tierec tune` (issue 25): a study of training trials on the validation split, pruning, resume, the final run."""

from __future__ import annotations

import json
import sqlite3
import sys
import tomllib
from pathlib import Path

import pytest

from tierec.cli import main
from tierec.config import ConfigError, load_config, merged_dict
from tierec.tune.space import Choices, FloatRange, default_space, narrow, tune_config
from tierec.tune.study import TuneJob, Tuner, final_config, final_steps, trial_config, validation_config

TINY = ["data.synthetic.train_rows=3000", "data.synthetic.test_rows=1000", "data.synthetic.cardinality_scale=0.001",
        "train.batch_size=256", "model.bottom_mlp=[8]", "model.top_mlp=[8]", "tune.space.epochs=1",
        "tune.space.batch_size=256", "tune.space.dim=[4, 8]"]


def _sets(items: list[str]) -> list[str]:
    return [x for o in items for x in ("--set", o)]


def _trial_count(run: Path) -> int:
    with sqlite3.connect(run / "study.db") as db:
        return db.execute("select count(*) from trials where state in ('COMPLETE', 'PRUNED')").fetchone()[0]


def test_a_study_writes_the_best_config_the_final_run_and_resumes(tmp_path: Path, capsys) -> None:
    run = tmp_path / "tune"
    assert main(["tune", "--run-dir", str(run), "--trials", "3", "--no-progress", *_sets(TINY)]) == 0
    out = capsys.readouterr().out
    assert sum(line.startswith("trial ") for line in out.splitlines()) == 3  # a progress line per trial
    assert "validation AUC" in out and "test AUC" in out
    summary = json.loads((run / "tune_summary.json").read_text())
    assert summary["trials"] == 3 and 0.5 < summary["test_auc"] <= 1.0
    assert set(summary["best_params"]) == {"embedding_lr", "dense_lr", "dim", "dropout", "weight_decay", "epochs", "batch_size",
                                           "first_order_lr_scale", "model"}
    best = tomllib.loads((run / "best.toml").read_text())
    assert best["embedding"]["dim"] == summary["best_params"]["dim"]
    assert best["data"]["synthetic"]["validation_rows"] == 0  # trained on train + validation
    assert best["data"]["synthetic"]["train_rows"] == 4000
    assert (run / "trials.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    final = json.loads((run / "final" / "summary.json").read_text())
    assert final["test_auc"] == summary["test_auc"] and final["steps"] == summary["final_steps"]
    for n in range(3):  # a trial never evaluates test; its value is its best validation AUC
        trial = json.loads((run / "trials" / f"{n:04d}" / "summary.json").read_text())
        assert "test_auc" not in trial and trial["best_validation_auc"] > 0
    assert _trial_count(run) == 3

    assert main(["tune", "--run-dir", str(run), "--trials", "3", "--no-progress", *_sets(TINY)]) == 2  # not over it
    assert "--resume" in capsys.readouterr().err
    assert main(["tune", "--run-dir", str(run), "--trials", "4", "--resume", "--no-progress"]) == 0
    assert _trial_count(run) == 4  # the same study, continued to --trials
    assert json.loads((run / "tune_summary.json").read_text())["trials"] == 4


def test_a_pruned_trial_stops_at_its_first_evaluation(tmp_path: Path) -> None:
    optuna = pytest.importorskip("optuna")

    class PruneAfterFirst(optuna.pruners.BasePruner):  # trial 0 runs whole, every later one is pruned at once
        def prune(self, study, trial) -> bool:  # noqa: ANN001 - Optuna's
            return trial.number > 0

    data = merged_dict(None, TINY + ["tune.space.epochs=2"])
    tune = tune_config(data)
    cfg = load_config(None, [o for o in TINY if not o.startswith("tune.")])
    lines: list[str] = []
    summary = Tuner(TuneJob(cfg, tune, tmp_path / "tune", trials=2, pruner=PruneAfterFirst(), echo=lines.append)).run()
    assert (summary["complete"], summary["pruned"], summary["best_trial"]) == (1, 1, 0)
    assert " pruned " in lines[1] and " complete " in lines[0]
    steps = [json.loads((tmp_path / "tune" / "trials" / f"{n:04d}" / "summary.json").read_text())["steps"] for n in (0, 1)]
    # 3000 rows of 256: 12 steps an epoch, 2 epochs, a validation every 6 steps: the pruned one stopped at the first
    assert steps == [24, 6]


def test_a_missing_optuna_is_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "optuna", None)  # import optuna raises ImportError
    assert main(["tune", "--run-dir", str(tmp_path / "t"), "--trials", "1", *_sets(TINY)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pip install 'tierec[tune]'" in err
    assert not (tmp_path / "t").exists()


def test_the_space_by_data_size_and_its_narrowing(tmp_path: Path, capsys) -> None:
    cfg = load_config(None, [])
    assert default_space(cfg, 5_000_000).dim == Choices((16, 32, 64))
    lr = default_space(cfg, 100_000).embedding_lr
    assert lr == FloatRange(cfg.embedding.optimizer.lr / 10, cfg.embedding.optimizer.lr * 10, log=True)
    assert narrow(default_space(cfg, None), {"weight_decay": [1e-6, 1e-5]}).weight_decay.log
    with pytest.raises(ConfigError, match="low <= high"):
        narrow(default_space(cfg, None), {"dropout": [0.5, 0.1]})
    assert main(["tune", "--run-dir", str(tmp_path / "t"), *_sets(TINY + ["tune.space.dropout=[0.5, 0.1]"])]) == 2
    assert "low <= high" in capsys.readouterr().err


def test_timeout_stops_starting_trials_and_still_trains_the_best(tmp_path: Path, capsys) -> None:
    run = tmp_path / "tune"
    assert main(["tune", "--run-dir", str(run), "--trials", "50", "--timeout", "0.01", "--no-progress", *_sets(TINY)]) == 0
    out = capsys.readouterr().out
    assert sum(line.startswith("trial ") for line in out.splitlines()) == 1  # the running trial finishes, no other starts
    assert "--timeout 0.01 s reached: 1 of 50 trials finished" in out and "--resume" in out
    summary = json.loads((run / "tune_summary.json").read_text())
    assert summary["timed_out"] and summary["trials"] == 1 and 0.5 < summary["test_auc"] <= 1.0
    assert main(["tune", "--run-dir", str(tmp_path / "t2"), "--timeout", "-1", *_sets(TINY)]) == 2
    assert "--timeout must be >= 0" in capsys.readouterr().err


def test_the_final_run_stops_where_the_best_trial_peaked() -> None:
    # A trial's value is its best validation AUC, reached at its best step; the final run (train + validation)
    # trains to the same point of its epochs, not on past it (on the Criteo head: test AUC 0.7373 -> 0.7609).
    cfg = load_config(None, [o for o in TINY if not o.startswith("tune.")])
    trial = trial_config(validation_config(cfg), {"epochs": 2}, 2)
    final = final_config(trial)  # 3000 training rows of 256: 12 steps an epoch; with validation's 1000, 16
    assert final_steps(trial, final, best_step=6, steps=24) == 8
    assert final_steps(trial, final, best_step=18, steps=24) == 24
    assert final_steps(trial, final, best_step=24, steps=24) == 0  # peaked at the end: all the epochs
    assert final_steps(trial, final, best_step=None, steps=None) == 0  # a study from before best steps were kept


def test_trial_zero_is_the_size_chosen_config(tmp_path: Path) -> None:
    optuna = pytest.importorskip("optuna")
    data = merged_dict(None, TINY + ["tune.space.dropout=[0.1, 0.3]"])
    tune = tune_config(data)
    cfg = load_config(None, [o for o in TINY if not o.startswith("tune.")])
    lines: list[str] = []
    tuner = Tuner(TuneJob(cfg, tune, tmp_path / "tune", trials=5, echo=lines.append))
    tuner.run()
    study = optuna.load_study(study_name="tierec", storage=f"sqlite:///{tmp_path / 'tune' / 'study.db'}")
    first, second = study.trials[0], study.trials[4]
    lr, dense_lr = cfg.embedding.optimizer.lr, cfg.train.dense_lr
    # dim 4 or 8 searched (the config's 16 is outside: the nearest, 8); dropout 0 is outside [0.1, 0.3]: 0.1;
    # weight decay 0 is below the log range: its low end; epochs and batch size are fixed by TINY
    assert first.params == {"embedding_lr": lr, "dense_lr": dense_lr, "dim": 8, "dropout": 0.1, "weight_decay": 1e-8,
                            "first_order_lr_scale": cfg.model.first_order_lr_scale, "model": "dlrm"}
    # then the same point with each other model (the model is searched: TINY names none), then the sampler's
    assert [t.params for t in study.trials[1:4]] == [{**first.params, "model": m} for m in ("deepfm", "dcnv2", "widedeep")]
    assert all(t.user_attrs["defaults"] for t in study.trials[:4]) and "defaults" not in second.user_attrs
    assert all("(the defaults)" in line for line in lines[:4]) and "(the defaults)" not in lines[4]
    assert second.params != first.params  # the sampler's own point after it


def test_the_model_is_searched_unless_the_config_names_one(tmp_path: Path) -> None:
    cfg = load_config(None, [])
    assert default_space(cfg, 100_000).model == Choices(("dlrm", "deepfm", "dcnv2", "widedeep"), names=True)  # the config's first
    assert tune_config(merged_dict(None, ["train.epochs=2"])).space == {}
    named = tune_config(merged_dict(None, ["model.name=dcnv2"]))
    assert narrow(default_space(cfg, None), named.space).model == Choices(("dcnv2",), names=True)
    given = tune_config(merged_dict(None, ["model.name=dcnv2", 'tune.space.model=["dlrm", "deepfm"]']))
    assert given.space == {"model": ["dlrm", "deepfm"]}  # [tune.space] wins over the named model
    off = load_config(None, ["model.first_order=off"])  # DeepFM and Wide&Deep cannot run without first-order terms
    assert default_space(off, None).model == Choices(("dlrm", "dcnv2"), names=True)
    with pytest.raises(ConfigError, match="model choices must be some of"):
        narrow(default_space(cfg, None), {"model": ["dlrm", "xgboost"]})
    with pytest.raises(ConfigError, match="tune.space.dim must be a number"):
        narrow(default_space(cfg, None), {"dim": "deepfm"})

    # each trial trains the model it drew; the best config and the final run are the best trial's model
    run = tmp_path / "tune"
    models = 'tune.space.model=["deepfm", "widedeep"]'
    assert main(["tune", "--run-dir", str(run), "--trials", "3", "--no-progress", *_sets(TINY + [models])]) == 0
    summary = json.loads((run / "tune_summary.json").read_text())
    drawn = [tomllib.loads((run / "trials" / f"{n:04d}" / "config.toml").read_text())["model"]["name"] for n in range(3)]
    assert drawn[0] == "deepfm" and set(drawn) <= {"deepfm", "widedeep"}  # trial 0: the config's dlrm is outside: the first
    assert tomllib.loads((run / "best.toml").read_text())["model"]["name"] == summary["best_params"]["model"]
    assert tomllib.loads((run / "final" / "config.toml").read_text())["model"]["name"] == summary["best_params"]["model"]
    assert tomllib.loads((run / "tune.toml").read_text())["tune"]["space"]["model"] == ["deepfm", "widedeep"]
    assert main(["tune", "--run-dir", str(run), "--trials", "4", "--resume", "--no-progress"]) == 0  # keeps its space
    fourth = tomllib.loads((run / "trials" / "0003" / "config.toml").read_text())
    assert fourth["model"]["name"] in ("deepfm", "widedeep")
