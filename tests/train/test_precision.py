"""train.precision and train.compile: bf16 autocast against fp32, detection, the compiled model against eager.

Tolerances of bf16 against fp32. bfloat16 keeps 8 significant bits (relative
rounding 2^-9) and autocast rounds every matmul's inputs and output:

- the dot interaction alone: relative error ``||a - b|| / ||b|| <= 3e-2`` of its
  output and of its input gradient;
- whole models: logits within 2e-2 relative error (measured <= 0.0074 over
  4 models x 3 seeds). Gradients are sensitive to ReLU units whose input lies
  within bf16 rounding of 0 (they switch, and a few samples' gradients change
  wholesale), so: >= 90 % of the samples' embedding gradients within 3e-2
  (measured >= 96 %), and every gradient (embedding, each parameter) at cosine
  similarity >= 0.98 with fp32's (measured relative error <= 0.12, cosine >= 0.99).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tierec.config import ConfigError, ModelConfig, TrainConfig
from tierec.models import build_model
from tierec.models.layers import DotInteraction
from tierec.train.precision import DenseStep, autocast_dtype, native_bf16

BF16_REL_TOL = 3e-2


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(F.cosine_similarity(a.detach().float().flatten(), b.detach().float().flatten(), dim=0))


def test_dot_interaction_under_bf16_autocast_matches_fp32() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 9, 8, generator=g)
    grad_out = torch.randn(64, 36, generator=g)
    layer = DotInteraction(9)
    ref_x = x.clone().requires_grad_(True)
    ref = layer(ref_x)
    ref.backward(grad_out)
    bf_x = x.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(bf_x)
    assert out.dtype == torch.bfloat16  # computed in bf16, like a bmm under autocast
    out.backward(grad_out.bfloat16())
    assert bf_x.grad is not None and bf_x.grad.dtype == torch.float32  # the input's own dtype
    assert rel_err(out, ref) < BF16_REL_TOL
    assert rel_err(bf_x.grad, ref_x.grad) < BF16_REL_TOL


def _loss_and_grads(model, step: DenseStep, dense, emb, wide, labels):
    model.zero_grad(set_to_none=True)
    emb = emb.clone().requires_grad_(True)
    wide = None if wide is None else wide.clone().requires_grad_(True)
    logits = step(dense, emb, wide)
    F.binary_cross_entropy_with_logits(logits, labels).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return logits.detach(), emb.grad, grads


@pytest.mark.parametrize("name", ["dlrm", "deepfm", "dcnv2", "widedeep"])
def test_bf16_step_matches_fp32_and_keeps_fp32_master_weights(name: str) -> None:
    torch.manual_seed(0)
    model = build_model(ModelConfig(name=name, bottom_mlp=[32], top_mlp=[32], deep_mlp=[32]), n_dense=5, n_sparse=6, dim=8)
    g = torch.Generator().manual_seed(1)
    dense, emb, wide = torch.randn(256, 5, generator=g), 0.3 * torch.randn(256, 6, 8, generator=g), torch.randn(256, 6, generator=g)
    labels = (torch.rand(256, generator=g) < 0.3).float()
    wide = wide if model.uses_wide else None
    ref = _loss_and_grads(model, DenseStep(model, precision="fp32"), dense, emb, wide, labels)
    got = _loss_and_grads(model, DenseStep(model, precision="bf16"), dense, emb, wide, labels)
    assert got[0].dtype == torch.float32  # logits come back in fp32
    assert rel_err(got[0], ref[0]) < 2e-2
    assert got[1].dtype == torch.float32  # the embedding gradient the fused optimizers see
    per_sample = (got[1] - ref[1]).norm(dim=(1, 2)) / ref[1].norm(dim=(1, 2))
    assert float((per_sample < 3e-2).float().mean()) >= 0.9
    assert cosine(got[1], ref[1]) >= 0.98
    for n, p in model.named_parameters():
        assert p.dtype == torch.float32 and got[2][n].dtype == torch.float32, n  # fp32 master weights and grads
        if not ref[2][n].any():  # e.g. DeepFM's dense field while its FM weight is still 0
            assert not got[2][n].any(), n
            continue
        assert cosine(got[2][n], ref[2][n]) >= 0.98, n


def test_auto_follows_the_cpu_flags(monkeypatch) -> None:
    monkeypatch.delenv("TIEREC_CPU_BF16", raising=False)
    assert native_bf16("cpu", flags={"avx2", "avx512f", "avx512_bf16"})
    assert native_bf16("cpu", flags={"amx_bf16", "amx_tile"})
    assert not native_bf16("cpu", flags={"avx2", "avx512f", "fma"})
    monkeypatch.setenv("TIEREC_CPU_BF16", "0")
    assert autocast_dtype("auto") is None and autocast_dtype("bf16") == torch.bfloat16
    monkeypatch.setenv("TIEREC_CPU_BF16", "1")
    assert autocast_dtype("auto") == torch.bfloat16 and autocast_dtype("fp32") is None
    with pytest.raises(ValueError, match="precision"):
        autocast_dtype("fp16")


def test_auto_without_native_bf16_is_the_fp32_path(monkeypatch) -> None:
    monkeypatch.setenv("TIEREC_CPU_BF16", "0")
    torch.manual_seed(0)
    model = build_model(ModelConfig(bottom_mlp=[8], top_mlp=[8]), n_dense=3, n_sparse=4, dim=4)
    dense, emb = torch.randn(16, 3), torch.randn(16, 4, 4)
    assert DenseStep(model, precision="auto").dtype is None
    assert torch.equal(DenseStep(model, precision="auto")(dense, emb, None), DenseStep(model, precision="fp32")(dense, emb, None))


def test_config_keys_are_validated() -> None:
    assert TrainConfig().precision == "auto" and TrainConfig().compile == "auto"
    with pytest.raises(ConfigError, match="train.precision"):
        TrainConfig(precision="fp16")
    with pytest.raises(ConfigError, match="train.compile"):
        TrainConfig(compile="yes")


def test_compiled_model_equals_eager() -> None:
    torch.manual_seed(0)
    model = build_model(ModelConfig(bottom_mlp=[8], top_mlp=[8]), n_dense=3, n_sparse=4, dim=4)
    g = torch.Generator().manual_seed(1)
    dense, emb, labels = torch.randn(32, 3, generator=g), torch.randn(32, 4, 4, generator=g), (torch.rand(32, generator=g) < 0.5).float()
    ref = _loss_and_grads(model, DenseStep(model, precision="fp32", compile="off"), dense, emb, None, labels)
    got = _loss_and_grads(model, DenseStep(model, precision="fp32", compile="on"), dense, emb, None, labels)
    torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[1], ref[1], rtol=1e-5, atol=1e-6)
    for n in ref[2]:
        torch.testing.assert_close(got[2][n], ref[2][n], rtol=1e-5, atol=1e-6)


def test_dlrm_bf16_casts_embeddings_before_the_cat_with_the_same_numbers() -> None:
    """DLRM casts the embeddings to the bottom output's dtype before stacking them; the reference
    stacks in fp32 (autocast's cat promotes) and lets the interaction cast: bitwise the same."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="dlrm", bottom_mlp=[32], top_mlp=[32]), n_dense=5, n_sparse=6, dim=8)
    g = torch.Generator().manual_seed(2)
    dense, emb = torch.randn(128, 5, generator=g), 0.3 * torch.randn(128, 6, 8, generator=g)

    def reference(dense, emb):
        bottom = model.bottom(dense)
        vectors = torch.cat([bottom.unsqueeze(1), emb], dim=1)
        assert vectors.dtype == torch.float32  # promoted
        return model.out(model.top(torch.cat([bottom, model.interaction(vectors)], dim=1))).squeeze(1)

    outs = []
    for fn in (reference, model):
        e = emb.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = fn(dense, e, None) if fn is model else fn(dense, e)
        logits.float().sum().backward()
        outs.append((logits.detach(), e.grad))
    assert outs[1][1].dtype == torch.float32
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
