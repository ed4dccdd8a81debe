"""Installation: Jupyter sees both halves enabled, and the wheel carries the built panel (no Node needed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def run(argv: list[str], **kwargs: object) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600, **kwargs)  # type: ignore[call-overload]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return ANSI.sub("", result.stdout + result.stderr)


def test_jupyter_lists_the_lab_and_server_extensions_enabled_and_ok() -> None:
    labextensions = run([str(BIN / "jupyter"), "labextension", "list"])
    assert re.search(r"jupyter-gpu v\d+\.\d+\.\d+ enabled\s+OK \(python, jupyter_gpu\)", labextensions), labextensions
    server = run([str(BIN / "jupyter"), "server", "extension", "list"])
    assert re.search(r"jupyter_gpu enabled", server), server
    assert re.search(r"jupyter_gpu \d+\.\d+\.\d+ OK", server), server


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built from this checkout with the build tools already in the venv (hatchling, hatch-jupyter-builder,
    # jupyterlab), reusing the panel the set-up built; `pip install .` in a clean env builds it with jlpm.
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)])
    (built,) = out.glob("jupyter_gpu-*.whl")
    return built


def test_the_wheel_ships_the_built_panel_and_the_server_enable_file(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    data = "jupyter_gpu-0.1.0.data/data/"
    assert f"{data}share/jupyter/labextensions/jupyter-gpu/package.json" in names
    assert f"{data}share/jupyter/labextensions/jupyter-gpu/install.json" in names
    assert any(re.fullmatch(rf"{data}share/jupyter/labextensions/jupyter-gpu/static/remoteEntry\.\w+\.js", n)
               for n in names)
    assert f"{data}share/jupyter/labextensions/jupyter-gpu/schemas/jupyter-gpu/plugin.json" in names
    assert f"{data}etc/jupyter/jupyter_server_config.d/jupyter_gpu.json" in names
    assert not any("node_modules" in n or n.endswith(".ts") for n in names)


def test_a_machine_without_node_installs_the_wheel_and_jupyter_sees_it(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)])
    # PATH holds only the new venv: no node, no npm, no jlpm. Its Python sees this venv's site-packages
    # (jupyterlab and the dependencies), so only our wheel is installed, from the file, offline.
    no_node = {**os.environ, "PATH": str(venv / "bin"), "PYTHONPATH": _site_packages()}
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--force-reinstall",
         "--prefix", str(venv), str(wheel)], env=no_node)
    labextensions = run([str(venv / "bin" / "python"), "-m", "jupyterlab.labextensions", "list"],
                        env={**no_node, "JUPYTER_PATH": str(venv / "share" / "jupyter")})
    assert str(venv / "share" / "jupyter" / "labextensions") in labextensions
    assert re.search(r"jupyter-gpu v0\.1\.0 enabled\s+OK", labextensions), labextensions
    assert (venv / "etc" / "jupyter" / "jupyter_server_config.d" / "jupyter_gpu.json").exists()


def _site_packages() -> str:
    import jupyterlab

    return str(Path(jupyterlab.__file__).parents[1])
