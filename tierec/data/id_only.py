"""Synthetic id-only data: user and item columns, clicks from a planted model, sorted by user.

The shape of a ratings log turned into clicks: no numeric columns, two id columns,
one row per (user, item) impression, the file sorted by user (so a tail split puts
unseen users in test, and a hash split by user keeps each user whole). The click
probability is ``sigmoid(base + user_bias[u] + item_bias[i] + <p_u, q_i>)``:
item popularity alone explains part of it (the item bias), the personal part
needs the user-item interaction.

    python -m tierec.data.id_only --out ids.csv --rows 60000 --users 2000 --items 500

>>> import tempfile, os, pyarrow.csv as pacsv
>>> path = os.path.join(tempfile.mkdtemp(), "ids.csv")
>>> write_id_only(path, rows=1000, users=50, items=20, seed=0)
1000
>>> t = pacsv.read_csv(path)
>>> t.column_names, t["user"].to_pylist() == sorted(t["user"].to_pylist())
(['user', 'item', 'clicked'], True)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv


def id_only_table(rows: int, users: int, items: int, seed: int = 0, dim: int = 4) -> pa.Table:
    """``rows`` impressions: columns ``user``, ``item`` (ints) and ``clicked`` (0/1), sorted by user."""
    rng = np.random.default_rng(seed)
    user_bias = rng.normal(0.0, 0.5, users)
    item_bias = rng.normal(0.0, 1.0, items)
    p = rng.normal(0.0, 0.6, (users, dim))
    q = rng.normal(0.0, 0.6, (items, dim))
    popularity = 1.0 / np.arange(1, items + 1) ** 0.8  # Zipf-like exposure of items
    popularity /= popularity.sum()
    u = np.sort(rng.integers(0, users, rows))
    i = rng.choice(items, rows, p=popularity)
    logit = -1.0 + user_bias[u] + item_bias[i] + np.einsum("nd,nd->n", p[u], q[i])
    clicked = (rng.random(rows) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
    return pa.table({"user": u, "item": i, "clicked": clicked})


def write_id_only(path: str | Path, rows: int, users: int, items: int, seed: int = 0) -> int:
    """Write :func:`id_only_table` as CSV with a header; returns the rows written."""
    table = id_only_table(rows, users, items, seed)
    pacsv.write_csv(table, path)
    return table.num_rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tierec.data.id_only", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="CSV file to write")
    p.add_argument("--rows", type=int, default=60_000, help="impressions (default: 60000)")
    p.add_argument("--users", type=int, default=2_000, help="distinct users (default: 2000)")
    p.add_argument("--items", type=int, default=500, help="distinct items (default: 500)")
    p.add_argument("--seed", type=int, default=0, help="seed of the planted model and the draws (default: 0)")
    a = p.parse_args(argv)
    n = write_id_only(a.out, a.rows, a.users, a.items, a.seed)
    print(f"wrote {n} rows to {a.out} (schema: label = clicked, categorical = user, item)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
