"""When a model without first-order terms by design gets them: ``model.first_order``.

DLRM's interactions are dots between vectors. With dense features, the bottom
MLP's vector dotted with an id's embedding acts as that id's bias; without dense
features (id-only data such as user and item columns) there is no such vector
and no id has a term of its own: test AUC 0.50 where item popularity reaches
0.72 (docs/models.md, "Id-only data"). ``"auto"`` adds the dim-1 tables there;
``"on"`` adds them always, ``"off"`` never. DCN-v2 follows the same key.

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
