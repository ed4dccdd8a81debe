"""%gpucheck over several hundred generated machines (issue 49): every layer's states combined
(tests/fixtures/machine_space.py), each diagnosed by the product from a facts snapshot, no probe child.

For each machine: exactly one headline, the first broken layer's, and the text, HTML and JSON say the same; no
printed fix that the machine's own state rules out (the reasons come from the state, not from the product's gate).
"""

from __future__ import annotations

import json
import re
from html import escape

import pytest
from machine_space import machine_states

from jupyter_gpu.gpucheck.diagnose.engine import diagnose
from jupyter_gpu.gpucheck.diagnose.layers import BLIND, LAYERS, layer_of
from jupyter_gpu.models import LAYER_LAST_ERROR

MACHINES = machine_states(480)


def test_the_space_is_several_hundred_machines_with_every_layer_state():
    assert len(MACHINES) >= 400
    for field in ("pci", "nodes", "job", "container", "nvml", "cuinit", "torch", "platform"):
        assert len({getattr(m, field) for m in MACHINES}) > 2, field


def _fix_lines(report) -> list[str]:
    return [line for finding in report.findings for line in finding.fix]


@pytest.mark.parametrize("machine", MACHINES, ids=str)
def test_one_headline_no_impossible_fix_same_in_every_surface(machine):
    report = diagnose(machine.snapshot())
    text, html, data = str(report), report._repr_html_(), json.loads(json.dumps(report.to_dict(include_facts=False)))

    # One headline: the verdict, which names the primary finding when PyTorch is on the CPU.
    primary = report.primary
    assert report.verdict in text.splitlines()[0] and escape(report.verdict) in html
    assert data["verdict"] == report.verdict and data["primary"] == (primary.code if primary else None)
    if not report.gpu_usable and machine.gpu_evidence:
        assert primary is not None, text
        assert primary.headline[1:].rstrip(".") in report.verdict or report.verdict.startswith("PyTorch can use"), (
            primary.headline, report.verdict)
    codes = report.codes
    assert len(codes) == len(set(codes)), codes
    # ... and it is the first broken layer, from the hardware up (every finding about the machine has one).
    for finding in report.findings:
        assert finding.layer >= LAYER_LAST_ERROR or finding.code in BLIND or layer_of(finding.code), finding.code
    failing = [layer_of(f.code) for f in report.findings if f.severity == "fail" and layer_of(f.code)]
    if failing and primary is not None and primary.code not in BLIND:
        first = min(failing, key=LAYERS.index)
        assert layer_of(primary.code) == first, f"{machine}: headline {primary.code}, yet {first.name} fails"

    # No fix the machine rules out.
    for line in _fix_lines(report):
        for pattern, reason in machine.truths().items():
            assert not re.search(pattern, line), f"{machine}\n{reason}: printed {line!r}\n{text}"

    # The same findings, evidence and fixes in text, HTML and JSON.
    assert [f["code"] for f in data["findings"]] == codes
    for finding, as_json in zip(report.findings, data["findings"], strict=True):
        assert as_json["fix"] == finding.fix and as_json["headline"] == finding.headline
        assert f"{finding.code}: {finding.headline}" in text and escape(finding.headline) in html
        for line in finding.fix:
            assert line in text and escape(line) in html
