"""Two emulated machines joined by a rate-limited link: a real 2-node torchrun on one machine.

``run_two_nodes`` runs ``benchmarks/netns_torchrun.sh`` (network namespaces, a
veth pair on 10.231.0.1/2 limited with ``tc ... tbf``, ``torchrun --nnodes 2``
inside each; the namespaces are removed on every exit). ``netns_available``
says whether this machine can (root, ``ip`` and ``tc``, namespaces allowed).

>>> from benchmarks.netns import parse_rate
>>> parse_rate("100mbit"), parse_rate("1gbit")
(100000000, 1000000000)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

SCRIPT = Path(__file__).with_name("netns_torchrun.sh")
PREFIX = "tierec-"  # every namespace the harness makes is tierec-<tag>-<node>


def parse_rate(rate: str) -> int:
    """bits per second of a tc rate like ``100mbit``."""
    m = re.fullmatch(r"(\d+)([kmg]?)bit", rate)
    if m is None:
        raise ValueError(f"rate {rate!r} must look like 100mbit or 1gbit")
    return int(m[1]) * {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}[m[2]]


def namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def netns_available() -> str:
    """'' when namespaces, veth pairs and tbf can be made here, else why not."""
    if os.geteuid() != 0:
        return "needs root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs ip and tc (apt-get install iproute2)"
    probe = f"{PREFIX}probe-{uuid.uuid4().hex[:6]}"
    try:
        made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
        if made.returncode:
            return f"ip netns add failed: {made.stderr.strip()}"
        return ""
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)


def run_two_nodes(
    rate: str, nproc_per_node: int, tierec_args: list[str], *, tag: str | None = None, env: dict[str, str] | None = None,
    timeout_s: float = 600, port: int = 29533,
) -> subprocess.CompletedProcess:
    """``tierec <tierec_args>`` as a 2-node torchrun job over a ``rate`` link; returns the finished process."""
    parse_rate(rate)
    tag = tag or uuid.uuid4().hex[:5]
    full_env = {**os.environ, "PYTHON": sys.executable, "NETNS_PORT": str(port), **(env or {})}
    cmd = ["bash", str(SCRIPT), rate, str(nproc_per_node), tag, "--", *tierec_args]
    return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout_s, check=False)
