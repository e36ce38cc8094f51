"""Dense features standardised with statistics of the training split, inside the model.

A ``DenseScaler`` is the first layer every model applies to its dense input:
``(x - mean) * inv_std`` per column. ``data.dense_scaling = "shrink"`` (the
default) takes ``inv_std = 1 / max(std, 1)``: every column is centred, and
divided by its standard deviation only where that exceeds 1, so a column of large
values comes down to unit variance and one already of order 1 keeps its spread
(a column with std 0.3 is not multiplied by 3.3: docs/models.md, "Dense features
are standardised from the data"). ``"standard"`` divides every column by its
standard deviation. Its two buffers are part of the model's
state, so a checkpoint and an export carry them and serving scales exactly as
training did. :class:`DenseStats` accumulates the mean and variance of each
column over a stream of batches (in float64, merged per batch); a column that
is constant in the training split gets ``inv_std = 0``: it is dropped (its
input is 0 for every row). A model that was never fitted (or loaded from a
checkpoint written before scaling existed) has the identity: mean 0, inv_std 1.

>>> import torch
>>> from tierec.models.scaling import DenseScaler, DenseStats
>>> stats = DenseStats(2)
>>> stats.add(torch.tensor([[1.0, 5.0], [3.0, 5.0]]))
>>> scaler = DenseScaler(2)
>>> scaler.fit(stats)
[1]
>>> scaler(torch.tensor([[1.0, 5.0], [3.0, 7.0]])).tolist()
[[-1.0, 0.0], [1.0, 0.0]]
>>> small = DenseStats(1)
>>> small.add(torch.tensor([[0.4], [0.6]]))  # mean 0.5, std 0.1
>>> shrink, standard = DenseScaler(1), DenseScaler(1)
>>> shrink.fit(small), standard.fit(small, mode="standard")
([], [])
>>> round(shrink(torch.tensor([[0.6]])).item(), 4), round(standard(torch.tensor([[0.6]])).item(), 4)
(0.1, 1.0)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn


class DenseStats:
    """Per-column count, mean and sum of squared deviations of a stream of ``[B, n]`` batches."""

    def __init__(self, n: int) -> None:
        self.count = 0
        self.mean = torch.zeros(n, dtype=torch.float64)
        self.m2 = torch.zeros(n, dtype=torch.float64)

    def add(self, x: Tensor) -> None:
        """Merge one batch (Chan et al.'s parallel update, stable for long streams)."""
        if x.shape[0] == 0:
            return
        x = x.detach().to(device="cpu", dtype=torch.float64)
        n_b = x.shape[0]
        mean_b = x.mean(0)
        m2_b = ((x - mean_b) ** 2).sum(0)
        total = self.count + n_b
        delta = mean_b - self.mean
        self.mean += delta * (n_b / total)
        self.m2 += m2_b + delta**2 * (self.count * n_b / total)
        self.count = total

    @property
    def std(self) -> Tensor:
        return (self.m2 / max(self.count, 1)).sqrt()


class DenseScaler(nn.Module):
    """``(x - mean) * inv_std`` per dense column; identity until :meth:`fit`."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(n))
        self.register_buffer("inv_std", torch.ones(n))

    def fit(self, stats: DenseStats, mode: str = "shrink", eps: float = 1e-6) -> list[int]:
        """Take the statistics; returns the columns that are constant (dropped: inv_std 0).

        ``mode``: "shrink" divides by ``max(std, 1)`` (never amplifies a column), "standard" by ``std``.
        """
        if mode not in ("shrink", "standard"):
            raise ValueError(f"mode {mode!r} is not one of shrink, standard")
        std = stats.std
        constant = std <= eps * stats.mean.abs().clamp(min=1.0)
        inv = torch.where(constant, torch.zeros_like(std), 1.0 / std.clamp(min=1.0 if mode == "shrink" else eps))
        self.mean.copy_(stats.mean.to(self.mean.dtype))
        self.inv_std.copy_(inv.to(self.inv_std.dtype))
        return [int(i) for i in constant.nonzero().flatten()]

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] == 0:
            return x
        return (x - self.mean) * self.inv_std

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        # A checkpoint from before dense scaling has no buffers here: it trained on raw values, so the
        # identity is what restores it (not a "missing key" error).
        for name, value in (("mean", 0.0), ("inv_std", 1.0)):
            if prefix + name not in state_dict:
                state_dict[prefix + name] = torch.full_like(getattr(self, name), value)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
