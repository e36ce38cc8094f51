"""docs/config.md is the page the config dataclasses make today, and names every key."""

from __future__ import annotations

from pathlib import Path

from tierec.config import load_config, to_dict, flatten_dict
from tierec.config_reference import render

PAGE = Path(__file__).resolve().parents[1] / "docs" / "config.md"


def test_the_page_is_current() -> None:
    assert PAGE.read_text() == render(), "docs/config.md is stale: python -m tierec.config_reference > docs/config.md"


def test_every_key_is_on_the_page_with_a_meaning() -> None:
    page = render()
    for key in flatten_dict(to_dict(load_config(None))):
        line = next((ln for ln in page.splitlines() if ln.startswith(f"| `{key}` |")), None)
        assert line is not None, key
        assert not line.endswith("|  |"), f"{key} has no comment in tierec/config.py or tierec/data_config.py"
