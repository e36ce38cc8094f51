"""The model zoo: DLRM, DeepFM, DCN-v2 and Wide&Deep behind one factory.

All models share ``forward(dense [B, n_dense], emb [B, F, D], wide [B, F] | None)
-> logits [B]``; ``model.uses_wide`` says whether ``wide`` (first-order, dim-1
embeddings per sparse feature) is needed, and :func:`has_first_order` says it
from the config before the model is built. See tierec.models.base.

>>> import torch
>>> from tierec.config import ModelConfig
>>> from tierec.models import build_model
>>> m = build_model(ModelConfig(name="deepfm"), n_dense=13, n_sparse=26, dim=16)
>>> m.uses_wide
True
>>> has_first_order(ModelConfig(name="dlrm"), n_dense=13), has_first_order(ModelConfig(name="dlrm"), n_dense=0)
(False, True)
>>> m(torch.randn(4, 13), torch.randn(4, 26, 16), torch.randn(4, 26)).shape
torch.Size([4])
"""

from __future__ import annotations

from tierec.config import ModelConfig
from tierec.models.base import CTRModel
from tierec.models.dcnv2 import DCNv2
from tierec.models.deepfm import DeepFM
from tierec.models.dlrm import DLRM
from tierec.models.first_order import optional_first_order
from tierec.models.widedeep import WideDeep

__all__ = ["CTRModel", "DCNv2", "DLRM", "DeepFM", "WideDeep", "build_model", "has_first_order", "model_class"]


def model_class(name: str) -> type[CTRModel]:
    """The model class for a ``model.name``."""
    classes: dict[str, type[CTRModel]] = {"dlrm": DLRM, "deepfm": DeepFM, "dcnv2": DCNv2, "widedeep": WideDeep}
    if name not in classes:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(classes)}")
    return classes[name]


def has_first_order(cfg: ModelConfig, n_dense: int) -> bool:
    """Whether the model of ``cfg`` on data with ``n_dense`` dense features has first-order (dim-1) tables."""
    return model_class(cfg.name).first_order_by_design or optional_first_order(cfg, n_dense)


def build_model(cfg: ModelConfig, n_dense: int, n_sparse: int, dim: int) -> CTRModel:
    """Build the model ``cfg.name`` for ``n_dense`` dense and ``n_sparse`` sparse features of width ``dim``."""
    return model_class(cfg.name)(cfg, n_dense, n_sparse, dim)
