"""When a model without first-order terms by design gets them: ``model.first_order``.

DLRM's interactions are dots between vectors. With dense features, the bottom
MLP's vector dotted with an id's embedding acts as that id's bias; without dense
features (id-only data such as user and item columns) DLRM dots a learned
constant vector instead (tierec/models/dlrm.py). Before either, DLRM had no
per-id term there and scored test AUC 0.50 where item popularity reaches 0.72
(docs/models.md, "Id-only data"). The dim-1 tables add the per-id bias a
logistic regression has, learned directly: ``"auto"`` adds them on data without
dense features, ``"on"`` always (what ``tierec train`` chooses below 20,000
training rows, tierec/train/sizing.py), ``"off"`` never. DCN-v2 follows the same
key. On data with dense features, first-order terms also bring the linear dense
term a logistic regression has (one weight per scaled column, from 0:
``CTRModel.dense_first_order_weight``), as DeepFM and Wide&Deep have by design.

>>> from tierec.config import ModelConfig
>>> optional_first_order(ModelConfig(name="dlrm"), n_dense=13), optional_first_order(ModelConfig(name="dlrm"), n_dense=0)
(False, True)
>>> optional_first_order(ModelConfig(name="dcnv2", first_order="on"), n_dense=13)
True
"""

from __future__ import annotations

from tierec.config import ModelConfig


def optional_first_order(cfg: ModelConfig, n_dense: int) -> bool:
    """Whether ``cfg`` asks for first-order terms on data with ``n_dense`` dense features."""
    return cfg.first_order == "on" or (cfg.first_order == "auto" and n_dense == 0)
