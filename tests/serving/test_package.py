"""What an installed tierec says about itself: its licence file and ``tierec --version``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tierec.cli import main
from tierec.version import tierec_version

REPO = Path(__file__).resolve().parents[2]


def test_license_file_is_apache_2() -> None:
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    assert 'license = "Apache-2.0"' in (REPO / "pyproject.toml").read_text()


def test_version_flag(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out == f"tierec {tierec_version()}" and re.fullmatch(r"tierec \d+\.\d+\.\d+.*", out)
