"""Layers against written-out loop references."""

from __future__ import annotations

import pytest
import torch

from tierec.models.layers import MLP, CrossLayer, CrossNetV2, DotInteraction, FactorizationMachine


def test_dot_interaction_matches_loop() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 5, 4, dtype=torch.float64)  # [B, N, D]
    out = DotInteraction(5).to(torch.float64)(x)
    expected = []
    for b in range(3):
        row = []
        for i in range(5):
            for j in range(i + 1, 5):
                row.append(sum(x[b, i, d] * x[b, j, d] for d in range(4)))
        expected.append(torch.stack(row))
    assert out.shape == (3, 10)
    torch.testing.assert_close(out, torch.stack(expected))


def test_dot_interaction_gradient_matches_autograd() -> None:
    # The hand-written backward against autograd through bmm + index_select, and gradcheck.
    torch.manual_seed(0)
    layer = DotInteraction(6).to(torch.float64)
    x = torch.randn(4, 6, 3, dtype=torch.float64, requires_grad=True)
    g = torch.randn(4, 15, dtype=torch.float64)
    layer(x).backward(g)
    x_ref = x.detach().clone().requires_grad_(True)
    ref = torch.bmm(x_ref, x_ref.transpose(1, 2)).flatten(1)[:, layer.pair_index]
    ref.backward(g)
    torch.testing.assert_close(x.grad, x_ref.grad)
    assert torch.autograd.gradcheck(layer, (x.detach().clone().requires_grad_(True),))


def test_dot_interaction_needs_two_features() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        DotInteraction(1)


def test_fm_matches_loop() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 4, 6, dtype=torch.float64)  # [B, F, D]
    out = FactorizationMachine()(x)
    expected = torch.zeros(3, dtype=torch.float64)
    for b in range(3):
        for i in range(4):
            for j in range(i + 1, 4):
                expected[b] += torch.dot(x[b, i], x[b, j])
    torch.testing.assert_close(out, expected)


def test_cross_low_rank_equals_full_rank_with_product_weight() -> None:
    torch.manual_seed(0)
    d, r = 7, 3
    low = CrossNetV2(d, num_layers=2, rank=r).double()
    full = CrossNetV2(d, num_layers=2, rank=0).double()
    with torch.no_grad():
        for lo, fu in zip(low.layers, full.layers):
            fu.full.weight.copy_(lo.up.weight @ lo.down.weight)  # W = U V^T
            fu.full.bias.copy_(lo.up.bias)
    x0 = torch.randn(5, d, dtype=torch.float64)
    torch.testing.assert_close(low(x0), full(x0))


def test_cross_layer_formula() -> None:
    torch.manual_seed(0)
    layer = CrossLayer(4).double()
    x0, x = torch.randn(2, 4, dtype=torch.float64), torch.randn(2, 4, dtype=torch.float64)
    w, b = layer.full.weight, layer.full.bias
    torch.testing.assert_close(layer(x0, x), x0 * (x @ w.T + b) + x)


def test_mlp_last_layer_activation() -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 3)
    assert (MLP(3, [4, 2])(x) >= 0).all()
    assert (MLP(3, [4, 2], activate_last=False)(x) < 0).any()
    assert MLP(3, []).out_dim == 3
    with pytest.raises(ValueError):
        MLP(3, [0])


@pytest.mark.parametrize("n", [5, 27, 40])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dot_interaction_in_half_precision_equals_the_gather_path(n: int, dtype: torch.dtype) -> None:
    # Half precision takes the rows' slices forward and a 0/1 product backward (27 vectors), or the gather
    # backward (40): both equal, to the bit, the gathers of the float32 path done in the same dtype.
    torch.manual_seed(n)
    layer = DotInteraction(n)
    x = torch.randn(64, n, 8).to(dtype).requires_grad_(True)
    g = torch.randn(64, n * (n - 1) // 2).to(dtype)
    out = layer(x)
    out.backward(g)
    x_ref = x.detach().clone()
    gram = torch.bmm(x_ref, x_ref.transpose(1, 2))
    assert torch.equal(out, torch.gather(gram.flatten(1), 1, layer.pair_index.expand(64, -1)))
    padded = torch.cat([g.new_zeros(64, 1), g], dim=1)
    sym = torch.gather(padded, 1, layer.sym_source.expand(64, -1)).view(64, n, n)
    assert torch.equal(x.grad, torch.bmm(sym, x_ref))
    assert (layer.pair_select.numel() > 0) == (n <= 32)
