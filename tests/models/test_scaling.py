"""Dense scaling: statistics of the training split inside the model, constant columns dropped, old checkpoints."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tierec.config import load_config
from tierec.data import open_source
from tierec.models.scaling import DenseScaler, DenseStats
from tierec.train.components import Components
from tierec.train.dense_stats import fit_to_training_split


def test_streamed_statistics_equal_the_whole_array() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(10_000, 3, generator=g, dtype=torch.float64) * torch.tensor([1.0, 1e3, 1e-3]) + torch.tensor([5.0, -2e6, 0.1])
    stats = DenseStats(3)
    for part in x.split(777):
        stats.add(part)
    np.testing.assert_allclose(stats.mean.numpy(), x.mean(0).numpy(), rtol=1e-12)
    np.testing.assert_allclose(stats.std.numpy(), x.std(0, unbiased=False).numpy(), rtol=1e-9)


def test_the_trainer_fits_the_training_split_and_drops_a_constant_column(tmp_path: Path) -> None:
    rows = ["label,price,hour,user"] + [f"{i % 2},{(i * 37) % 101 / 10},{14102100},u{i % 50}" for i in range(400)]
    (tmp_path / "f.csv").write_text("\n".join(rows) + "\n")
    cfg = load_config(None, [f"data.source={tmp_path / 'f.csv'}", "data.test_rows=100", "data.schema.label=\"label\"",
                             "data.schema.dense=[\"price\", \"hour\"]", "data.schema.categorical=[\"user\"]",
                             "data.schema.dense_transform=\"none\""])
    source = open_source(cfg.data, "train", 64)
    parts = Components.build(cfg, source.feature_names, source.n_dense)
    said: list[str] = []
    fit_to_training_split(cfg, parts, source, said.append)
    price = np.array([(i * 37) % 101 / 10 for i in range(300)], dtype=np.float32)  # the first 300 rows: the training split
    scale = parts.model.dense_scale
    assert abs(float(scale.mean[0]) - price.mean()) < 1e-4 and abs(1 / float(scale.inv_std[0]) - price.std()) < 1e-4
    assert float(scale.inv_std[1]) == 0.0  # `hour` is one value: dropped
    assert said == ["dense column 'hour' is constant in the training split (1.41021e+07): dropped"]
    out = scale(torch.tensor([[price.mean(), 14102100.0]]))
    assert torch.allclose(out, torch.zeros(1, 2), atol=1e-5)


def test_a_checkpoint_from_before_scaling_loads_as_the_identity() -> None:
    cfg = load_config(None, ["embedding.dim=4"])
    parts = Components.build(cfg, ["C1", "C2"], n_dense=3)
    old = {k: v for k, v in parts.model.state_dict().items() if not k.startswith("dense_scale.")}
    parts.model.dense_scale.mean.fill_(7.0)
    parts.model.load_state_dict(old)  # strict: no missing-key error
    assert torch.equal(parts.model.dense_scale.mean, torch.zeros(3))
    assert torch.equal(parts.model.dense_scale.inv_std, torch.ones(3))


def test_the_scaler_is_the_first_thing_a_model_does_to_dense() -> None:
    for name in ("dlrm", "deepfm", "dcnv2", "widedeep"):
        cfg = load_config(None, ["embedding.dim=4", f"model.name={name}"])
        parts = Components.build(cfg, ["C1", "C2"], n_dense=2)
        model = parts.model.eval()
        dense, emb = torch.randn(5, 2), torch.randn(5, 2, 4)
        wide = torch.randn(5, 2) if model.uses_wide else None
        stats = DenseStats(2)
        stats.add(torch.tensor([[1.0, 10.0], [3.0, 30.0]]))
        model.dense_scale.fit(stats)
        scaled = (dense - model.dense_scale.mean) * model.dense_scale.inv_std
        ref = model.dense_scale
        model.dense_scale = DenseScaler(2)  # identity: the model on already-scaled input must agree
        want = model(scaled, emb, wide)
        model.dense_scale = ref
        assert torch.allclose(model(dense, emb, wide), want, atol=1e-6), name


def test_shrink_centres_every_column_and_divides_only_a_spread_above_one(tmp_path: Path) -> None:
    # `small` spreads over [0, 1) (std ~0.29), `big` over [0, 1000) (std ~289): the default "shrink" centres both,
    # brings `big` to unit variance and leaves `small` at its own spread; "standard" divides both by their std.
    rows = ["label,small,big,user"] + [f"{i % 2},{(i * 37) % 101 / 101},{(i * 53) % 1000},u{i % 50}" for i in range(400)]
    (tmp_path / "f.csv").write_text("\n".join(rows) + "\n")
    base = [f"data.source={tmp_path / 'f.csv'}", "data.test_rows=100", 'data.schema.label="label"',
            'data.schema.dense=["small", "big"]', 'data.schema.categorical=["user"]', 'data.schema.dense_transform="none"']
    small = np.array([(i * 37) % 101 / 101 for i in range(300)], dtype=np.float64)
    big = np.array([(i * 53) % 1000 for i in range(300)], dtype=np.float64)
    assert load_config(None, base).data.dense_scaling == "shrink"  # the default
    for mode, want_small in (("shrink", 1.0), ("standard", 1 / small.std())):
        cfg = load_config(None, [*base, f'data.dense_scaling="{mode}"'])
        source = open_source(cfg.data, "train", 64)
        parts = Components.build(cfg, source.feature_names, source.n_dense)
        fit_to_training_split(cfg, parts, source, print)
        scale = parts.model.dense_scale
        np.testing.assert_allclose(scale.mean.numpy(), [small.mean(), big.mean()], rtol=1e-5)
        np.testing.assert_allclose(scale.inv_std.numpy(), [want_small, 1 / big.std()], rtol=1e-5)
        out = scale(torch.tensor([[small.max(), big.max()]], dtype=torch.float32))
        assert float(out[0, 1]) < 2.0  # a large column is never fed as it is
        assert abs(float(out[0, 0]) - (small.max() - small.mean()) * want_small) < 1e-5


def test_a_column_with_a_spread_below_one_is_not_amplified_and_a_constant_one_is_dropped() -> None:
    stats = DenseStats(3)
    stats.add(torch.tensor([[0.2, 10.0, 3.0], [0.4, 30.0, 3.0]], dtype=torch.float64))  # std 0.1, 10, 0
    scaler = DenseScaler(3)
    assert scaler.fit(stats) == [2]
    assert torch.allclose(scaler.inv_std, torch.tensor([1.0, 0.1, 0.0]))
    assert DenseScaler(3).fit(stats, mode="standard") == [2]
    try:
        DenseScaler(3).fit(stats, mode="unit")
    except ValueError as e:
        assert "unit" in str(e)
    else:
        raise AssertionError("an unknown mode was accepted")
