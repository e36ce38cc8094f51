"""The dense models the benchmarks train: today's small DLRM and one of MLPerf's shape.

- ``small``: tierec's default DLRM (bottom 64-32-D, top 64-32-1), dim 16;
- ``mlperf``: DLRM with MLPerf's DLRM dims: bottom 512-256-128, top
  1024-1024-512-256-1, embedding dim 128.

>>> from benchmarks.models import model_config
>>> cfg, dim = model_config("mlperf")
>>> cfg.bottom_mlp, cfg.top_mlp, dim
([512, 256], [1024, 1024, 512, 256], 128)
"""

from __future__ import annotations

from tierec.config import ModelConfig

# name -> (bottom MLP before the projection to dim, top MLP before the logit, default dim)
MODELS = {
    "small": (None, None, 16),
    "mlperf": ([512, 256], [1024, 1024, 512, 256], 128),
}


def model_config(name: str, dim: int = 0) -> tuple[ModelConfig, int]:
    """The DLRM config of benchmark model ``name`` and its embedding dim (``dim`` > 0 overrides it)."""
    if name not in MODELS:
        raise ValueError(f"unknown benchmark model {name!r}; choose one of {sorted(MODELS)}")
    bottom, top, default_dim = MODELS[name]
    cfg = ModelConfig(name="dlrm") if bottom is None else ModelConfig(name="dlrm", bottom_mlp=bottom, top_mlp=top)
    return cfg, dim or default_dim
