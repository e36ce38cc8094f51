"""Checks of a config against this machine, made before a run writes anything.

A config can be valid and still unusable here: ``train.device = "cuda"`` on a
machine without CUDA, a ``store.disk_path`` that is a file or lies on a
pseudo file system. Each is a one-line ConfigError naming the key.

>>> from tierec.config import load_config
>>> preflight(load_config(None, ["train.device=cpu"]))
>>> preflight(load_config(None, ["store.enabled=true", "store.disk_path=/proc/x"]))
Traceback (most recent call last):
...
tierec.errors.ConfigError: store.disk_path /proc/x is on a pseudo file system (/proc); give a directory on a disk
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from pathlib import Path

import torch

from tierec.config import Config, ConfigError, StoreConfig

_PSEUDO = ("/proc", "/sys", "/dev")


def check_device(device: str, key: str = "train.device") -> None:
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ConfigError(f"{key} {device!r} is not a device (e.g. cpu, cuda, cuda:1)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{key} is {device!r} but this machine has no CUDA device; use {key}=\"cpu\"")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ConfigError(f"{key} is {device!r} but this machine has {torch.cuda.device_count()} CUDA device(s)")


def check_writable_dir(path: str, key: str) -> None:
    """``path`` is a directory tierec can create files in, or can be created as one."""
    p = Path(os.path.abspath(os.path.expanduser(path)))
    for pseudo in _PSEUDO:
        if p == Path(pseudo) or p.is_relative_to(pseudo):
            raise ConfigError(f"{key} {path} is on a pseudo file system ({pseudo}); give a directory on a disk")
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{key} {path} exists and is not a directory")
    existing = p
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{key} {path}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{key} {path}: {existing} is not writable")


def ignored_store_keys(store: StoreConfig) -> list[str]:
    """The ``store`` settings that differ from their defaults while ``store.enabled`` is false (they do nothing).

    >>> ignored_store_keys(StoreConfig(memory_budget="1GiB", disk_path="/mnt/x"))
    ['store.memory_budget', 'store.disk_path']
    >>> ignored_store_keys(StoreConfig(enabled=True, memory_budget="1GiB"))
    []
    """
    if store.enabled:
        return []
    default = StoreConfig()
    return [f"store.{f.name}" for f in dataclasses.fields(store) if getattr(store, f.name) != getattr(default, f.name)]


def preflight(cfg: Config) -> None:
    """Raise ConfigError if ``cfg`` cannot run on this machine; warn of settings it ignores."""
    ignored = ignored_store_keys(cfg.store)
    if ignored:
        warnings.warn(f"store.enabled is false, so {', '.join(ignored)} {'is' if len(ignored) == 1 else 'are'} ignored "
                      "(set store.enabled=true to tier the embedding tables)", stacklevel=2)
    check_device(cfg.train.device)
    if cfg.train.tensorboard:
        from tierec.train.tensorboard import require_tensorboard

        require_tensorboard()
    if cfg.store.enabled:
        if cfg.store.disk_path:
            check_writable_dir(cfg.store.disk_path, "store.disk_path")
        for t in cfg.store.tables:
            if t.disk_path:
                check_writable_dir(t.disk_path, f"store.tables[{t.name}].disk_path")
