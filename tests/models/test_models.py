"""The four models: shapes, gradient flow, learning a planted problem."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score

from tierec.config import ConfigError, ModelConfig
from tierec.models import CTRModel, build_model, has_first_order, model_class

N_DENSE, N_SPARSE, DIM = 5, 4, 8
CONFIGS = {
    "dlrm": ModelConfig(name="dlrm", bottom_mlp=[16], top_mlp=[16, 8]),
    "deepfm": ModelConfig(name="deepfm", deep_mlp=[16, 8]),
    "dcnv2": ModelConfig(name="dcnv2", deep_mlp=[16, 8], cross_layers=2),
    "dcnv2_lowrank": ModelConfig(name="dcnv2", deep_mlp=[16], cross_layers=2, cross_rank=4),
    "widedeep": ModelConfig(name="widedeep", deep_mlp=[16, 8]),
}


def inputs(b: int, seed: int = 0, n_dense: int = N_DENSE) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(b, n_dense, generator=g)  # [B, n_dense]
    emb = torch.randn(b, N_SPARSE, DIM, generator=g) / DIM**0.5  # [B, F, D]
    wide = torch.randn(b, N_SPARSE, generator=g) * 0.1  # [B, F]
    return dense, emb, wide


def make(key: str, n_dense: int = N_DENSE) -> CTRModel:
    torch.manual_seed(0)
    return build_model(CONFIGS[key], n_dense=n_dense, n_sparse=N_SPARSE, dim=DIM)


@pytest.mark.parametrize("key", list(CONFIGS))
@pytest.mark.parametrize("n_dense", [N_DENSE, 0])
def test_output_shape(key: str, n_dense: int) -> None:
    model = make(key, n_dense)
    dense, emb, wide = inputs(6, n_dense=n_dense)
    out = model(dense, emb, wide if model.uses_wide else None)
    assert out.shape == (6,) and out.dtype == torch.float32 and torch.isfinite(out).all()


def test_first_order_flags() -> None:
    names = ["dlrm", "deepfm", "dcnv2", "widedeep"]
    assert {n: model_class(n).first_order_by_design for n in names} == {"dlrm": False, "deepfm": True, "dcnv2": False, "widedeep": True}
    for first_order, with_dense, id_only in [("auto", False, True), ("on", True, True), ("off", False, False)]:
        for n in ["dlrm", "dcnv2"]:
            cfg = ModelConfig(name=n, first_order=first_order)
            assert (has_first_order(cfg, 3), has_first_order(cfg, 0)) == (with_dense, id_only), (n, first_order)
            assert build_model(cfg, 3, N_SPARSE, DIM).uses_wide == with_dense
            assert build_model(cfg, 0, N_SPARSE, DIM).uses_wide == id_only
    with pytest.raises(ConfigError, match='model.first_order = "off" does not apply to deepfm'):
        ModelConfig(name="deepfm", first_order="off")
    with pytest.raises(ConfigError, match="model.first_order 'yes' is not one of"):
        ModelConfig(first_order="yes")


@pytest.mark.parametrize("name", ["dlrm", "dcnv2"])
def test_first_order_adds_the_ids_weights_to_the_logit(name: str) -> None:
    """On id-only data the logit is the architecture's own plus the sum of the first-order weights."""
    model = make(name, n_dense=0)
    dense, emb, wide = inputs(6, n_dense=0)
    with pytest.raises(ValueError, match="needs wide"):
        model(dense, emb, None)
    shifted = wide.clone()
    shifted[:, 1] += 2.0
    torch.testing.assert_close(model(dense, emb, shifted) - model(dense, emb, wide), torch.full((6,), 2.0))


@pytest.mark.parametrize("name", ["dlrm", "dcnv2"])
def test_first_order_on_data_with_dense_features_adds_a_linear_dense_term_from_zero(name: str) -> None:
    """With first-order terms and dense features, DLRM and DCN-v2 add the linear dense term a logistic regression
    has (DeepFM and Wide&Deep have theirs by design): weights from 0, so at init the logit is the model without it;
    it learns, and a checkpoint written before it existed loads as 0 there."""
    torch.manual_seed(0)
    on = build_model(ModelConfig(name=name, first_order="on"), N_DENSE, N_SPARSE, DIM)
    torch.manual_seed(0)
    off = build_model(ModelConfig(name=name, first_order="off"), N_DENSE, N_SPARSE, DIM)
    assert off.dense_first_order_weight is None
    assert build_model(ModelConfig(name=name, first_order="on"), 0, N_SPARSE, DIM).dense_first_order_weight is None
    assert make("deepfm").dense_first_order_weight is None and make("widedeep").dense_first_order_weight is None
    w = on.dense_first_order_weight
    assert w is not None and w.shape == (N_DENSE,) and not w.any()
    shared = {k: v for k, v in on.state_dict().items() if k != "dense_first_order_weight"}
    assert shared.keys() == off.state_dict().keys()
    assert all(torch.equal(v, off.state_dict()[k]) for k, v in shared.items())  # no random numbers drawn for it
    dense, emb, wide = inputs(6)
    torch.testing.assert_close(on(dense, emb, wide), off(dense, emb, None) + wide.sum(1))
    with torch.no_grad():
        w.copy_(torch.arange(N_DENSE, dtype=torch.float32))
    torch.testing.assert_close(on(dense, emb, wide), off(dense, emb, None) + wide.sum(1) + dense @ w)
    F.binary_cross_entropy_with_logits(on(dense, emb, wide), (torch.arange(6) % 2).float()).backward()
    assert w.grad is not None and w.grad.abs().sum() > 0
    on.load_state_dict(shared)  # strict: a checkpoint from before the term
    assert not on.dense_first_order_weight.any()


def test_dlrm_without_dense_features_dots_a_learned_constant_with_each_id() -> None:
    """With no dense input the bottom MLP is reduced to its bias: a learned vector stacked with the embeddings,
    so each id's vector has a term of its own (<constant, e_i>) as it has <bottom(dense), e_i> with dense features."""
    model = make("dlrm", n_dense=0)
    dense, emb, wide = inputs(6, n_dense=0)
    assert model.bottom is None and model.constant.shape == (DIM,)
    vectors = torch.cat([model.constant.expand(6, 1, DIM), emb], dim=1)  # [B, F + 1, D]
    rows, cols = torch.triu_indices(N_SPARSE + 1, N_SPARSE + 1, offset=1)
    dots = torch.einsum("bid,bjd->bij", vectors, vectors)[:, rows, cols]  # plain reference of the interaction
    expected = model.out(model.top(dots)).squeeze(1) + wide.sum(1)
    torch.testing.assert_close(model(dense, emb, wide), expected)
    model(dense, emb, wide).sum().backward()
    assert model.constant.grad is not None and model.constant.grad.abs().sum() > 0
    assert make("dlrm").constant is None  # with dense features the bottom MLP's vector plays that part


@pytest.mark.parametrize("key", list(CONFIGS))
def test_gradients_reach_every_parameter(key: str) -> None:
    model = make(key)
    if key == "deepfm":  # the FM weight starts at 0, which blocks the gradient of the FM's own inputs
        with torch.no_grad():
            model.fm_weight.fill_(0.5)
    dense, emb, wide = (t.requires_grad_() for t in inputs(32))
    logits = model(dense, emb, wide if model.uses_wide else None)
    F.binary_cross_entropy_with_logits(logits, (torch.arange(32) % 2).float()).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert emb.grad is not None and emb.grad.abs().sum() > 0
    if model.uses_wide:
        assert wide.grad is not None and wide.grad.abs().sum() > 0


@pytest.mark.parametrize("key", list(CONFIGS))
def test_learns_planted_problem(key: str) -> None:
    """Labels from a known logistic model with dense, first-order and pairwise terms.

    Full-batch Adam on 1024 rows: training loss must fall clearly and the
    ranking must carry over to 1024 held-out rows.
    """
    dense, emb, wide = inputs(2048, seed=1)
    g = torch.Generator().manual_seed(2)
    w_dense = torch.randn(N_DENSE, generator=g)
    true_logit = dense @ w_dense + 4.0 * (emb[:, 0] * emb[:, 1]).sum(1) + 3.0 * wide.sum(1)
    labels = torch.bernoulli(torch.sigmoid(2.0 * true_logit), generator=g)  # [2048]
    train, test = slice(0, 1024), slice(1024, None)

    model = make(key)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    def logits(rows: slice) -> torch.Tensor:
        return model(dense[rows], emb[rows], wide[rows] if model.uses_wide else None)

    with torch.no_grad():
        before = F.binary_cross_entropy_with_logits(logits(train), labels[train]).item()
    for _ in range(100):
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(logits(train), labels[train])
        loss.backward()
        opt.step()
    after = loss.item()
    assert after < 0.75 * before and after < 0.5, (before, after)
    with torch.no_grad():
        held_out_auc = roc_auc_score(labels[test].numpy(), logits(test).numpy())
    assert held_out_auc > 0.65, held_out_auc


def test_shape_errors_are_clear() -> None:
    model = make("deepfm")
    dense, emb, wide = inputs(3)
    with pytest.raises(ValueError, match=r"expected \[B, 4, 8\]"):
        model(dense, emb[:, :3], wide)
    with pytest.raises(ValueError, match="needs wide"):
        model(dense, emb, None)
    with pytest.raises(ValueError, match="dense has shape"):
        model(dense[:, :2], emb, wide)


def test_unknown_model_and_bad_config() -> None:
    with pytest.raises(ValueError, match="unknown model"):
        model_class("xgboost")
    with pytest.raises(ConfigError, match="dropout"):
        ModelConfig(dropout=1.5)
    with pytest.raises(ConfigError, match="top_mlp"):
        ModelConfig(top_mlp=[0])


def test_dropout_only_in_training_mode() -> None:
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="dlrm", dropout=0.5), N_DENSE, N_SPARSE, DIM).eval()
    dense, emb, _ = inputs(4)
    torch.testing.assert_close(model(dense, emb), model(dense, emb))
