"""`tierec tune`: an Optuna study of `tierec train` runs on the validation split, then the best one on train + validation.

Run directory (claimed like a training run's; every file written through RunFiles):

- ``study.db``: the study (SQLite; ``--resume`` continues it). With ``storage`` (an RDB URL) the study lives
  there instead, and processes on several machines add trials to the same study.
- ``config.toml`` (the base config), ``tune.toml`` (the ``[tune]`` settings and the space searched);
- ``trials/NNNN/``: each trial's run directory (its ``train.log``, metrics and checkpoints);
- ``best.toml``: the best trial's config, trained on train + validation (no validation split, no periodic
  evaluations) up to the point of its epochs where the trial's validation AUC peaked (``train.max_steps``;
  all its epochs when it peaked at the end), for ``tierec train --config best.toml``;
- ``final/``: that run (``tierec eval DIR/final``); ``trials.png``: the trials' validation AUC, best so far;
- ``tune_summary.json``: the trials, the best one's parameters and validation AUC, and the final test AUC.

Trial 0 of a new study is the config ``tierec train`` would run (the size-chosen defaults, moved inside a
narrowed space where they lie outside it); when the model is searched, the next trials are that config with each
other model. Each trial trains ``evals_per_epoch`` validations per epoch and reports each AUC to the pruner (a
MedianPruner by default); a pruned trial stops at that evaluation. Its value is its best validation AUC.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tomli_w import dumps as dump_toml

from tierec.config import Config, ConfigError, flatten_dict, to_dict, with_values
from tierec.train.evaluate import has_validation, with_validation
from tierec.train.rundir import claim_run_dir
from tierec.train.runfiles import RunFiles
from tierec.train.sizing import estimate_train_rows
from tierec.train.stopping import TrainingDiverged
from tierec.train.trainer import Trainer
from tierec.tune.space import KEYS, SearchSpace, TuneConfig, default_space, narrow

STUDY_NAME = "tierec"
STUDY_FILE = "study.db"
HEARTBEAT_S = 30  # a trial whose process died is marked failed after a few missed beats (resume, shared studies)


def require_optuna() -> Any:
    """The optuna module, or a one-line ConfigError naming the extra that installs it."""
    try:
        import optuna
    except ImportError:
        raise ConfigError("tierec tune needs Optuna: pip install 'tierec[tune]' (or pip install 'optuna>=3.6')") from None
    return optuna


@dataclass
class TuneJob:
    """One `tierec tune` invocation."""

    cfg: Config  # the base config (size-chosen defaults applied)
    tune: TuneConfig
    run_dir: Path
    trials: int = 20  # the study's total of finished (complete or pruned) trials
    resume: bool = False
    storage: str = ""  # an RDB URL; "" = sqlite:///RUN_DIR/study.db
    timeout: float = 0.0  # seconds after which no new trial starts (the running one finishes); 0 = none
    echo: Callable[[str], None] = print
    pruner: Any = None  # an optuna pruner (default: MedianPruner from the [tune] settings)


def train_rows(cfg: Config) -> int | None:
    """About how many training rows the data has (None: unknown, e.g. shard directories)."""
    if cfg.data.source == "synthetic" or cfg.data.format == "synthetic":
        return cfg.data.synthetic.train_rows
    return estimate_train_rows(cfg)


def validation_config(cfg: Config) -> Config:
    """``cfg`` with a validation split: its own, or 10 % of a file, or synthetic rows as many as test's."""
    evaluating = dataclasses.replace(cfg.train, eval_every=max(cfg.train.eval_every, 1))
    cfg = dataclasses.replace(with_validation(dataclasses.replace(cfg, train=evaluating)), train=cfg.train)
    if not has_validation(cfg.data):
        raise ConfigError(f"tierec tune needs a validation split and {cfg.data.source} has none (shards keep the splits "
                          "they were written with: preprocess with data.validation_fraction set)")
    return cfg


def final_config(cfg: Config) -> Config:
    """``cfg`` trained on train + validation: no validation split, no periodic evaluations (test once at the end)."""
    train = dataclasses.replace(cfg.train, eval_every=0, early_stop_patience=0)
    synthetic = cfg.data.synthetic
    if synthetic.validation_rows:
        synthetic = dataclasses.replace(synthetic, train_rows=synthetic.train_rows + synthetic.validation_rows, validation_rows=0)
    data = dataclasses.replace(cfg.data, validation_rows=0, validation_fraction=0.0, synthetic=synthetic)
    return dataclasses.replace(cfg, data=data, train=train)


def steps_per_epoch(cfg: Config) -> int | None:
    """About how many steps one epoch of ``cfg``'s training split takes (None: unknown)."""
    rows = train_rows(cfg)
    if rows is None:  # shards: their manifest knows
        from tierec.data import open_dataset

        return open_dataset(cfg.data).source("train", cfg.train.batch_size).num_batches
    return math.ceil(rows / cfg.train.batch_size)


def trial_config(base: Config, params: dict[str, Any], evals_per_epoch: int) -> Config:
    """The base config with a trial's parameters, evaluating ``evals_per_epoch`` times per epoch, quietly."""
    cfg = with_values(base, {KEYS[name]: value for name, value in params.items()})
    steps = steps_per_epoch(cfg) or evals_per_epoch
    quiet = {"train.progress": False, "train.plots": False, "train.tensorboard": False}
    return with_values(cfg, {"train.eval_every": max(1, steps // evals_per_epoch), **quiet})


def final_steps(trial_cfg: Config, final_cfg: Config, best_step: int | None, steps: int | None) -> int:
    """The steps the final run trains so that it stops where the trial's validation AUC peaked: the trial's best
    step as a share of its epochs, of the final run's (larger) epochs; 0 (all the epochs) when the trial peaked
    at its end, or when either length is unknown (a study made before trials recorded their best step)."""
    if not best_step or not steps or best_step >= steps:
        return 0
    trial_epoch, final_epoch = steps_per_epoch(trial_cfg), steps_per_epoch(final_cfg)
    if not trial_epoch or not final_epoch:
        return 0
    return max(1, round(best_step / trial_epoch * final_epoch))


def _progress_line(trial: Any, best: Any) -> str:
    state = trial.state.name.lower()
    auc = f"{trial.value:.4f}" if trial.value is not None else (
        f"{trial.intermediate_values[max(trial.intermediate_values)]:.4f}" if trial.intermediate_values else "-")
    params = " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial.params.items())
    seconds = trial.user_attrs.get("seconds", float("nan"))
    best_text = f"best {best.value:.4f} (trial {best.number})" if best is not None else "no best yet"
    params += " (the defaults)" if trial.user_attrs.get("defaults") else ""
    return f"trial {trial.number}: validation AUC {auc} {state:<8} {seconds:6.1f} s  {best_text}  {params}"


def _best(study: Any) -> Any:
    try:
        return study.best_trial
    except ValueError:  # no complete trial yet
        return None


class Tuner:
    """Runs a :class:`TuneJob`: the study, its trials, the best config's final run."""

    def __init__(self, job: TuneJob) -> None:
        self.job = job
        self.optuna = require_optuna()
        self.files = RunFiles(job.run_dir)
        self.base = validation_config(job.cfg)
        self.space: SearchSpace = narrow(default_space(self.base, train_rows(self.base)), job.tune.space)

    def run(self) -> dict[str, Any]:
        job = self.job
        local = not job.storage
        if job.resume and local and not (job.run_dir / STUDY_FILE).is_file():
            raise ConfigError(f"--resume: {job.run_dir} holds no {STUDY_FILE}; start the study without --resume")
        if not job.resume and any((job.run_dir / name).exists() for name in (STUDY_FILE, "tune.toml")):
            raise ConfigError(f"--run-dir {job.run_dir} holds a study; continue it with `tierec tune --run-dir "
                              f"{job.run_dir} --resume`, or choose another --run-dir")
        kept = STUDY_FILE if local else "trials"
        with claim_run_dir(job.run_dir, resume=job.resume, overwrite=False, kept=kept):
            if local and not job.resume:
                self.files.write(STUDY_FILE, b"")  # SQLite takes an empty file for a new database; recorded as tierec's
            self.files.check([STUDY_FILE, "config.toml", "tune.toml", "trials", "best.toml", "final", "trials.png", "tune_summary.json"])
            self.files.write_text("config.toml", dump_toml(to_dict(self.base)))
            tune = {**to_dict(job.tune), "space": self.space.given()}
            self.files.write_text("tune.toml", dump_toml({"tune": tune}))
            study = self._study(local)
            self._optimize(study)
            return self._finish(study)

    # ------------------------------------------------------------------ study

    def _study(self, local: bool) -> Any:
        optuna = self.optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # our own line per trial instead
        url = f"sqlite:///{(self.job.run_dir / STUDY_FILE).resolve()}" if local else self.job.storage
        try:
            with warnings.catch_warnings():  # heartbeats are "experimental" in Optuna (since 2.9)
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                storage = optuna.storages.RDBStorage(url, heartbeat_interval=HEARTBEAT_S, grace_period=3 * HEARTBEAT_S)
        except Exception as e:  # noqa: BLE001 - any driver's error: one line
            raise ConfigError(f"--storage {url}: {str(e).splitlines()[0][:200]}") from None
        tune = self.job.tune
        pruner = self.job.pruner or optuna.pruners.MedianPruner(n_startup_trials=tune.startup_trials, n_warmup_steps=tune.warmup_evals + 1)  # (reported at evaluations 1, 2, ...)
        study = optuna.create_study(study_name=STUDY_NAME, storage=storage, direction="maximize", pruner=pruner,
                                    load_if_exists=self.job.resume or not local)
        # A resumed study draws on from where it stopped (the same seed would repeat its first trials); processes
        # sharing a study draw unseeded, so that no two repeat each other's points.
        seed = tune.seed + len(study.get_trials(deepcopy=False)) if local else None
        study.sampler = optuna.samplers.TPESampler(seed=seed)
        if not study.get_trials(deepcopy=False):  # a new study: the size-chosen config, with each model, first
            for point in self.defaults():
                study.enqueue_trial(point, user_attrs={"defaults": True}, skip_if_exists=True)
        return study

    def defaults(self) -> list[dict[str, Any]]:
        """The base config's point in the searched dimensions (nearest inside the space where it lies outside):
        trial 0, so that the study's best is never a config worse than the defaults on the validation split; then,
        when the model is searched, the same point with each other model (each model starts from its defaults,
        not from what the sampler's first random draws give it)."""
        flat = flatten_dict(to_dict(self.base))
        point = self.space.nearest({name: flat[key] for name, key in KEYS.items()})
        others = self.space.model.values if "model" in point else ()
        return [point] + [{**point, "model": m} for m in others if m != point["model"]]

    def _finished(self, study: Any) -> int:
        states = (self.optuna.trial.TrialState.COMPLETE, self.optuna.trial.TrialState.PRUNED)
        return len(study.get_trials(deepcopy=False, states=states))

    def _optimize(self, study: Any) -> None:
        left = self.job.trials - self._finished(study)
        if left <= 0:
            self.job.echo(f"the study already has {self._finished(study)} finished trials (--trials {self.job.trials})")
            return
        states = (self.optuna.trial.TrialState.COMPLETE, self.optuna.trial.TrialState.PRUNED)
        stop_at = self.optuna.study.MaxTrialsCallback(self.job.trials, states=states)  # several processes: the total

        def report(study: Any, trial: Any) -> None:
            self.job.echo(_progress_line(trial, _best(study)))

        t0 = time.perf_counter()
        study.optimize(self._objective, n_trials=left, timeout=self.job.timeout or None, callbacks=[report, stop_at],
                       catch=(TrainingDiverged,), gc_after_trial=True)
        done = self._finished(study)
        if self.job.timeout and done < self.job.trials and time.perf_counter() - t0 >= self.job.timeout:
            self.job.echo(f"--timeout {self.job.timeout:g} s reached: {done} of {self.job.trials} trials finished "
                          f"(`tierec tune --run-dir {self.job.run_dir} --resume` continues the study)")

    def _objective(self, trial: Any) -> float:
        params = self.space.sample(trial)
        cfg = trial_config(self.base, params, self.job.tune.evals_per_epoch)
        name = f"trials/{trial.number:04d}"
        self.files.directory("trials")
        trial_dir = self.files.directory(name)
        trial.set_user_attr("run_dir", str(trial_dir))
        evals = [0]
        pruned = [False]

        def on_validation(step: int, auc: float) -> bool:
            evals[0] += 1
            if math.isnan(auc):
                return False
            trial.report(auc, evals[0])
            pruned[0] = trial.should_prune()
            return pruned[0]

        t0 = time.perf_counter()
        with claim_run_dir(trial_dir, resume=False, overwrite=True), \
                RunFiles(trial_dir).append("train.log") as log, contextlib.redirect_stdout(log):
            trainer = Trainer(cfg, trial_dir, echo=lambda line: print(line, file=log), on_validation=on_validation,
                              test_at_end=False)
            try:
                summary = trainer.fit()
            finally:
                trainer.close()
                trial.set_user_attr("seconds", time.perf_counter() - t0)
        trial.set_user_attr("steps", summary["steps"])
        trial.set_user_attr("best_step", summary.get("best_step"))  # where its value (best validation AUC) was
        if pruned[0]:
            raise self.optuna.TrialPruned(f"pruned at evaluation {evals[0]} (step {summary['steps']})")
        return float(summary["best_validation_auc"])

    # ------------------------------------------------------------------ the end

    def _finish(self, study: Any) -> dict[str, Any]:
        from tierec.tune.plot import trials_png

        states = self.optuna.trial.TrialState
        trials = [t for t in study.get_trials(deepcopy=False) if t.state != states.WAITING]  # not enqueued ones left over
        self.files.write("trials.png", trials_png(trials))
        best = _best(study)
        if best is None:
            raise ConfigError(f"no trial of the study finished ({len(trials)} tried; see {self.job.run_dir}/trials/*/train.log)")
        trial_cfg = with_values(self.base, {KEYS[k]: v for k, v in self._params(best).items()})
        cfg = final_config(trial_cfg)
        best_step, steps = best.user_attrs.get("best_step"), best.user_attrs.get("steps")
        stop = final_steps(trial_cfg, cfg, best_step, steps)
        if stop:  # the trial's value is its AUC at best_step: the final run stops at the same point of its epochs
            cfg = with_values(cfg, {"train.max_steps": stop})
        at = f" at step {best_step} of {steps}" if best_step and steps else ""
        length = f"{stop} steps, where the trial peaked" if stop else f"{cfg.train.epochs} epoch{'s' * (cfg.train.epochs != 1)}"
        header = (f"# tierec tune: trial {best.number} of {self.job.run_dir} (validation AUC {best.value:.4f}{at}), "
                  f"trained on train + validation for {length}\n")
        self.files.write_text("best.toml", header + dump_toml(to_dict(cfg)))
        self.job.echo(f"best trial {best.number}: validation AUC {best.value:.4f}{at}; training it on train + validation "
                      f"for {length} ({self.job.run_dir / 'final'})")
        final_dir = self.files.directory("final")
        with claim_run_dir(final_dir, resume=False, overwrite=True):
            trainer = Trainer(cfg, final_dir, echo=self.job.echo)
            try:
                final = trainer.fit()
            finally:
                trainer.close()
        summary = {
            "trials": len(trials),
            "complete": sum(t.state == states.COMPLETE for t in trials),
            "pruned": sum(t.state == states.PRUNED for t in trials),
            "failed": sum(t.state == states.FAIL for t in trials),
            "best_trial": best.number,
            "best_params": self._params(best),
            "best_validation_auc": best.value,
            "best_step": best_step,
            "final_steps": final["steps"],
            "test_auc": final["test_auc"],
            "test_logloss": final["test_logloss"],
            "timed_out": bool(self.job.timeout) and self._finished(study) < self.job.trials,
            "final_run_dir": str(final_dir),
            "storage": self.job.storage or f"sqlite:///{self.job.run_dir / STUDY_FILE}",
        }
        self.files.write_text("tune_summary.json", json.dumps(summary, indent=2) + "\n")
        return summary

    def _params(self, trial: Any) -> dict[str, Any]:
        """A trial's values of every dimension (those the space fixed included)."""
        fixed = {name: getattr(self.space, name).suggest(_Fixed(), name) for name in KEYS}
        return {**fixed, **trial.params}


class _Fixed:
    """A stand-in trial for reading the fixed dimensions (it is asked only for those that are not)."""

    def suggest_float(self, name: str, low: float, high: float, *, log: bool = False) -> float:
        return low

    def suggest_int(self, name: str, low: int, high: int) -> int:
        return low

    def suggest_categorical(self, name: str, choices: list[Any]) -> Any:
        return choices[0]
