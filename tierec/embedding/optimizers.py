"""Fused sparse optimizers: update only the batch's unique rows, in place, in the backward.

No dense gradient tensor exists for a table: the backward hands the gradient of
the unique rows ``[U, dim]`` straight to ``apply_update``. On CPU a numba kernel
does gradient-to-weight in one pass over each row; elsewhere (GPU) the same
arithmetic runs as torch index ops.

Per-row lazy state: Adagrad keeps a ``[rows, dim]`` sum of squares, row-wise
Adagrad one float per row, Adam two ``[rows, dim]`` moments with a step count
per table group (as torch's SparseAdam does).
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np
import torch
from torch import Tensor

from tierec.config import OptimizerConfig, OptimizerKind
from tierec.embedding.prefetch import AHEAD, prefetch_row


def state_shapes(kind: OptimizerKind, dim: int) -> dict[str, tuple[int, ...]]:
    """Per-row optimizer state: name -> trailing shape (after the row axis)."""
    return {
        OptimizerKind.SGD: {},
        OptimizerKind.ADAGRAD: {"sum": (dim,)},
        OptimizerKind.ROWWISE_ADAGRAD: {"sum": ()},
        OptimizerKind.ADAM: {"exp_avg": (dim,), "exp_avg_sq": (dim,)},
    }[kind]


def initial_state_value(cfg: OptimizerConfig, name: str) -> float:
    return cfg.initial_accumulator if name == "sum" else 0.0


# --------------------------------------------------------------------- kernels


@nb.njit(parallel=True, cache=True, fastmath=False)
def _sgd(w, rows, g, lr, wd):
    d = w.shape[1]
    n = rows.shape[0]
    for i in nb.prange(n):
        if i + AHEAD < n:
            prefetch_row(w, rows[i + AHEAD])
        r = rows[i]
        for j in range(d):
            w[r, j] -= lr * (g[i, j] + wd * w[r, j])


@nb.njit(parallel=True, cache=True)
def _adagrad(w, s, rows, g, lr, eps, wd):
    d = w.shape[1]
    n = rows.shape[0]
    for i in nb.prange(n):
        if i + AHEAD < n:
            prefetch_row(w, rows[i + AHEAD])
            prefetch_row(s, rows[i + AHEAD])
        r = rows[i]
        for j in range(d):
            gj = g[i, j] + wd * w[r, j]
            s[r, j] += gj * gj
            w[r, j] -= lr * gj / (np.sqrt(s[r, j]) + eps)


@nb.njit(parallel=True, cache=True)
def _rowwise_adagrad(w, s, rows, g, lr, eps, wd):
    d = w.shape[1]
    n = rows.shape[0]
    for i in nb.prange(n):
        if i + AHEAD < n:
            prefetch_row(w, rows[i + AHEAD])
            prefetch_row(s, rows[i + AHEAD])
        r = rows[i]
        acc = np.float32(0.0)
        for j in range(d):
            gj = g[i, j] + wd * w[r, j]
            acc += gj * gj
        s[r] += acc / d
        scale = lr / (np.sqrt(s[r]) + eps)
        for j in range(d):
            w[r, j] -= scale * (g[i, j] + wd * w[r, j])


@nb.njit(parallel=True, cache=True)
def _adam(w, m, v, rows, g, step_size, b1, b2, eps, wd):
    d = w.shape[1]
    n = rows.shape[0]
    for i in nb.prange(n):
        if i + AHEAD < n:
            prefetch_row(w, rows[i + AHEAD])
            prefetch_row(m, rows[i + AHEAD])
            prefetch_row(v, rows[i + AHEAD])
        r = rows[i]
        for j in range(d):
            gj = g[i, j] + wd * w[r, j]
            m[r, j] += (gj - m[r, j]) * (1 - b1)
            v[r, j] += (gj * gj - v[r, j]) * (1 - b2)
            w[r, j] -= step_size * m[r, j] / (np.sqrt(v[r, j]) + eps)


def _np(t: Tensor) -> np.ndarray:
    return t.detach().numpy()


def _f32(x: float) -> np.float32:
    return np.float32(x)


# -------------------------------------------------------------------- dispatch


def apply_update(
    cfg: OptimizerConfig,
    weights: Tensor,  # [R, D] float32
    state: dict[str, Tensor],  # name -> [R, ...]
    rows: Tensor,  # [U] int64, unique
    grad: Tensor,  # [U, D] float32
    step: int,  # 1-based update count of this table group (Adam bias correction)
) -> None:
    """Apply one optimizer step to ``rows`` in place."""
    if weights.device.type == "cpu":
        _apply_numba(cfg, weights, state, rows, grad.contiguous(), step)
    else:
        apply_update_torch(cfg, weights, state, rows, grad, step)


def adam_step_size(cfg: OptimizerConfig, step: int) -> float:
    bc1 = 1 - cfg.beta1**step
    bc2 = 1 - cfg.beta2**step
    return cfg.lr * math.sqrt(bc2) / bc1


def _apply_numba(cfg, weights, state, rows, grad, step) -> None:
    w, r, g = _np(weights), _np(rows), _np(grad)
    lr, eps, wd = _f32(cfg.lr), _f32(cfg.eps), _f32(cfg.weight_decay)
    kind = cfg.kind
    if kind is OptimizerKind.SGD:
        _sgd(w, r, g, lr, wd)
    elif kind is OptimizerKind.ADAGRAD:
        _adagrad(w, _np(state["sum"]), r, g, lr, eps, wd)
    elif kind is OptimizerKind.ROWWISE_ADAGRAD:
        _rowwise_adagrad(w, _np(state["sum"]), r, g, lr, eps, wd)
    elif kind is OptimizerKind.ADAM:
        step_size = _f32(adam_step_size(cfg, step))
        _adam(w, _np(state["exp_avg"]), _np(state["exp_avg_sq"]), r, g, step_size, _f32(cfg.beta1), _f32(cfg.beta2), eps, wd)
    else:  # pragma: no cover - enum is closed
        raise ValueError(kind)


def apply_update_torch(cfg, weights, state, rows, grad, step) -> None:
    """The same updates with torch index ops (device-agnostic; used on GPU and in tests)."""
    w = weights.index_select(0, rows)  # [U, D]
    g = grad + cfg.weight_decay * w if cfg.weight_decay else grad
    kind = cfg.kind
    if kind is OptimizerKind.SGD:
        w = w - cfg.lr * g
    elif kind is OptimizerKind.ADAGRAD:
        s = state["sum"].index_select(0, rows) + g * g
        state["sum"].index_copy_(0, rows, s)
        w = w - cfg.lr * g / (s.sqrt() + cfg.eps)
    elif kind is OptimizerKind.ROWWISE_ADAGRAD:
        s = state["sum"].index_select(0, rows) + (g * g).mean(1)
        state["sum"].index_copy_(0, rows, s)
        w = w - (cfg.lr / (s.sqrt() + cfg.eps)).unsqueeze(1) * g
    elif kind is OptimizerKind.ADAM:
        m = state["exp_avg"].index_select(0, rows)
        v = state["exp_avg_sq"].index_select(0, rows)
        m = m + (g - m) * (1 - cfg.beta1)
        v = v + (g * g - v) * (1 - cfg.beta2)
        state["exp_avg"].index_copy_(0, rows, m)
        state["exp_avg_sq"].index_copy_(0, rows, v)
        w = w - adam_step_size(cfg, step) * m / (v.sqrt() + cfg.eps)
    weights.index_copy_(0, rows, w)


def new_state(cfg: OptimizerConfig, rows: int, dim: int, device: torch.device) -> dict[str, Tensor]:
    return {
        name: torch.full((rows, *shape), initial_state_value(cfg, name), dtype=torch.float32, device=device)
        for name, shape in state_shapes(cfg.kind, dim).items()
    }
