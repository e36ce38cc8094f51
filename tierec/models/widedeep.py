"""Wide & Deep (Cheng et al., 2016): a linear wide part plus a deep MLP.

- wide: ``sum_f wide[:, f]`` (first-order weight of each sparse id) plus a
  linear map of the dense features;
- deep: MLP (``deep_mlp``) over ``[dense, flattened emb]`` and a 1-unit output.

The logit is ``wide + deep``; the deep output layer carries the only bias.

>>> import torch
>>> from tierec.config import ModelConfig
>>> from tierec.models.widedeep import WideDeep
>>> m = WideDeep(ModelConfig(name="widedeep", deep_mlp=[8]), n_dense=3, n_sparse=4, dim=2)
>>> m(torch.randn(5, 3), torch.randn(5, 4, 2), torch.randn(5, 4)).shape
torch.Size([5])
"""

from __future__ import annotations

import torch
from torch import Tensor

from tierec.config import ModelConfig
from tierec.models.base import CTRModel, dense_linear, output_layer
from tierec.models.layers import MLP


class WideDeep(CTRModel):
    first_order_by_design = True

    def __init__(self, cfg: ModelConfig, n_dense: int, n_sparse: int, dim: int) -> None:
        super().__init__(n_dense, n_sparse, dim)
        self.wide_dense = dense_linear(n_dense, 1)
        self.deep = MLP(n_dense + n_sparse * dim, cfg.deep_mlp, cfg.dropout)
        self.out = output_layer(self.deep.out_dim)

    def forward(self, dense: Tensor, emb: Tensor, wide: Tensor | None = None) -> Tensor:
        self.check_inputs(dense, emb, wide)
        dense = self.dense_scale(dense)
        wide_logit = self.first_order(wide)  # [B]
        if self.wide_dense is not None:
            wide_logit = wide_logit + self.wide_dense(dense).squeeze(1)
        deep_in = torch.cat([dense, emb.flatten(1)], dim=1)  # [B, n_dense + F D]
        return wide_logit + self.out(self.deep(deep_in)).squeeze(1)  # [B]
