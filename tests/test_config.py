"""Config loading: TOML, overrides, unknown keys and bad values named in the error."""

from __future__ import annotations

import pytest

from tierec.config import Config, ConfigError, OptimizerKind, from_dict, load_config, to_dict


def test_defaults_and_overrides(tmp_path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('[model]\nname = "dcnv2"\n[embedding]\ndim = 8\n[embedding.optimizer]\nkind = "adam"\n')
    cfg = load_config(f, ["embedding.dim=32", "train.batch_size=128", "data.source=some/file.csv"])
    assert cfg.model.name == "dcnv2"
    assert cfg.embedding.dim == 32
    assert cfg.embedding.optimizer.kind is OptimizerKind.ADAM
    assert cfg.train.batch_size == 128
    assert cfg.data.source == "some/file.csv"  # bare strings need no quotes


def test_round_trip_through_dict() -> None:
    cfg = load_config(None, ["model.top_mlp=[8, 4]", "embedding.optimizer.kind=sgd"])
    again = from_dict(Config, to_dict(cfg))
    assert again == cfg


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.batch_sise=4", "train.batch_sise"),
        ("nosuch.key=1", "nosuch"),
        ("model.name=resnet", "model.name"),
        ("train.batch_size=big", "train.batch_size must be an integer"),
        ("embedding.optimizer.kind=lamb", "OptimizerKind"),
        ("train.batch_size", "section.key=value"),
        ("store.leave_core=yes", "store.leave_core 'yes' is not one of auto, on, off"),
    ],
)
def test_bad_values_are_named(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load_config(None, [override])


def test_missing_and_broken_files(tmp_path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\n")
    with pytest.raises(ConfigError, match="bad.toml"):
        load_config(bad)
