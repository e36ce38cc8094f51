"""Small runs to export: a synthetic CSV file (written here), the Criteo sample when present, three storages."""

from __future__ import annotations

import csv
import json
import socket
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow.csv as pacsv

from tierec.cli import main
from tierec.config import load_config
from tierec.data.schema import CRITEO_COLUMNS
from tierec.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]
CRITEO_HEAD = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "criteo" / "train_head10000.txt"
CRITEO_TEST_ROWS = 1000


def write_clicks_csv(path: Path, rows: int = 3000, seed: int = 0) -> Path:
    """A CSV of clicks: two dense columns, a user and an item id, a multi-valued tag column, a label."""
    rng = np.random.default_rng(seed)
    users = rng.zipf(1.3, rows) % 400
    items = rng.integers(0, 60, rows)
    price = np.round(rng.gamma(2.0, 3.0, rows), 2)
    tags = ["|".join(f"t{t}" for t in rng.choice(12, int(k), replace=False)) for k in rng.integers(0, 4, rows)]
    logit = 0.8 * np.sin(users) + 0.6 * np.cos(items) - 0.1 * price + 0.3
    label = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(int)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["clicked", "price", "age", "user", "item", "tags"])
        for i in range(rows):
            age = "" if i % 13 == 0 else int(rng.integers(18, 70))
            w.writerow([label[i], price[i], age, f"u{users[i]}", int(items[i]), tags[i]])
    return path


def clicks_config(path: Path) -> list[str]:
    return [f"data.source={json.dumps(str(path))}", 'data.schema.label="clicked"', 'data.schema.dense=["price","age"]',
            'data.schema.categorical=["user","item","tags"]', 'data.schema.multi_valued=["tags"]',
            "data.test_rows=500", "embedding.dim=8", "train.batch_size=256", "train.epochs=2"]  # fmt: skip


def criteo_config() -> list[str]:
    return [f"data.source={json.dumps(str(CRITEO_HEAD))}", f"data.test_rows={CRITEO_TEST_ROWS}", "embedding.dim=8",
            "train.batch_size=512", "train.max_steps=12"]  # fmt: skip


def storage_config(storage: str, tmp: Path) -> list[str]:
    """``plain``, ``pruned``, ``tiered`` or several joined by ``+``."""
    return [o for part in storage.split("+") for o in _storages(tmp)[part]]


def _storages(tmp: Path) -> dict[str, list[str]]:
    return {
        "plain": [],
        "pruned": ["prune.enabled=true", "prune.chunk=4", "prune.every=4", "prune.target_ratio=2"],
        "tiered": ["store.enabled=true", "store.memory_budget=14KiB", "store.cache_size=12KiB",
                   f"store.disk_path={json.dumps(str(tmp / 'disk'))}"],  # fmt: skip
    }


def train(run: Path, overrides: list[str], resume: bool = False) -> dict:
    common = ['train.precision="fp32"', "train.progress=false", "train.plots=false", "model.top_mlp=[16]",
              "model.bottom_mlp=[16]", "model.deep_mlp=[16]"]  # fmt: skip
    return Trainer(load_config(None, common + overrides), run, resume=resume).fit()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(url: str, body: object | bytes | None = None, timeout: float = 30) -> tuple[int, dict]:
    """(status, JSON answer) of a GET (no body) or POST to ``url``, through urllib: a real HTTP client."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def predicted(run: Path, out: Path, split: str = "all") -> np.ndarray:
    """``tierec predict``'s scores of the run's data file (one split), in file order."""
    assert main(["predict", str(run), "--split", split, "--out", str(out)]) == 0
    return pacsv.read_csv(out).column("score").to_numpy()


def csv_records(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def criteo_records(path: Path, last: int) -> list[dict[str, str]]:
    """The last ``last`` lines of a raw Criteo file as records of text (its label column included)."""
    lines = path.read_text().splitlines()[-last:]
    return [dict(zip(CRITEO_COLUMNS, line.split("\t"))) for line in lines]
