"""The side panel's TypeScript unit tests (node --test against the golden reply and the golden byte/duration
text, tests/fixtures/golden/), run inside the Python suite."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

LABEXTENSION = Path(__file__).resolve().parents[2] / "labextension"


def test_the_typescript_model_tests_pass_on_the_golden_reply() -> None:
    jlpm = Path(sys.executable).parent / "jlpm"  # JupyterLab's bundled yarn, installed with jupyterlab
    assert jlpm.exists() and shutil.which("node"), "the TypeScript tests need JupyterLab's jlpm and Node.js"
    assert (LABEXTENSION / "node_modules").is_dir(), "run ./dev test (its install runs jlpm install)"
    env = {**os.environ, "PATH": f"{jlpm.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run([str(jlpm), "test"], cwd=LABEXTENSION, capture_output=True, text=True, timeout=300,
                            env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    passed = re.search(r"# pass (\d+)", output)
    failed = re.search(r"# fail (\d+)", output)
    assert passed and int(passed.group(1)) >= 10, output[-2000:]
    assert failed and int(failed.group(1)) == 0, output[-2000:]
    # The golden format.json is checked in TypeScript too (labextension/tests/format-golden.test.ts).
    for name in ("formatBytes writes exactly what jupyter_gpu.rendering.units.format_bytes writes",
                 "formatDuration writes exactly what jupyter_gpu.rendering.units.format_duration writes"):
        assert re.search(rf"^ok \d+ - {re.escape(name)}", output, re.MULTILINE), f"{name!r} did not run"
