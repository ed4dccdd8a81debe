"""Every finding code the readiness rules can emit has its row in docs/findings.md."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RULES = ["jupyter_gpu/distributed/readiness.py", "jupyter_gpu/distributed/topology_rules.py"]


def test_every_distributed_code_is_documented() -> None:
    emitted = {code for path in RULES for code in re.findall(r'"(DIST_[A-Z0-9_]+)"', (ROOT / path).read_text())}
    documented = set(re.findall(r"^\| `(DIST_[A-Z0-9_]+)` \|", (ROOT / "docs/findings.md").read_text(), re.M))
    assert len(emitted) >= 20
    assert emitted - documented == set()
    assert documented - emitted == set()  # no row for a code nothing emits
