"""A real 2-node torchrun on one machine: two network namespaces over a rate-limited veth pair.

Skips where namespaces cannot be made (not root, no iproute2, a container that forbids them).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from benchmarks.netns import namespaces, netns_available, run_two_nodes
from dist_workers import SMALL, compare_runs
from tierec.config import load_config
from tierec.train.trainer import Trainer

REASON = netns_available()
pytestmark = pytest.mark.skipif(bool(REASON), reason=f"network namespaces: {REASON}")


def _env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[2])  # this checkout, in every rank of both nodes
    return {"PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}


def test_two_node_torchrun_as_a_group_per_node_matches_one_process(tmp_path: Path) -> None:
    # 2 machines of 2 processes, dist.group_size = 2: a group per machine, only the cross-group sync on the link
    over = SMALL + ["train.max_steps=4", "train.threads=1", "train.precision=fp32"]  # exact: no bf16 autocast
    Trainer(load_config(None, over), tmp_path / "ref").fit()
    args = ["train", "--run-dir", str(tmp_path / "two"), "--no-progress", "--set", "dist.group_size=2"]
    for o in over:
        args += ["--set", o]
    tag = uuid.uuid4().hex[:5]
    done = run_two_nodes("100mbit", 2, args, tag=tag, env=_env(), timeout_s=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not [n for n in namespaces() if tag in n]  # removed
    compare_runs(tmp_path / "ref", tmp_path / "two")
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert (summary["world_size"], summary["replicas"]) == (4, 2)


def test_namespaces_are_removed_when_the_job_fails(tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:5]
    done = run_two_nodes("1gbit", 1, ["train", "--run-dir", str(tmp_path), "--set", "dist.compress=int4"],
                         tag=tag, env=_env(), timeout_s=120)
    assert done.returncode != 0 and "dist.compress" in done.stderr
    assert not [n for n in namespaces() if tag in n]
