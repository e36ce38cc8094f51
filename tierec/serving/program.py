"""The dense model of an export: a ``torch.export`` program, saved as ``.pt2`` and run under the run's precision.

The program takes ``(dense [B, n_dense], emb [B, F, D], wide [B, F])`` with a
dynamic batch size and returns logits ``[B]``; ``wide`` (first-order weights)
is read only by models that have first-order terms (zeros may be passed
otherwise). It is the run's model in eval mode (no dropout). The run's
``train.precision`` is kept: under ``bf16`` (or ``auto`` on a CPU with native
bf16, the rule of tierec/train/precision.py) it runs in bf16 autocast, as
``tierec predict`` does, with float32 logits.

>>> import tempfile, os, torch
>>> from tierec.config import ModelConfig
>>> from tierec.models import build_model
>>> model = build_model(ModelConfig(bottom_mlp=[8], top_mlp=[8]), n_dense=3, n_sparse=4, dim=2)
>>> path = os.path.join(tempfile.mkdtemp(), "model.pt2")
>>> save_program(model, path, n_dense=3, n_sparse=4, dim=2)
>>> p = DenseProgram.load(path, precision="fp32")
>>> x = (torch.randn(5, 3), torch.randn(5, 4, 2), torch.zeros(5, 4))
>>> torch.allclose(p(*x), model.eval()(x[0], x[1], None))
True

:meth:`DenseProgram.with_weights` is the same program with other weights (a delta checkpoint's dense
model, ``tierec serve --follow``): the same module called with those tensors in place of its own
(``torch.func.functional_call``), so taking up a delta builds no module and the loaded one is untouched.

>>> other = build_model(ModelConfig(bottom_mlp=[8], top_mlp=[8]), n_dense=3, n_sparse=4, dim=2)
>>> q = p.with_weights(other.state_dict())
>>> torch.allclose(q(*x), other.eval()(x[0], x[1], None)), torch.allclose(p(*x), model(x[0], x[1], None))
(True, True)
"""

from __future__ import annotations

import os
import warnings

import torch
from torch import Tensor, nn

from tierec.models import CTRModel
from tierec.serving.manifest import ExportError
from tierec.train.precision import autocast_dtype

MAX_BATCH = 1 << 20  # rows per call the program accepts


class _WithWide(nn.Module):
    """The model with ``wide`` always given (ignored by a model without first-order terms)."""

    def __init__(self, model: CTRModel) -> None:
        super().__init__()
        self.model = model
        self.uses_wide = model.uses_wide

    def forward(self, dense: Tensor, emb: Tensor, wide: Tensor) -> Tensor:
        return self.model(dense, emb, wide if self.uses_wide else None)


def save_program(model: CTRModel, path: str | os.PathLike, *, n_dense: int, n_sparse: int, dim: int) -> None:
    """``torch.export`` the model (eval mode, float32) for any batch size and save it to ``path``."""
    was_training = model.training
    model.eval()
    try:
        b = 4
        example = (torch.zeros(b, n_dense), torch.zeros(b, n_sparse, dim), torch.zeros(b, n_sparse))
        batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
        shapes = ({0: batch}, {0: batch}, {0: batch})
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.export.export(_WithWide(model), example, dynamic_shapes=shapes)
        torch.export.save(program, path)
    finally:
        model.train(was_training)


class DenseProgram:
    """A loaded program, called like the model: ``program(dense, emb, wide) -> logits [B]`` float32."""

    def __init__(self, program: torch.export.ExportedProgram, precision: str, module: nn.Module | None = None,
                 weights: dict[str, Tensor] | None = None) -> None:  # fmt: skip
        self.program = program
        self.precision = precision
        self.module = program.module() if module is None else module  # never changed once built
        self.weights = weights  # the module's tensors to call it with instead of its own (with_weights)
        self.dtype = autocast_dtype(precision, "cpu")

    @staticmethod
    def load(path: str | os.PathLike, precision: str) -> DenseProgram:
        try:
            program = torch.export.load(path)
        except Exception as e:  # noqa: BLE001 - a damaged or foreign file is one line
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            raise ExportError(f"cannot load the dense program {path} ({first})") from None
        return DenseProgram(program, precision)

    def with_weights(self, state: dict[str, Tensor]) -> DenseProgram:
        """This program with the model weights ``state`` (the model's ``state_dict``: same keys and shapes, else
        an ExportError); this one keeps its own."""
        own = self.module.state_dict()
        weights = {f"model.{k}": v for k, v in state.items()}
        if weights.keys() != own.keys():
            diff = sorted(weights.keys() ^ own.keys())
            raise ExportError(f"the dense weights do not fit the exported program (keys differ: {diff[:3]})")
        for k, v in weights.items():
            if v.shape != own[k].shape or v.dtype != own[k].dtype:
                raise ExportError(f"the dense weights do not fit the exported program ({k}: {tuple(v.shape)} "
                                  f"{v.dtype}, the program has {tuple(own[k].shape)} {own[k].dtype})")
        return DenseProgram(self.program, self.precision, self.module, weights)

    def _run(self, dense: Tensor, emb: Tensor, wide: Tensor) -> Tensor:
        if self.weights is None:
            return self.module(dense, emb, wide)
        return torch.func.functional_call(self.module, self.weights, (dense, emb, wide))

    def __call__(self, dense: Tensor, emb: Tensor, wide: Tensor) -> Tensor:
        with torch.inference_mode():  # no autograd bookkeeping at all (cheaper than no_grad per call)
            if self.dtype is None:
                return self._run(dense, emb, wide).float()
            with torch.autocast("cpu", dtype=self.dtype):
                return self._run(dense, emb, wide).float()
