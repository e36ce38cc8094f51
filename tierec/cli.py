"""The ``tierec`` command line: one function per command.

    tierec train [--config FILE] [--set section.key=value ...] [--run-dir DIR] [--resume] [--nproc N] [--follow]
    torchrun --nproc_per_node N -m tierec train ...      (multi-node: torchrun's rendezvous arguments)
    tierec eval CHECKPOINT [--data FILE] [--split test|all]
    tierec predict CHECKPOINT --data FILE --out FILE
    tierec export CHECKPOINT --out DIR [--precision fp32|fp16|int8]
    tierec serve DIR [--port P] [--host 127.0.0.1] [--threads N] [--follow RUN_DIR [--poll SECONDS]]
    tierec preprocess [--config FILE] [--set ...] --out DIR
    tierec report RUN_DIR
    tierec tune [--config FILE] [--set ...] [--run-dir DIR] [--trials N] [--timeout S] [--resume] [--storage URL]
    tierec inspect FILE [--rows N] [--delimiter D] [--header/--no-header] [--encoding E] [--out schema.toml]
    tierec bench [benchmark options]

Configuration problems, bad data files and unreadable checkpoints are reported
as one line on stderr with exit status 2, not as a traceback; a lost rank of a
distributed job with exit status 3.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from tierec.config import Config, ConfigError, from_dict, given_keys, load_config, upgrade_saved
from tierec.paths import check_no_alias
from tierec.version import tierec_version


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", action="append", default=[],
                   help="TOML config file; repeatable: files merge in order, later ones winning, then --set "
                        "(default: none, the built-in synthetic DLRM job)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config value after the config files, e.g. --set model.name=deepfm (repeatable; values parsed as TOML)",
    )
    p.add_argument("--strict", action="store_true",
                   help="treat a malformed data row as an error instead of skipping it (default: skip and count them)")


def _overrides(args: argparse.Namespace) -> list[str]:
    follow = ["data.follow=true"] if getattr(args, "follow", False) else []
    return list(args.overrides) + (["data.strict=true"] if args.strict else []) + follow


def _config(args: argparse.Namespace) -> Config:
    return load_config(args.config, _overrides(args))


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


# --------------------------------------------------------------------- commands


def cmd_train(args: argparse.Namespace) -> int:
    from tierec.train.rundir import check_run_dir, claim_run_dir, files_written, resume_config
    from tierec.train.stopping import GracefulStop
    from tierec.train.trainer import Trainer

    if args.nproc < 1:
        raise ConfigError(f"--nproc must be >= 1, got {args.nproc}")
    if args.resume and args.overwrite:
        raise ConfigError("--resume continues a run and --overwrite starts it over: choose one")
    run_dir = Path(args.run_dir or f"runs/{time.strftime('%Y%m%d-%H%M%S')}")
    cfg = resume_config(run_dir, args.config, _overrides(args)) if args.resume else None
    if cfg is None:  # a new run: batch size, epochs, dim and rates from the data's size, where not given
        cfg = _sized(_config(args), given_keys(args.config, _overrides(args)))
    if not args.progress:
        cfg.train.progress = False
    if int(os.environ.get("RANK", "0")) == 0:  # (other ranks: rank 0 may hold the lock by now)
        # before anything is written: no file it will write is a link or a file of the user's
        check_run_dir(run_dir, resume=args.resume, overwrite=args.overwrite, writes=files_written(cfg))
    _preflight(cfg)
    if cfg.data.follow and args.nproc > 1:
        raise ConfigError("data.follow (--follow) runs on 1 process for now; drop --nproc")
    if not _launched_by_torchrun() and not cfg.data.follow:  # the launcher counts for all its processes (a followed
        # directory's files are not there yet to count the tables' rows in)
        from tierec.train.memory import check_memory, training_estimate

        check_memory(training_estimate(cfg, processes=args.nproc), device=cfg.train.device)
    if int(os.environ.get("RANK", "0")) == 0 and cfg.train.progress:
        from tierec.warmup import note_compilation

        note_compilation(lambda line: print(f"tierec: {line}", file=sys.stderr))
    if args.nproc > 1 or _launched_by_torchrun():  # see docs/distributed.md
        from tierec.train.launch import run_train

        return run_train(cfg, run_dir, resume=args.resume, overwrite=args.overwrite, nproc=args.nproc, argv=args.argv,
                         report=lambda summary: _finish(cfg, summary))  # fmt: skip
    with claim_run_dir(run_dir, resume=args.resume, overwrite=args.overwrite), GracefulStop() as stop:
        trainer = Trainer(cfg, run_dir, resume=args.resume)
        trainer.stop = stop
        summary = trainer.fit()
    _finish(cfg, summary)
    return 0


def _finish(cfg: Config, summary: dict) -> None:
    """The run's summary on stdout, and its plots (train.plots) in the run directory."""
    _print_summary(summary)
    if cfg.train.plots:
        from tierec.train.plots import write_plots

        files = write_plots(summary["run_dir"])
        print(f"plots           {', '.join(p.name for p in files)}  (`tierec report RUN_DIR` draws them again)")


def cmd_tune(args: argparse.Namespace) -> int:
    from tierec.config import flatten_dict, merged_dict
    from tierec.tune.space import tune_config
    from tierec.tune.study import TuneJob, Tuner, require_optuna

    require_optuna()  # before anything else: one line when it is missing
    if args.trials < 1:
        raise ConfigError(f"--trials must be >= 1, got {args.trials}")
    run_dir = Path(args.run_dir or f"runs/tune-{time.strftime('%Y%m%d-%H%M%S')}")
    if args.resume:  # the study's own base config and [tune] settings
        if args.config or args.overrides:
            raise ConfigError(f"--resume continues with {run_dir}/config.toml and {run_dir}/tune.toml: drop --config and --set")
        if not (run_dir / "tune.toml").is_file():
            raise ConfigError(f"--resume: {run_dir} holds no study of `tierec tune` (no tune.toml); start one without --resume")
        data = merged_dict([run_dir / "config.toml", run_dir / "tune.toml"])
        tune = tune_config(data)
        cfg = from_dict(Config, upgrade_saved(data))
    else:
        data = merged_dict(args.config, _overrides(args))
        tune = tune_config(data)  # the [tune] table is tune's; the rest is a training config
        cfg = _sized(from_dict(Config, data), set(flatten_dict(data)))
    if not args.progress:
        cfg.train.progress = False
    _preflight(cfg)
    if args.timeout < 0:
        raise ConfigError(f"--timeout must be >= 0 seconds, got {args.timeout:g}")
    summary = Tuner(TuneJob(cfg, tune, run_dir, trials=args.trials, resume=args.resume, storage=args.storage,
                            timeout=args.timeout)).run()
    print()
    print(f"trials          {summary['trials']} ({summary['complete']} complete, {summary['pruned']} pruned, {summary['failed']} failed)")
    print(f"best trial      {summary['best_trial']}  (validation AUC {summary['best_validation_auc']:.4f})")
    print(f"best params     {' '.join(f'{k}={v:.3g}' if isinstance(v, float) else f'{k}={v}' for k, v in summary['best_params'].items())}")
    print(f"test AUC        {summary['test_auc']:.4f}  (the best config trained on train + validation, once)")
    print(f"best config     {run_dir / 'best.toml'}  (tierec train --config {run_dir / 'best.toml'})")
    print(f"run directory   {run_dir}  (study {summary['storage']}; trials.png, tune_summary.json)")
    if cfg.train.plots:
        from tierec.train.plots import write_plots

        write_plots(summary["final_run_dir"])
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from tierec.data.inspect import inspect_file
    from tierec.data.inspect_toml import describe, schema_toml
    from tierec.data.sniff import delimiter_option

    delimiter = delimiter_option(args.delimiter) if args.delimiter else ""
    report = inspect_file(args.file, max_rows=args.rows, fmt=args.format, delimiter=delimiter, header=args.header, encoding=args.encoding)
    print(describe(report))
    if args.out:
        check_no_alias(args.out, [args.file], "inspect --out", "data")
        Path(args.out).write_text(schema_toml(report))
        print(f"wrote {args.out}: edit it, then `tierec train --config {args.out}`")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from tierec.train.plots import write_plots

    files = write_plots(args.run_dir)
    for p in files:
        print(p)
    return 0


def _sized(cfg: Config, given: set[str]) -> Config:
    from tierec.train.sizing import estimate_train_rows, size_defaults

    rows = estimate_train_rows(cfg)  # once: it reads the file's head (or Parquet's metadata)
    if rows is None:
        return cfg
    cfg, chosen = size_defaults(cfg, given, train_rows=rows)
    if chosen and int(os.environ.get("RANK", "0")) == 0:
        values = ", ".join(f"{k}={v}" for k, v in chosen.items())
        print(f"about {rows:,} training rows: {values} (chosen from the data's size; "
              "set any of them to override; written to config.toml)")
    return cfg


def _launched_by_torchrun() -> bool:
    import os

    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ


def _print_summary(summary: dict) -> None:
    print()
    if "test_auc" in summary:
        print(f"test AUC        {summary['test_auc']:.4f}")
        if "planted_auc" in summary:
            print(f"planted AUC     {summary['planted_auc']:.4f}  (the generator's own model on the same rows)")
        print(f"test logloss    {summary['test_logloss']:.4f}")
    else:  # a followed directory without data.test_source
        print("test AUC        none (no test split: set data.test_source to evaluate on one)")
    if "best_step" in summary:
        print(f"best step       {summary['best_step']}  (validation AUC {summary['best_validation_auc']:.4f}; test is evaluated on it, checkpoints/best)")
    print(f"samples/s       {summary['train_samples_per_s']:,.0f}  (training steps, {summary['steps']} steps)")
    print(f"embedding rows  {summary['embedding_rows']:,}  ({_human_bytes(summary['embedding_bytes'])})")
    print(f"peak memory     {_human_bytes(summary['peak_memory_bytes'])}")
    print(f"run directory   {summary['run_dir']}")


def _checkpoint_path(path: str, last: bool) -> str:
    from tierec.train.evaluate import run_checkpoint

    return run_checkpoint(path, last)


def _restore(checkpoint: str, data: str | None, overrides: list[str]):
    from tierec.config import apply_override
    from tierec.data import open_source
    from tierec.train.sharded_checkpoint import is_sharded, load_any, resolve_checkpoint
    from tierec.train.checkpoint import Checkpoint, find_checkpoint
    from tierec.train.components import Components
    from tierec.train.state import restore_checkpoint, restore_state

    ckpt = resolve_checkpoint(checkpoint) or find_checkpoint(checkpoint)  # the latter raises the one-line error
    with ExitStack() as held:
        if is_sharded(ckpt):  # the previous sharded format, read whole
            loaded, (tensors, meta) = None, load_any(ckpt)
        else:  # saved on any number of processes; rows are read a chunk at a time, the checkpoint held meanwhile
            loaded = held.enter_context(Checkpoint(checkpoint))  # a run's newest, picked again if pruned meanwhile
            meta = loaded.meta
        cfg_dict = upgrade_saved(meta["config"])
        for o in ([f"data.source={json.dumps(data)}", "data.format=\"auto\""] if data else []) + overrides:
            apply_override(cfg_dict, o)
        cfg: Config = from_dict(Config, cfg_dict)
        _preflight(cfg)  # e.g. --set train.device="cuda" on a machine without CUDA: one line
        probe = open_source(cfg.data, "all", cfg.train.batch_size, label_optional=True)  # names and sizes only
        _check_restore_memory(cfg, probe, ckpt)
        parts = Components.build(cfg, probe.feature_names, probe.n_dense)
        if loaded is None:
            restore_state(parts, tensors, meta["state"])
        else:
            restore_checkpoint(parts, loaded)
    return cfg, parts


def _check_restore_memory(cfg: Config, probe, ckpt) -> None:
    """The memory preflight of eval and predict: the run's model, batches and store, and the checkpoint's rows in memory."""
    from tierec.train.memory import MemoryPart, check_memory, estimate_memory

    estimate = estimate_memory(cfg, list(probe.feature_names), probe.n_dense)
    if not cfg.store.enabled:  # (tiered rows stay within the store's budget)
        rows = sum(p.stat().st_size for p in Path(ckpt).glob("rows-*.safetensors"))
        estimate = estimate.plus(MemoryPart(f"embedding rows of {ckpt}", ("the checkpoint",), rows))
    check_memory(estimate, device=cfg.train.device)


def cmd_eval(args: argparse.Namespace) -> int:
    from tierec.train.evaluate import evaluate, require_defined

    cfg, parts = _restore(_checkpoint_path(args.checkpoint, args.last), args.data, args.overrides)
    result = evaluate(cfg, parts, split=args.split)
    print(json.dumps(result))
    require_defined(result, f"the {args.split} split of {cfg.data.source}")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from tierec.train.evaluate import predict

    cfg, parts = _restore(_checkpoint_path(args.checkpoint, args.last), args.data, args.overrides)
    check_no_alias(args.out, [cfg.data.source, cfg.data.test_source, args.checkpoint], "predict --out", "data or checkpoint")
    n = predict(cfg, parts, args.split, args.out, keys=args.keys)
    print(f"wrote {n} scores to {args.out}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from tierec.serving.export import ExportConfig, export_checkpoint

    manifest = export_checkpoint(_checkpoint_path(args.checkpoint, args.last), args.out, ExportConfig(precision=args.precision))
    rows = sum(t.rows for t in manifest.tables)
    print(f"exported step {manifest.step} ({manifest.model}, {len(manifest.tables)} tables, {rows:,} rows, "
          f"{manifest.precision}) to {args.out}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from tierec.serving.server import serve

    serve(args.export, host=args.host, port=args.port, follow=args.follow, poll_s=args.poll, threads=args.threads)
    return 0


def cmd_preprocess(args: argparse.Namespace) -> int:
    from tierec.data.preprocess import preprocess

    cfg = _config(args)
    out = Path(args.out)
    manifest = preprocess(cfg.data, out, rows_per_shard=args.rows_per_shard, progress=True)
    print(preprocess_summary(manifest, out))
    return 0


def preprocess_summary(manifest, out: Path) -> str:
    """A few lines: rows, shards, bytes and malformed rows per split (the details are in manifest.json)."""
    lines = []
    for name, split in manifest.splits.items():
        nbytes = sum((out / s.file).stat().st_size for s in split.shards if (out / s.file).exists())
        bad = split.problems.malformed if split.problems is not None else 0
        lines.append(f"{name:<6} {split.rows:>12,} rows  {len(split.shards):>4} shards  {_human_bytes(nbytes):>10}  {bad:,} malformed rows skipped")
    features = f"{len(manifest.feature_names)} categorical, {len(manifest.dense_names)} dense features"
    lines.append(f"wrote {out} ({features}; details in {out / 'manifest.json'})")
    return "\n".join(lines)


def cmd_bench(args: argparse.Namespace, rest: list[str]) -> int:
    from benchmarks.run import main as bench_main

    return bench_main(rest)


# ------------------------------------------------------------------------ parser


CONFIG_KEYS_HELP = "Every config key, its default and meaning: docs/config.md (or python -m tierec.config_reference)."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tierec", description="Train CTR models whose embedding tables do not fit in fast memory.",
                                     epilog=CONFIG_KEYS_HELP)
    parser.add_argument("--version", action="version", version=f"tierec {tierec_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "train", help="train a model (default: DLRM on built-in synthetic Criteo-shaped data)",
        description="Train a model. On a file of fewer than 204,800 training rows, the batch size, epochs, embedding "
                    "dim and optimizer, dense lr and first-order terms that no --config or --set gives are chosen from "
                    "the file's size (printed, and written to the run's config.toml; docs/models.md, \"Defaults by data "
                    "size\"). Every other key, its default and meaning: tierec/config.py.",
    )
    _add_config_args(p)
    p.add_argument("--run-dir", metavar="DIR", help="where config, metrics, checkpoints and summary go (default runs/<time>)")
    p.add_argument(
        "--resume", action="store_true",
        help="continue from the newest intact checkpoint in --run-dir, with the run's own config.toml; --set may then "
             "change only train.max_steps, train.epochs, train.eval_every, train.eval_batches, train.checkpoint_every, "
             "train.progress, train.threads, train.nan_policy, data.strict, data.prefetch_batches, dist.timeout_s, "
             "dist.heartbeat_s, dist.group_size, store.disk_path (default: start from scratch)",
    )  # fmt: skip
    p.add_argument("--overwrite", action="store_true",
                   help="start over in a --run-dir that holds a run (deletes only the files tierec wrote there; "
                        "default: such a run dir is an error)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar (default: a bar on a terminal, a line every 30 s in a log)")
    p.add_argument("--follow", action="store_true",
                   help="data.source is a directory that grows: train every file in it once, in name order, as it "
                        "arrives, until SIGTERM or train.max_steps (sets data.follow; see data.follow_poll_s and "
                        "data.follow_settle_s; default: train the source's epochs and stop)")
    p.add_argument("--nproc", type=int, default=1, metavar="N",
                   help="train on N local processes (started and watched by this one, torchrun's environment without torchrun; "
                        "see docs/distributed.md; default: 1)")
    p.set_defaults(func=cmd_train)

    for name, helptext in (("eval", "evaluate a checkpoint"), ("predict", "write a score for every row of a data file")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("checkpoint", help="a run directory, its checkpoints/ directory, or one checkpoint; a run's "
                                          "checkpoints/best (best validation AUC) when there is one, else its latest")
        p.add_argument("--last", action="store_true",
                       help="the run's latest checkpoint instead of checkpoints/best (default: best when kept)")
        p.add_argument("--data", metavar="FILE", help="data file or shard directory (default: the run's own data.source)")
        p.add_argument(
            "--split", choices=["test", "validation", "train", "all"], default="all" if name == "predict" else "test",
            help="which rows of the data, split as the run's config says (all = every row of the file; "
                 f"default: {'all' if name == 'predict' else 'test'})",
        )
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                       help="override a value of the checkpoint's config (e.g. data.schema...; default: none)")
        if name == "predict":
            p.add_argument("--out", required=True, metavar="FILE",
                           help="output table: .parquet, .tsv, else CSV; columns: the --key columns (or row), score, "
                                "and label when the file has one (a file without its label column is fine)")
            p.add_argument("--key", dest="keys", action="append", default=[], metavar="COLUMN",
                           help="a column of the data file written beside each score (repeatable; "
                                "default: none, a 0-based 'row' number instead)")
        p.set_defaults(func=cmd_eval if name == "eval" else cmd_predict)

    p = sub.add_parser("export", help="write a checkpoint as a self-contained directory to serve: dense program, tables, manifest")
    p.add_argument("checkpoint", help="a run directory (its checkpoints/best when kept, else its latest), its checkpoints/ "
                                      "directory, or one checkpoint")
    p.add_argument("--last", action="store_true", help="the run's latest checkpoint instead of checkpoints/best")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="the export directory: new, empty, or an earlier export (replaced); written aside, then renamed")
    p.add_argument("--precision", choices=["fp32", "fp16", "int8"], default="fp32",
                   help="the tables' rows: fp32, fp16, or int8 row-wise (a scale and bias per row) (default: fp32)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("serve", help="score rows over HTTP with an export (POST /score, GET /health, GET /version)")
    p.add_argument("export", metavar="DIR", help="a directory written by `tierec export`")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default: 8000)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    p.add_argument("--follow", metavar="RUN_DIR",
                   help="the run the export was made from: apply each delta checkpoint it publishes (train.delta_every) "
                        "and take up each newer full checkpoint, between requests (default: serve the export as it is)")
    p.add_argument("--poll", type=float, default=1.0, metavar="SECONDS",
                   help="with --follow, how often to look for new checkpoints (default: 1)")
    p.add_argument("--threads", type=int, default=1, metavar="N",
                   help="torch threads of the dense program (default: 1; requests are scored one at a time, and more "
                        "threads only pay on requests of thousands of rows)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser(
        "tune", help="search the model, learning rates, dim, dropout, weight decay, epochs and batch size with Optuna",
        description="Tune a training config: Optuna trials of `tierec train` on the validation split (pruned early "
                    "on their validation AUC), then the best config trained on train + validation and tested once. "
                    "Ranges by data size, narrowed by a [tune.space] table in a --config file; the model is searched unless "
                    "the config names one (model.name); see docs/models.md, "
                    "\"Tuning with tierec tune\". Needs the extra: pip install 'tierec[tune]'.",
    )
    _add_config_args(p)
    p.add_argument("--run-dir", metavar="DIR", help="where the study (study.db), trials, best.toml and the final run go "
                                                    "(default runs/tune-<time>)")
    p.add_argument("--trials", type=int, default=20, metavar="N",
                   help="finished (complete or pruned) trials the study ends with, counting earlier ones (default: 20)")
    p.add_argument("--resume", action="store_true",
                   help="continue the study in --run-dir up to --trials, with its own config.toml and tune.toml")
    p.add_argument("--timeout", type=float, default=0.0, metavar="SECONDS",
                   help="start no new trial after this many seconds (the running one finishes, then the best is "
                        "trained on train + validation as usual; --resume continues the study); default: none")
    p.add_argument("--storage", default="", metavar="URL",
                   help="an RDB URL (e.g. postgresql://host/db, sqlite:///shared/study.db) for a study shared by "
                        "several machines (default: sqlite:///DIR/study.db)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar for the final run")
    p.set_defaults(func=cmd_tune)

    from tierec.data.inspect import DEFAULT_SAMPLE_ROWS

    p = sub.add_parser("inspect", help="infer each column's role (label, numeric, categorical, multi-valued) and write a schema TOML")
    p.add_argument("file", metavar="FILE", help="a CSV / TSV file (with or without a header), raw Criteo TSV, or Parquet")
    p.add_argument("--rows", type=int, default=DEFAULT_SAMPLE_ROWS, metavar="N",
                   help=f"read only the first N rows, a bounded sample (default: {DEFAULT_SAMPLE_ROWS})")
    p.add_argument("--format", choices=["auto", "csv", "tsv", "criteo", "parquet"], default="auto",
                   help="the file's format (default: auto, from the suffix and the first lines)")
    p.add_argument("--delimiter", metavar="D", default="",
                   help="the field delimiter: one character or several (::), or tab, comma, semicolon, pipe, space (default: guessed)")
    p.add_argument("--header", action=argparse.BooleanOptionalAction, default=None,
                   help="whether the first line names the columns (default: guessed)")
    p.add_argument("--encoding", default="", metavar="NAME",
                   help="the text encoding, e.g. latin-1 (default: UTF-8, lines that are not read as latin-1 with a note)")
    p.add_argument("--out", metavar="FILE", help="write the inferred schema as a config TOML for `train --config` (default: print only)")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("report", help="draw a run's PNG plots (loss, AUC, samples/s, embedding rows and bytes, store hit rate)")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory of `tierec train` (its metrics.jsonl); the PNGs are written there")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("preprocess", help="convert a data source into binary shards that stream fast")
    _add_config_args(p)
    p.add_argument("--out", required=True, metavar="DIR", help="output directory for shards and manifest")
    p.add_argument("--rows-per-shard", type=int, default=1_000_000, metavar="N", help="rows in each shard file (default: 1000000)")
    p.set_defaults(func=cmd_preprocess)

    p = sub.add_parser("bench", help="side-by-side benchmarks against plain PyTorch, FBGEMM and TorchRec", add_help=False)
    p.set_defaults(func=cmd_bench, passthrough=True)
    for name, command in sub.choices.items():  # every --help that takes config keys points to their reference
        if command.epilog is None and name != "bench":
            command.epilog = CONFIG_KEYS_HELP
    return parser


def _preflight(cfg: Config) -> None:
    """tierec.train.preflight's checks. Imported here, not at the top: it imports torch, and this module must
    not, so that ``main`` sets OpenMP's wait policy before torch loads OpenMP (which reads it once, then)."""
    from tierec.train.preflight import preflight

    preflight(cfg)


def apply_omp_wait_policy(environ) -> None:
    """Choose OpenMP's wait policy before torch (and so OpenMP) is first imported.

    Unset -> PASSIVE: on a shared machine spinning waits made training steps 10-20x
    slower (docs/performance.md). ``OMP_WAIT_POLICY=default`` removes the variable, so
    OpenMP uses its own default (spin a while, then sleep): on a dedicated, quiet
    machine 1.08x-1.35x (the default synthetic run, by host) and 1.2x (the e2e benchmark's
    DLRM) the speed of PASSIVE. Any other value is the user's and stands.
    """
    if environ.get("OMP_WAIT_POLICY", "").lower() == "default":
        del environ["OMP_WAIT_POLICY"]
    else:
        environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main(argv: list[str] | None = None) -> int:
    code = _main(argv)
    if argv is None and code != 0:
        # Run as a program and failing: leave now. Interpreter teardown with library threads (Arrow, numba,
        # gloo) still alive could abort ("terminate called without an active exception", status 134).
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except OSError:  # a terminal that hung up (SIGHUP)
                pass
        os._exit(code)
    return code


def _main(argv: list[str] | None) -> int:
    apply_omp_wait_policy(os.environ)
    from tierec.data.errors import DataError
    from tierec.distributed.local_job import report_error
    from tierec.errors import DiskFullError, DiskTierError
    from tierec.serving.manifest import ExportError
    from tierec.store.group import CacheCapacityError, StoreFullError
    from tierec.train.checkpoint import CheckpointError
    from tierec.train.stopping import Interrupted, TrainingDiverged

    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and not getattr(args, "passthrough", False):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.argv = list(argv) if argv is not None else sys.argv[1:]  # `train --nproc N` starts its ranks with them
    try:
        with one_line_warnings():
            if getattr(args, "passthrough", False):
                return args.func(args, rest)
            return args.func(args)
    except (ConfigError, DataError, CheckpointError, CacheCapacityError, StoreFullError, FileNotFoundError,
            TrainingDiverged, DiskFullError, DiskTierError, ExportError) as e:  # fmt: skip
        report_error(f"tierec: error: {e}")
        return 2
    except Interrupted as e:
        print(f"tierec: {e}", file=sys.stderr)
        return e.status
    except KeyboardInterrupt:
        print("tierec: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - only disk full and out of memory are turned into one line
        message = resource_error(e)
        if message is None:
            raise
        report_error(f"tierec: error: {message}")
        return 2


@contextmanager
def one_line_warnings() -> Iterator[None]:
    """tierec's own warnings (malformed rows skipped, ignored settings) as one line each: ``tierec: warning: ...``.

    Python's default shows the source file, line and code that warned, which
    tells a user of the command nothing; other libraries' warnings keep it.
    """
    package = Path(__file__).resolve().parent
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001 - warnings' hook
        if not Path(filename).resolve().is_relative_to(package):
            shown(message, category, filename, lineno, file, line)
            return
        text = " ".join(str(message).split())
        print(f"tierec: warning: {text}", file=sys.stderr if file is None else file)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


def resource_error(e: BaseException) -> str | None:
    """One line for running out of disk or memory (any layer's exception); None for anything else."""
    from tierec.errors import is_disk_full

    text = str(e)
    first = text.splitlines()[0][:160] if text else type(e).__name__
    if is_disk_full(e):
        where = getattr(e, "filename", None) or "a file"
        return (f"disk full while writing {where} ({first}); "
                "free space there, then continue with --resume (the last complete checkpoint is intact)")
    if isinstance(e, MemoryError) or "can't allocate memory" in text or "not enough memory" in text:
        asked = re.search(r"tried to allocate (\d+) bytes", text)
        what = f"allocating {int(asked.group(1)):,} bytes failed" if asked else first
        return f"out of memory ({what}); lower train.batch_size or the model size"
    return None


if __name__ == "__main__":
    sys.exit(main())
