"""What an installed tierec says about itself: its licence file and ``tierec --version``."""

from __future__ import annotations

import json
import re
import shutil
import site
import subprocess
import sys
import time
import urllib.request
import zipfile
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


def _build_wheel(tmp_path: Path) -> Path:
    """The wheel of a copy of this tree (no network: the installed setuptools); skips where pip cannot build one."""

    pytest.importorskip("setuptools")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    for pkg in ("tierec", "benchmarks"):
        shutil.copytree(REPO / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(tmp_path), str(src)], capture_output=True, text=True, timeout=300)  # fmt: skip
    if build.returncode != 0:
        pytest.skip(f"pip cannot build a wheel here: {build.stderr.strip().splitlines()[-1:]}")
    (wheel,) = tmp_path.glob("tierec-*.whl")
    return wheel


def test_the_wheel_ships_the_license_and_the_serve_extra(tmp_path: Path) -> None:
    """Builds the wheel from a copy of this tree (no network: the installed setuptools) and reads its metadata."""

    wheel = _build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert any(n.endswith("licenses/LICENSE") for n in names) and "tierec/serving/server.py" in names
    assert "License-Expression: Apache-2.0" in meta and "Provides-Extra: serve" in meta


def test_the_wheel_installed_in_a_fresh_venv_trains_exports_and_serves(tmp_path: Path) -> None:
    """The built wheel in a new virtual environment (its dependencies, with the extras, are this environment's,
    reached through a path entry that runs none of its .pth files, so the editable install here cannot leak in):
    `tierec --version`, a small `train`, `export`, and `serve` answering /health, all from that venv's own script."""

    pytest.importorskip("uvicorn")
    wheel = _build_wheel(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", str(wheel)],
                   check=True, timeout=300)  # fmt: skip
    new_site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   capture_output=True, text=True, check=True).stdout.strip())
    (new_site / "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    where = subprocess.run([str(py), "-c", "import tierec; print(tierec.__file__)"], env=env, cwd=tmp_path,
                           capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(new_site)), where  # the wheel's tierec, not this checkout's
    tierec = str(venv / "bin" / "tierec")

    def run(*args: str) -> str:
        done = subprocess.run([tierec, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    assert run("--version").strip() == f"tierec {tierec_version()}"
    run("train", "--no-progress", "--run-dir", "run", "--set", "data.synthetic.train_rows=4096",
        "--set", "data.synthetic.test_rows=1024", "--set", "train.batch_size=1024", "--set", "train.plots=false")
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["tierec_version"] == tierec_version()
    run("export", "run", "--out", "export")
    server = subprocess.Popen([tierec, "serve", "export", "--port", "0"], env=env, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = ""
        deadline = time.monotonic() + 120
        while "127.0.0.1:" not in line and time.monotonic() < deadline:
            line = server.stdout.readline()
            assert line or server.poll() is None, "tierec serve exited"
        port = int(line.split("127.0.0.1:")[1].split()[0].strip("/,"))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as r:
            assert r.status == 200
    finally:
        server.terminate()
        server.wait(timeout=30)
