"""Run directories: who may write one, and with which config a run resumes.

``tierec train`` claims its run directory before writing anything in it:

- a directory it made carries ``.tierec-run``; files tierec writes there
  (``config.toml``, ``metrics.jsonl``, ``summary.json``, ``checkpoints/``) are
  never written over in a directory without it (``--run-dir .`` keeps a user's
  own ``config.toml``); every file is written through
  :class:`~tierec.train.runfiles.RunFiles` (no link followed, nothing written
  over a file tierec did not write), and the names a run will write are checked
  before it starts (:func:`files_written`);
- a run directory that already holds a run is continued with ``--resume`` or
  started over with ``--overwrite`` (which deletes only tierec's own files);
  anything else is a one-line error that says so;
- ``.tierec.lock`` holds the PID and host of the process training in it: a
  second trainer, or a ``--resume`` while the first still runs, is refused in
  one line; a lock left by a dead process on this host is taken over.

``--resume`` continues with the run's own ``config.toml``; a run directory
that tierec claimed but that holds no ``config.toml`` (it stopped before
writing it: nothing was trained) is refused, not trained on the defaults. ``--set`` may then
change only the keys in ``SAFE_ON_RESUME`` (how long to train, how often to
evaluate and checkpoint, progress and speed knobs); any other change is an
error naming the key, raised before anything is written.

>>> import tempfile
>>> from pathlib import Path
>>> run = Path(tempfile.mkdtemp()) / "r"
>>> with claim_run_dir(run, resume=False, overwrite=False):
...     sorted(p.name for p in run.iterdir())
['.tierec-run', '.tierec.lock']
>>> run.exists()  # the lock goes when the claim ends, and a new run dir in which nothing was kept too
False
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import tomllib
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tierec.config import Config, ConfigError, apply_override, first_difference, flatten_dict, from_dict, to_dict, upgrade_saved
from tierec.train.runfiles import MARKER, RunDirError, RunFiles

LOCK = ".tierec.lock"
OWN_FILES = ("config.toml", "metrics.jsonl", "summary.json", "checkpoints")
# What --set may change on --resume: how long to train, how often to evaluate and
# checkpoint, what to print, and speed knobs that do not change the numbers' meaning.
SAFE_ON_RESUME = (
    "train.max_steps",
    "train.epochs",
    "train.eval_every",
    "train.eval_batches",
    "train.checkpoint_every",
    "train.progress",
    "train.plots",
    "train.tensorboard",
    "train.threads",
    "train.nan_policy",
    "data.strict",
    "data.prefetch_batches",
    "data.follow_poll_s",
    "data.follow_settle_s",
    "dist.timeout_s",
    "dist.heartbeat_s",
    "dist.group_size",  # how the processes are grouped: checkpoints hold one replica, any mesh loads them
    "store.disk_path",  # the disk tier's file is scratch (unlinked); its rows come back from the checkpoint
)


def files_written(cfg: Config) -> tuple[str, ...]:
    """The names `tierec train` writes in its run directory with ``cfg`` (checked before it starts)."""
    from tierec.train.plots import plot_files

    plots = plot_files(tiered=cfg.store.enabled) if cfg.train.plots else ()
    return OWN_FILES + plots + (("tensorboard",) if cfg.train.tensorboard else ())


# ---------------------------------------------------------------- resume config


def resume_config(run_dir: Path, config_file: str | None, overrides: list[str]) -> Config | None:
    """The run's own config with the allowed ``--set`` changes; None if ``run_dir`` holds no run yet."""
    path = run_dir / "config.toml"
    if path.is_symlink():
        raise RunDirError(f"{path} is a symbolic link; tierec reads a run's config only from the run directory itself")
    if not path.is_file():
        if run_dir.is_dir() and (_is_ours(run_dir) or any((run_dir / f).exists() for f in OWN_FILES)):
            _refuse_live_holder(run_dir)  # (a run still starting has not written it yet)
            raise RunDirError(
                f"--resume: {run_dir} holds no config.toml (the run stopped before writing it, so nothing was "
                f"trained); start it again without --resume, with its --config / --set: tierec train --run-dir {run_dir} ..."
            )
        return None
    if config_file:
        raise ConfigError(
            f"--resume continues with {path}; drop --config (change {', '.join(SAFE_ON_RESUME[:4])}, ... with --set)"
        )
    try:
        saved = upgrade_saved(tomllib.loads(path.read_text()))
        old = to_dict(from_dict(Config, saved))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not a readable config ({e})") from None
    data = json.loads(json.dumps(old))  # a deep copy
    for o in overrides:
        apply_override(data, o)
    cfg = from_dict(Config, data)
    changed = first_difference(old, to_dict(cfg), ignore=SAFE_ON_RESUME)
    if changed is not None:
        raise ConfigError(
            f"--resume cannot change {changed} (the run was trained with {flatten_dict(old).get(changed)!r}); "
            f"on resume only these may change: {', '.join(SAFE_ON_RESUME)}"
        )
    return cfg


# ------------------------------------------------------------------ ownership


def _is_ours(run_dir: Path) -> bool:
    return RunFiles(run_dir).claimed()


def check_run_dir(run_dir: Path, *, resume: bool, overwrite: bool, writes: tuple[str, ...] = OWN_FILES) -> None:
    """Raise RunDirError unless training may write in ``run_dir`` as asked (``writes``: the names it will write,
    none a link or a file tierec did not write); writes nothing."""
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"--run-dir {run_dir} exists and is not a directory")
    if not run_dir.is_dir():
        return
    _refuse_live_holder(run_dir)
    present = [f for f in OWN_FILES if (run_dir / f).exists()]
    if present and not _is_ours(run_dir):
        raise RunDirError(
            f"--run-dir {run_dir} holds {present[0]} that tierec did not write there (no {MARKER}); "
            "choose a new or empty run directory"
        )
    if present and not resume and not overwrite:
        raise RunDirError(
            f"--run-dir {run_dir} already holds a run; continue it with `tierec train --run-dir {run_dir} --resume`, "
            "or pass --overwrite to start it over"
        )
    RunFiles(run_dir).check(writes)


def _remove_own_files(run_dir: Path) -> None:
    """--overwrite: delete what an earlier run wrote (tierec's own names only)."""
    from tierec.train.checkpoint import remove_checkpoints

    files = RunFiles(run_dir)
    for name in ("metrics.jsonl", "summary.json", "config.toml"):
        files.remove(name)
    ckpt = run_dir / "checkpoints"
    if "checkpoints" in files.own() and ckpt.is_dir() and not ckpt.is_symlink():
        remove_checkpoints(ckpt)


@contextmanager
def claim_run_dir(run_dir: Path, *, resume: bool, overwrite: bool, kept: str = "checkpoints/latest") -> Iterator[Path]:
    """Check, create, lock (and with ``overwrite`` clear) ``run_dir`` for one training process.

    ``kept``: the name whose presence at the end means the run kept something (`tierec tune`: its study);
    without it, a run directory this claim created is removed again."""
    run_dir = Path(run_dir)
    check_run_dir(run_dir, resume=resume, overwrite=overwrite)
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        lock = _acquire(run_dir)
    except BaseException:
        if created:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    try:
        files = RunFiles(run_dir)
        held_a_run = files.claimed()
        files.claim()  # (an older marker: records the files of tierec's it holds)
        if held_a_run and overwrite and not resume:
            _remove_own_files(run_dir)
        yield run_dir
    finally:
        _release(lock)
        if created and not (run_dir / kept).exists():
            _remove_own_files(run_dir)  # nothing was kept: a run dir made for nothing leaves nothing behind
            (run_dir / MARKER).unlink(missing_ok=True)
            try:
                run_dir.rmdir()
            except OSError:
                pass


# ------------------------------------------------------------------------ lock


def _me() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}


def _alive(pid: int) -> bool:
    """``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
        return stat[stat.rfind(")") + 2 :][:1] not in ("Z", "X")
    except OSError:
        return True  # no /proc: assume it runs


def _refuse_live_holder(run_dir: Path) -> None:
    """Raise if another live process holds the lock (checked early, e.g. before ``--nproc`` starts torchrun)."""
    path = run_dir / LOCK
    try:
        holder = json.loads(path.read_text())
        pid, host = int(holder["pid"]), str(holder["host"])
    except (OSError, ValueError, KeyError, TypeError):
        return  # no lock, or a broken one: _acquire decides
    me = _me()
    if host != me["host"] or (pid != me["pid"] and _alive(pid)):
        raise RunDirError(
            f"--run-dir {run_dir} is in use by PID {pid} on {host} (since {holder.get('since', '?')}); "
            f"wait for it to end, or remove {path} if that process is gone"
        )


def _acquire(run_dir: Path) -> Path:
    path = run_dir / LOCK
    me = _me()
    for _ in range(5):
        tmp = run_dir / f"{LOCK}.{uuid.uuid4().hex[:8]}"
        tmp.write_text(json.dumps(me) + "\n")
        try:
            os.link(tmp, path)  # atomic: the lock appears with its content, or not at all
            return path
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
        try:
            holder = json.loads(path.read_text())
            pid, host = int(holder["pid"]), str(holder["host"])
        except FileNotFoundError:
            continue  # released meanwhile
        except (ValueError, KeyError, TypeError, OSError):
            raise RunDirError(f"{path} is not a tierec lock; remove it if no tierec process uses {run_dir}") from None
        if host == me["host"] and (pid == me["pid"] or not _alive(pid)):
            stale = run_dir / f"{LOCK}.stale-{uuid.uuid4().hex[:8]}"
            try:
                os.replace(path, stale)  # only one taker wins the rename
                stale.unlink()
            except FileNotFoundError:
                pass
            continue
        raise RunDirError(
            f"--run-dir {run_dir} is in use by PID {pid} on {host} (since {holder.get('since', '?')}); "
            f"wait for it to end, or remove {path} if that process is gone"
        )
    raise RunDirError(f"could not lock {path}")


def _release(path: Path) -> None:
    try:
        holder = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        path.unlink(missing_ok=True)
