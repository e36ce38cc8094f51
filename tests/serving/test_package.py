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


def test_the_wheel_ships_the_license_and_the_serve_extra(tmp_path: Path) -> None:
    """Builds the wheel from a copy of this tree (no network: the installed setuptools) and reads its metadata."""
    import shutil
    import subprocess
    import sys
    import zipfile

    pytest.importorskip("setuptools")
    src = tmp_path / "src"
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, src / name)
    for pkg in ("tierec", "benchmarks"):
        shutil.copytree(REPO / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(tmp_path), str(src)], capture_output=True, text=True, timeout=300)  # fmt: skip
    if build.returncode != 0:
        pytest.skip(f"pip cannot build a wheel here: {build.stderr.strip().splitlines()[-1:]}")
    (wheel,) = tmp_path.glob("tierec-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert any(n.endswith("licenses/LICENSE") for n in names) and "tierec/serving/server.py" in names
    assert "License-Expression: Apache-2.0" in meta and "Provides-Extra: serve" in meta
