"""How the dense model runs: its precision (``train.precision``) and compilation (``train.compile``).

``precision``:

- ``"fp32"``: everything in float32;
- ``"bf16"``: the dense model (MLPs, interaction) runs under ``torch.autocast``
  with bfloat16; weights, gradients and the optimizer's state stay float32
  (autocast casts the weights per op), and so do the embedding tables and their
  optimizer state;
- ``"auto"`` (default): ``"bf16"`` where the device computes bfloat16 natively
  (a CPU with AVX-512 BF16 or AMX, a CUDA device with bf16 support), ``"fp32"``
  elsewhere: on a CPU without those instructions bfloat16 is emulated and slower.

``compile``: ``"on"`` runs the model through ``torch.compile`` (its first steps
pay the compile time), ``"off"`` runs it eagerly, ``"auto"`` compiles where that
was measured to pay back within a run (docs/performance.md, "The dense step"):
currently never, so ``"auto"`` means off.

The logits always come back as float32, so the loss and the metrics are
computed in float32 whatever the precision.

The environment variable ``TIEREC_CPU_BF16=0`` (or ``1``) overrides the CPU
detection, e.g. to run ``auto``'s float32 fallback on a bf16-capable host.

>>> import torch
>>> from tierec.config import ModelConfig
>>> from tierec.models import build_model
>>> from tierec.train.precision import DenseStep
>>> model = build_model(ModelConfig(bottom_mlp=[8], top_mlp=[8]), n_dense=3, n_sparse=4, dim=2)
>>> step = DenseStep(model, precision="bf16")
>>> step.dtype, step(torch.randn(5, 3), torch.randn(5, 4, 2), None).dtype
(torch.bfloat16, torch.float32)
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor, nn

PRECISIONS = ("auto", "fp32", "bf16")
COMPILE_MODES = ("auto", "on", "off")
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of native bf16 arithmetic
ENV_OVERRIDE = "TIEREC_CPU_BF16"


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> set[str]:
    """The CPU feature flags listed in ``cpuinfo`` (empty when it cannot be read)."""
    try:
        for line in Path(cpuinfo).read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def native_bf16(device: str | torch.device = "cpu", flags: set[str] | None = None) -> bool:
    """Whether ``device`` computes bfloat16 natively (so bf16 autocast can pay off there)."""
    kind = torch.device(device).type
    if kind == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if kind != "cpu":
        return False
    override = os.environ.get(ENV_OVERRIDE, "")
    if override in ("0", "1"):
        return override == "1"
    return bool((cpu_flags() if flags is None else flags) & set(BF16_CPU_FLAGS))


def autocast_dtype(precision: str, device: str | torch.device = "cpu") -> torch.dtype | None:
    """The autocast dtype for ``precision`` on ``device``, or None for plain float32."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "bf16" or (precision == "auto" and native_bf16(device)):
        return torch.bfloat16
    return None


class DenseStep:
    """Calls a CTR model (or its data-parallel wrapper) under the run's precision, compiled or eager.

    The model itself is unchanged (its parameters, ``state_dict`` and checkpoints
    are the plain model's); a compiled copy shares its parameters.
    """

    def __init__(self, model: nn.Module, precision: str = "auto", compile: str = "off") -> None:
        if compile not in COMPILE_MODES:
            raise ValueError(f"compile must be one of {COMPILE_MODES}, got {compile!r}")
        params = list(model.parameters())
        self.device = params[0].device if params else torch.device("cpu")
        self.dtype = autocast_dtype(precision, self.device)
        self.model = model
        self.compiled: Callable[..., Tensor] | None = torch.compile(model, dynamic=False) if compile == "on" else None

    def __call__(self, dense: Tensor, emb: Tensor, wide: Tensor | None, module: nn.Module | None = None) -> Tensor:
        """Logits ``[B]`` in float32. ``module``: a wrapper of the model to call instead (e.g. DDP)."""
        fn = module if module is not None else (self.compiled if self.compiled is not None else self.model)
        ctx = torch.autocast(self.device.type, dtype=self.dtype) if self.dtype is not None else nullcontext()
        with ctx:
            logits = fn(dense, emb, wide)
        return logits.float()
