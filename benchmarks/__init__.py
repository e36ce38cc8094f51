"""Side-by-side benchmarks of tierec against its peers: ``python -m benchmarks.run --help``.

OpenMP threads (torch's, FBGEMM's through torch, numba's) busy-wait at the end
of every parallel loop by default. On a machine shared with other processes
that is ruinous: a thread spins for a core whose other thread was descheduled,
and a DLRM step measured 10-20x slower (wall) than with sleeping waits. So,
unless the environment already says otherwise, the benchmarks run with
``OMP_WAIT_POLICY=PASSIVE`` for every system alike. It only takes effect when
set before torch is first imported; ``benchmarks.run`` records what was in force.

The policy changes the peers' 2-thread times several fold (docs/performance.md), so
compare under each: ``OMP_WAIT_POLICY=ACTIVE`` (spin forever), ``PASSIVE`` (sleep at
once), or ``OMP_WAIT_POLICY=default``, which this package removes from the
environment so that OpenMP runs with no policy at all (its own default: spin a
while, then sleep), which is what a user who sets nothing gets.
"""

import os
import sys

if "torch" not in sys.modules:
    from tierec.cli import apply_omp_wait_policy  # imports no torch

    apply_omp_wait_policy(os.environ)  # the CLI's rule: unset -> PASSIVE, "default" -> removed
    OMP_WAIT_POLICY_APPLIED = True
else:  # imported from a process that already started OpenMP: its policy stands
    OMP_WAIT_POLICY_APPLIED = "OMP_WAIT_POLICY" in os.environ
