"""Checkpoint format: atomic publication, exact resume, pruning, clear errors."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tierec.config import ModelConfig
from tierec.models import build_model
from tierec.train import checkpoint as ck
from tierec.train.checkpoint import (
    CheckpointError,
    capture_rng_state,
    flatten_state,
    latest_checkpoint,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
    unflatten_state,
)
from tierec.train.integrity import write_checksums


def small_state(value: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((3, 2), value), "step": torch.tensor(value)}


def test_round_trip_and_latest(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path) is None
    path = save_checkpoint(tmp_path, 7, small_state(1.0), {"epoch": 2, "config": {"a": [1, 2]}})
    assert path == tmp_path / "step_00000007"
    assert sorted(os.listdir(path)) == ["checksums.json", "meta.json", "tensors.safetensors"]
    assert (tmp_path / "latest").read_text().strip() == "step_00000007"
    for source in (tmp_path, path):
        tensors, meta = load_checkpoint(source)
        assert meta == {"epoch": 2, "config": {"a": [1, 2]}, "step": 7}
        torch.testing.assert_close(tensors["w"], torch.ones(3, 2))
    assert latest_checkpoint(tmp_path) == path


def test_saves_views_aliases_and_scalars(tmp_path: Path) -> None:
    base = torch.arange(12.0)
    tensors = {"a": base, "b": base[:4], "c": base.view(3, 4).t(), "s": torch.tensor(3, dtype=torch.int64)}
    save_checkpoint(tmp_path, 1, tensors, {})
    loaded, _ = load_checkpoint(tmp_path)
    for k, v in tensors.items():
        assert torch.equal(loaded[k], v) and loaded[k].dtype == v.dtype


@pytest.mark.parametrize("crash_at", ["tensors", "meta", "publish", "latest"])
def test_crash_midway_leaves_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crash_at: str
) -> None:
    save_checkpoint(tmp_path, 1, small_state(1.0), {"tag": "old"})

    class Crash(Exception):
        pass

    real_replace, real_write, real_save = os.replace, ck.write_durably, ck.save_file

    def save_file(tensors: dict, path: Path) -> None:
        Path(path).write_bytes(b"half a file")
        raise Crash

    def write_durably(path: Path, text: str) -> None:
        if path.name == "meta.json":
            Path(path).write_text(text[: len(text) // 2])
            raise Crash
        real_write(path, text)

    def replace(src: str | Path, dst: str | Path) -> None:
        if crash_at == "publish" and Path(dst).name.startswith("step_"):
            raise Crash
        if crash_at == "latest" and Path(dst).name == "latest":
            raise Crash
        real_replace(src, dst)

    with monkeypatch.context() as m:
        if crash_at == "tensors":
            m.setattr(ck, "save_file", save_file)
        elif crash_at == "meta":
            m.setattr(ck, "write_durably", write_durably)
        else:
            m.setattr(ck.os, "replace", replace)
        with pytest.raises(Crash):
            save_checkpoint(tmp_path, 2, small_state(2.0), {"tag": "new"})
    assert real_save is ck.save_file

    # `latest` still names step 1, and it loads; step 2 exists only if it was fully published.
    assert (tmp_path / "latest").read_text().strip() == "step_00000001"
    tensors, meta = load_checkpoint(tmp_path)
    assert meta["tag"] == "old" and torch.equal(tensors["w"], torch.ones(3, 2))
    if crash_at == "latest":
        assert load_checkpoint(tmp_path / "step_00000002")[1]["tag"] == "new"
    else:
        assert not (tmp_path / "step_00000002").exists()

    # The next save cleans up the debris and proceeds normally.
    save_checkpoint(tmp_path, 3, small_state(3.0), {"tag": "next"})
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]
    assert load_checkpoint(tmp_path)[1]["tag"] == "next"


def test_keep_n_pruning(tmp_path: Path) -> None:
    for step in (10, 20, 30, 40):
        save_checkpoint(tmp_path, step, small_state(float(step)), {}, keep=2)
    assert sorted(p for p in os.listdir(tmp_path)) == ["latest", "step_00000030", "step_00000040"]
    # After resuming from an older checkpoint, the one just written survives besides the newest `keep`.
    save_checkpoint(tmp_path, 35, small_state(35.0), {}, keep=1)
    assert sorted(os.listdir(tmp_path)) == ["latest", "step_00000035", "step_00000040"]
    assert latest_checkpoint(tmp_path) == tmp_path / "step_00000035"
    for step in (50, 60, 70):
        save_checkpoint(tmp_path, step, small_state(float(step)), {}, keep=None)
    assert len([p for p in os.listdir(tmp_path) if p.startswith("step_")]) == 5


def test_overwriting_the_same_step(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 5, small_state(1.0), {"v": 1})
    save_checkpoint(tmp_path, 5, small_state(2.0), {"v": 2})
    tensors, meta = load_checkpoint(tmp_path)
    assert meta["v"] == 2 and torch.equal(tensors["w"], torch.full((3, 2), 2.0))


def test_clear_errors(tmp_path: Path) -> None:
    def one_line_error(path: Path, match: str) -> None:
        with pytest.raises(CheckpointError, match=match) as info:
            load_checkpoint(path)
        assert "\n" not in str(info.value)

    one_line_error(tmp_path / "nowhere", "does not exist")
    one_line_error(tmp_path, "no checkpoint in")
    one_line_error(tmp_path / "step_00000009", "does not exist")

    good = save_checkpoint(tmp_path, 1, small_state(1.0), {})
    data = (good / "tensors.safetensors").read_bytes()
    (good / "tensors.safetensors").write_bytes(data[: len(data) // 2])
    one_line_error(good, "corrupt.*bytes")
    (good / "tensors.safetensors").write_bytes(b"\xff" * len(data))  # same size, garbage
    one_line_error(good, "corrupt: tensors.safetensors does not match its checksum")
    (good / "checksums.json").unlink()  # deleting the record does not switch the check off
    one_line_error(good, "corrupt: checksums.json is missing")
    write_checksums(good)  # a record of the garbage: the reader still says it
    one_line_error(good, "corrupt: cannot read")
    (good / "tensors.safetensors").unlink()
    one_line_error(good, "tensors.safetensors is missing")
    (good / "meta.json").write_text("{not json")
    one_line_error(tmp_path, "not valid JSON")
    (good / "meta.json").unlink()
    one_line_error(good, "meta.json is missing")
    (tmp_path / "latest").write_text("../../etc\n")
    with pytest.raises(CheckpointError, match="not a checkpoint name"):
        latest_checkpoint(tmp_path)


def test_missing_latest_target_falls_back_to_newest(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 1, small_state(1.0), {}, keep=None)
    save_checkpoint(tmp_path, 2, small_state(2.0), {}, keep=None)
    (tmp_path / "latest").write_text("step_00000099\n")
    with pytest.warns(UserWarning, match="missing"):
        assert latest_checkpoint(tmp_path) == tmp_path / "step_00000002"


def test_meta_must_be_json(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="JSON"):
        save_checkpoint(tmp_path, 1, small_state(1.0), {"path": Path("x")})
    with pytest.raises(ValueError, match="step"):
        save_checkpoint(tmp_path, 1, small_state(1.0), {"step": 2})
    assert not list(tmp_path.iterdir())


def test_flatten_round_trip_keeps_types() -> None:
    state = {
        "opt": {"state": {0: {"step": torch.tensor(3.0)}, 1: {}}, "param_groups": [{"betas": (0.9, 0.99), "lr": 1e-3}]},
        "odd": {"__tensor__": 1, "x": None, "inf": float("inf")},
        "arr": np.arange(4, dtype=np.uint32),
    }
    tensors, skeleton = flatten_state(state, prefix="p")
    assert list(tensors) == ["p.opt.state.0.step"]
    back = unflatten_state(tensors, json.loads(json.dumps(skeleton)))
    assert back["opt"]["param_groups"][0]["betas"] == (0.9, 0.99)
    assert list(back["opt"]["state"]) == [0, 1]
    assert back["odd"] == {"__tensor__": 1, "x": None, "inf": float("inf")}
    assert back["arr"].dtype == np.uint32 and back["arr"].tolist() == [0, 1, 2, 3]
    with pytest.raises(CheckpointError, match="lacks tensor"):
        unflatten_state({}, skeleton)
    with pytest.raises(TypeError, match="cannot checkpoint"):
        flatten_state({"f": object()})


def test_rng_round_trip(tmp_path: Path) -> None:
    gen_np, gen_torch = np.random.default_rng(5), torch.Generator().manual_seed(5)
    gens = {"np": gen_np, "torch": gen_torch}
    tensors, skeleton = flatten_state({"rng": capture_rng_state(gens)})
    save_checkpoint(tmp_path, 1, tensors, {"state": skeleton})

    def draws() -> tuple[float, ...]:
        return (random.random(), np.random.rand(), torch.rand(1).item(), gen_np.random(),
                torch.rand(1, generator=gen_torch).item())

    first = draws()
    loaded, meta = load_checkpoint(tmp_path)
    restore_rng_state(unflatten_state(loaded, meta["state"])["rng"], gens)
    assert draws() == first


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: range) -> None:
    for step in steps:
        g = torch.Generator().manual_seed(step)  # the batch depends only on the step
        dense = torch.randn(16, 3, generator=g)  # [B, n_dense]
        emb = torch.randn(16, 4, 5, generator=g)  # [B, F, D]
        wide = torch.randn(16, 4, generator=g)  # [B, F]
        labels = (torch.rand(16, generator=g) < 0.3).float()
        opt.zero_grad()
        F.binary_cross_entropy_with_logits(model(dense, emb, wide), labels).backward()
        opt.step()


def test_resume_is_bit_identical(tmp_path: Path) -> None:
    cfg = ModelConfig(name="deepfm", deep_mlp=[8, 8], dropout=0.3)  # dropout makes the RNG state matter
    torch.manual_seed(0)
    model = build_model(cfg, 3, 4, 5)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    _train(model, opt, range(0, 5))
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "rng": capture_rng_state()}
    tensors, skeleton = flatten_state(state)
    save_checkpoint(tmp_path, 5, tensors, {"state": skeleton})
    _train(model, opt, range(5, 10))
    reference = {k: v.clone() for k, v in model.state_dict().items()}

    torch.manual_seed(123)  # a different init and RNG stream, all overwritten by the load
    resumed = build_model(cfg, 3, 4, 5)
    resumed_opt = torch.optim.Adam(resumed.parameters(), lr=0.5)
    loaded, meta = load_checkpoint(tmp_path)
    state = unflatten_state(loaded, meta["state"])
    resumed.load_state_dict(state["model"])
    resumed_opt.load_state_dict(state["optim"])
    restore_rng_state(state["rng"])
    assert resumed_opt.param_groups[0]["lr"] == 1e-2 and resumed_opt.param_groups[0]["betas"] == (0.9, 0.999)
    _train(resumed, resumed_opt, range(5, 10))
    for name, value in resumed.state_dict().items():
        assert torch.equal(value, reference[name]), name
