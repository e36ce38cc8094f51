"""The trials of a study as one PNG: each trial's validation AUC, and the best so far."""

from __future__ import annotations

import io
from typing import Any


def trials_png(trials: list[Any]) -> bytes:
    """``trials`` (Optuna's FrozenTrial) drawn: complete ones filled, pruned ones hollow at their last reported
    AUC, the best complete AUC so far as a step line. PNG bytes (the caller writes them through RunFiles)."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never a window
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    done = [(t.number, t.value) for t in trials if t.value is not None]
    pruned = [(t.number, t.intermediate_values[max(t.intermediate_values)])
              for t in trials if t.value is None and t.intermediate_values]
    fig, ax = plt.subplots(figsize=(6, 4))
    if done:
        ax.plot(*zip(*done), "o", color="tab:blue", label="complete")
        best, running = [], float("-inf")
        for number, value in sorted(done):
            running = max(running, value)
            best.append((number, running))
        ax.step(*zip(*best), where="post", color="tab:orange", label="best so far")
    if pruned:
        ax.plot(*zip(*pruned), "o", markerfacecolor="none", color="tab:gray", label="pruned (last AUC reported)")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("trial")
    ax.set_ylabel("validation AUC")
    ax.set_title(f"tierec tune: {len(trials)} trials")
    ax.grid(alpha=0.3)
    if done or pruned:
        ax.legend(loc="best")
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    return png.getvalue()
