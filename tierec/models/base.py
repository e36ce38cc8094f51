"""The contract every CTR model follows.

A model sees already-pooled embeddings, never ids: the embedding collection
(tierec.embedding) owns the tables. Inputs for a batch of ``B`` samples:

- ``dense``: ``[B, n_dense]`` float32 dense features, scaled first by
  ``self.dense_scale`` (identity until the trainer fits it: tierec.models.scaling);
- ``emb``: ``[B, F, D]`` the pooled embedding of each of the ``F`` sparse features;
- ``wide``: ``[B, F]`` pooled first-order (dim-1) embeddings, or ``None``.

``forward`` returns logits ``[B]``. First-order terms (a learned bias per id)
are one mechanism for every model: a model whose ``uses_wide`` is true needs
``wide`` (the trainer then keeps a second collection of dim-1 tables, never
pruned) and adds :meth:`CTRModel.first_order` to its logit. DeepFM and
Wide&Deep have them by design (``first_order_by_design``); DLRM and DCN-v2 get
them when ``model.first_order`` asks (:func:`tierec.models.has_first_order`);
then, with dense features, their first-order terms also hold a linear map of the
(scaled) dense features, as a logistic regression has and as DeepFM's and
Wide&Deep's do: ``dense_first_order``, a weight per column that starts at 0 (so
a checkpoint written before it existed loads with 0 there, the same model).

>>> import torch
>>> from tierec.models.base import CTRModel
>>> class Mean(CTRModel):
...     def forward(self, dense, emb, wide=None):
...         self.check_inputs(dense, emb, wide)
...         return emb.mean(dim=(1, 2))
>>> Mean(n_dense=2, n_sparse=3, dim=4)(torch.zeros(5, 2), torch.zeros(5, 3, 4), None).shape
torch.Size([5])
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from tierec.models.scaling import DenseScaler

# Bias of the final logit at initialisation: logit(0.25), near Criteo's click rate,
# so the first steps are not spent learning the base rate.
PRIOR_POSITIVE_RATE = 0.25
PRIOR_LOGIT = math.log(PRIOR_POSITIVE_RATE / (1.0 - PRIOR_POSITIVE_RATE))


class CTRModel(nn.Module):
    """Base class: stores the input sizes and checks input shapes."""

    first_order_by_design: ClassVar[bool] = False

    def __init__(self, n_dense: int, n_sparse: int, dim: int, first_order: bool = False) -> None:
        super().__init__()
        if n_dense < 0 or n_sparse < 1 or dim < 1:
            raise ValueError(f"need n_dense >= 0, n_sparse >= 1, dim >= 1; got {n_dense}, {n_sparse}, {dim}")
        self.n_dense = n_dense
        self.n_sparse = n_sparse
        self.dim = dim
        self.uses_wide = first_order or self.first_order_by_design
        self.dense_scale = DenseScaler(n_dense)  # the first layer on `dense`: the training split's statistics
        # Models whose first-order terms are optional (DLRM, DCN-v2) get the dense part of them here; DeepFM and
        # Wide&Deep have their own. Zeros, not a random init: no random function of the dense features in the logit
        # at step 0, and no random numbers drawn (the other layers' initial values are what they were without it).
        self.dense_first_order_weight = (
            nn.Parameter(torch.zeros(n_dense)) if first_order and n_dense > 0 and not self.first_order_by_design else None
        )

    def first_order(self, wide: Tensor | None, dense: Tensor | None = None) -> Tensor | float:  # -> [B], or 0.0
        """The sum of the ids' first-order weights, the part of the logit that is a per-id bias; plus, where this
        model keeps ``dense_first_order_weight``, its dot with ``dense`` (already scaled)."""
        if not self.uses_wide:
            return 0.0
        assert wide is not None  # check_inputs demands it
        out = wide.sum(dim=1)
        if self.dense_first_order_weight is not None and dense is not None:
            out = out + dense @ self.dense_first_order_weight.to(dense.dtype)
        return out

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        # A checkpoint from before the dense first-order weights: they start at 0, so 0 is that model exactly.
        key = prefix + "dense_first_order_weight"
        if self.dense_first_order_weight is not None and key not in state_dict:
            state_dict[key] = torch.zeros_like(self.dense_first_order_weight)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def check_inputs(self, dense: Tensor, emb: Tensor, wide: Tensor | None) -> None:
        """Raise ValueError naming the expected shapes when inputs do not match."""
        b = emb.shape[0]
        if emb.dim() != 3 or tuple(emb.shape[1:]) != (self.n_sparse, self.dim):
            raise ValueError(f"emb has shape {tuple(emb.shape)}, expected [B, {self.n_sparse}, {self.dim}]")
        if tuple(dense.shape) != (b, self.n_dense):
            raise ValueError(f"dense has shape {tuple(dense.shape)}, expected [{b}, {self.n_dense}]")
        if self.uses_wide:
            if wide is None:
                raise ValueError(f"{type(self).__name__} needs wide (first-order) embeddings, got None")
            if tuple(wide.shape) != (b, self.n_sparse):
                raise ValueError(f"wide has shape {tuple(wide.shape)}, expected [{b}, {self.n_sparse}]")

    def forward(self, dense: Tensor, emb: Tensor, wide: Tensor | None = None) -> Tensor:  # -> [B] logits
        raise NotImplementedError


def output_layer(in_dim: int) -> nn.Linear:
    """The final ``in_dim -> 1`` logit layer: Xavier weights, bias at the prior logit."""
    layer = nn.Linear(in_dim, 1)
    nn.init.xavier_uniform_(layer.weight)
    nn.init.constant_(layer.bias, PRIOR_LOGIT)
    return layer


def dense_linear(n_dense: int, out_dim: int) -> nn.Linear | None:
    """A bias-free Xavier linear map of the dense features, or None when there are none."""
    if n_dense == 0:
        return None
    layer = nn.Linear(n_dense, out_dim, bias=False)
    nn.init.xavier_uniform_(layer.weight)
    return layer
