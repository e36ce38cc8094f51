"""DLRM (Naumov et al., 2019): bottom MLP, pairwise dot interaction, top MLP.

The bottom MLP maps the dense features to one more ``D``-dim vector
(``bottom_mlp`` then a layer of width ``D``, ReLU after each). It is stacked with
the ``F`` sparse embeddings and all pairwise dot products are taken (strict upper
triangle); the top MLP sees ``[bottom_out, interactions]`` and ends in one logit.
Without dense features the bottom MLP has no input and is reduced to its bias,
a learned constant vector stacked with the embeddings like the dense vector:
its dot with an id's embedding is that id's own term. ``model.first_order =
"auto"`` adds the sum of the ids' first-order weights (``wide``) to the logit
there as well (tierec.models.base).

>>> import torch
>>> from tierec.config import ModelConfig
>>> from tierec.models.dlrm import DLRM
>>> m = DLRM(ModelConfig(bottom_mlp=[8], top_mlp=[8]), n_dense=3, n_sparse=4, dim=2)
>>> m(torch.randn(5, 3), torch.randn(5, 4, 2), None).shape
torch.Size([5])
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tierec.config import ModelConfig
from tierec.models.base import CTRModel, output_layer
from tierec.models.first_order import optional_first_order
from tierec.models.layers import MLP, DotInteraction


class DLRM(CTRModel):
    def __init__(self, cfg: ModelConfig, n_dense: int, n_sparse: int, dim: int) -> None:
        super().__init__(n_dense, n_sparse, dim, first_order=optional_first_order(cfg, n_dense))
        self.bottom = MLP(n_dense, [*cfg.bottom_mlp, dim], cfg.dropout) if n_dense > 0 else None
        # Without dense features the bottom MLP has no input, and what is left of it is its bias: a learned
        # constant vector. Stacked with the embeddings, its dot with an id's vector is a term of that id's
        # own, learned through the embedding as the dense vector's dot is on data with dense features.
        self.constant = nn.Parameter(torch.empty(dim).uniform_(-(dim**-0.5), dim**-0.5)) if n_dense == 0 else None
        n_vectors = n_sparse + 1
        self.interaction = DotInteraction(n_vectors)
        top_in = self.interaction.out_dim + (dim if n_dense > 0 else 0)
        self.top = MLP(top_in, cfg.top_mlp, cfg.dropout)
        self.out = output_layer(self.top.out_dim)

    def forward(self, dense: Tensor, emb: Tensor, wide: Tensor | None = None) -> Tensor:
        self.check_inputs(dense, emb, wide)
        dense = self.dense_scale(dense)
        if self.bottom is None:
            constant = self.constant.to(emb.dtype).expand(emb.shape[0], 1, -1)  # [B, 1, D]
            top_in = self.interaction(torch.cat([constant, emb], dim=1))  # [B, (F + 1) F / 2]
        else:
            bottom = self.bottom(dense)  # [B, D]
            # Under autocast the bottom MLP's output is bf16 and the embeddings fp32: cat would promote
            # to fp32 and the interaction cast the copy back. Casting the embeddings first gives the
            # same bf16 vectors in one pass fewer each way (their gradient comes back in fp32).
            vectors = torch.cat([bottom.unsqueeze(1), emb.to(bottom.dtype)], dim=1)  # [B, F + 1, D]
            top_in = torch.cat([bottom, self.interaction(vectors)], dim=1)  # [B, D + (F + 1) F / 2]
        return self.out(self.top(top_in)).squeeze(1) + self.first_order(wide, dense)  # [B]
