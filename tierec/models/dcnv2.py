"""DCN-v2 (Wang et al., 2021), stacked: cross network, then deep MLP, then a logit.

``x0 = [dense, flattened emb]``; each cross layer computes
``x_{l+1} = x0 * (W x_l + b) + x_l`` with ``W`` full or, when
``cross_rank > 0``, the low-rank ``U V^T``. The deep MLP (``deep_mlp``) runs on
the cross output and a 1-unit linear layer gives the logit.

Stacked rather than parallel: the paper reports the two on par on Criteo, the
stacked form has one path (the deep tower sees explicit crosses directly) and
no extra concatenation; ``deep_mlp = []`` gives the cross-only model.
With ``model.first_order`` (on id-only data by default) the ids' first-order
weights (``wide``) are added to the logit (tierec.models.base).

>>> import torch
>>> from tierec.config import ModelConfig
>>> from tierec.models.dcnv2 import DCNv2
>>> m = DCNv2(ModelConfig(name="dcnv2", deep_mlp=[8], cross_rank=2), n_dense=3, n_sparse=4, dim=2)
>>> m(torch.randn(5, 3), torch.randn(5, 4, 2), None).shape
torch.Size([5])
"""

from __future__ import annotations

import torch
from torch import Tensor

from tierec.config import ModelConfig
from tierec.models.base import CTRModel, output_layer
from tierec.models.first_order import optional_first_order
from tierec.models.layers import MLP, CrossNetV2


class DCNv2(CTRModel):
    def __init__(self, cfg: ModelConfig, n_dense: int, n_sparse: int, dim: int) -> None:
        super().__init__(n_dense, n_sparse, dim, first_order=optional_first_order(cfg, n_dense))
        in_dim = n_dense + n_sparse * dim
        self.cross = CrossNetV2(in_dim, cfg.cross_layers, cfg.cross_rank)
        self.deep = MLP(in_dim, cfg.deep_mlp, cfg.dropout)
        self.out = output_layer(self.deep.out_dim)

    def forward(self, dense: Tensor, emb: Tensor, wide: Tensor | None = None) -> Tensor:
        self.check_inputs(dense, emb, wide)
        dense = self.dense_scale(dense)
        x0 = torch.cat([dense, emb.flatten(1)], dim=1)  # [B, n_dense + F D]
        return self.out(self.deep(self.cross(x0))).squeeze(1) + self.first_order(wide, dense)  # [B]
