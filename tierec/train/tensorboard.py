"""TensorBoard event files of a run (``train.tensorboard = true``): the metrics records as scalars.

Every record the trainer writes to ``metrics.jsonl`` also goes to
``<run_dir>/tensorboard/`` (a directory of tierec's own, never a symbolic link:
:class:`~tierec.train.runfiles.RunFiles`; its event files get new, unique names)
through ``torch.utils.tensorboard``, which needs the
``tensorboard`` package (``pip install 'tierec[tensorboard]'``); without it the
run stops before it starts, with one line saying so (:func:`require_tensorboard`).

>>> import tempfile
>>> from pathlib import Path
>>> run = Path(tempfile.mkdtemp())
>>> sink = TensorBoardSink(run)
>>> sink.write({"kind": "train", "step": 1, "loss": 0.5, "samples_per_s": 1000.0})
>>> sink.close()
>>> any(p.name.startswith("events.out.tfevents") for p in (run / "tensorboard").iterdir())
True
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from tierec.errors import ConfigError
from tierec.train.runfiles import RunFiles

MISSING = "train.tensorboard = true needs the tensorboard package: pip install 'tierec[tensorboard]' (or set train.tensorboard = false)"


def require_tensorboard() -> None:
    """Raise the one-line ConfigError when the tensorboard package is not installed."""
    if importlib.util.find_spec("tensorboard") is None:
        raise ConfigError(MISSING)


class TensorBoardSink:
    """Writes metrics records as TensorBoard scalars: train/*, <split>/auc and <split>/logloss, store/hit_rate."""

    def __init__(self, run_dir: str | Path) -> None:
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(RunFiles(Path(run_dir)).directory("tensorboard")))

    def write(self, record: dict[str, Any]) -> None:
        kind, step = record.get("kind"), record.get("step")
        if step is None:
            return
        if kind == "train":
            for key in ("loss", "samples_per_s", "embedding_rows", "embedding_bytes"):
                if key in record:
                    self.writer.add_scalar(f"train/{key}", record[key], step)
            if "store" in record:
                self.writer.add_scalar("store/hit_rate", record["store"]["total"]["hit_rate"], step)
        elif kind == "eval":
            for key in ("auc", "logloss"):
                self.writer.add_scalar(f"{record['split']}/{key}", record[key], step)

    def close(self) -> None:
        self.writer.close()
