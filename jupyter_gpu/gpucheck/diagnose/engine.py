"""Diagnosis: a pure function from a facts snapshot to a `GpuCheckReport` (catalogue §7)."""

from __future__ import annotations

from typing import Any

from jupyter_gpu.gpucheck.diagnose import (
    activity_rules,
    companion_rules,
    device_rules,
    driver_api_rules,
    health_rules,
    host_rules,
    install_rules,
)
from jupyter_gpu.gpucheck.diagnose.fix_gate import gate
from jupyter_gpu.gpucheck.diagnose.layers import BLIND, LAYERS, layer_of
from jupyter_gpu.gpucheck.diagnose.stack import build_stack
from jupyter_gpu.gpucheck.diagnose.usage import last_error_findings, usage_findings
from jupyter_gpu.gpucheck.diagnose.view import FactsView
from jupyter_gpu.gpucheck.report import Device, GpuCheckReport
from jupyter_gpu.models import SEVERITY_RANK, Finding, order_findings, overall_status, primary_finding


def usable_devices(view: FactsView) -> list[Device]:
    """Devices torch really initialised and ran a kernel on in the probe; MPS on a Mac."""
    torch = view.torch or {}
    if view.probe_ran and torch.get("device_count") and not (torch.get("init_error") or torch.get("cuda_error")):
        return [Device(int(d["index"]), str(d.get("name") or "GPU")) for d in torch.get("devices") or []]
    if (torch.get("mps") or {}).get("available"):
        return [Device(0, "Apple GPU", kind="mps")]
    return []


def verdict_line(devices: list[Device], primary: Finding | None) -> str:
    if devices:
        names = sorted({d.name for d in devices})
        labels = [d.label for d in devices]
        where = labels[0] if len(labels) == 1 else f"{labels[0]}..{labels[-1]}"
        what = f"{len(devices)}x {names[0]}" if len(names) == 1 else f"{len(devices)} GPUs ({', '.join(names)})"
        return f"PyTorch can use {what} ({where})"
    reason = primary.headline if primary else "no GPU is usable"
    # "No NVIDIA GPU..." reads on after a colon as "no NVIDIA GPU..."; acronyms ("CUDA...") stay as they are.
    if reason[1:2].islower():
        reason = reason[0].lower() + reason[1:]
    return f"PyTorch is running on the CPU: {reason}"


def diagnose(snapshot: dict[str, Any], *, verbose: bool = False) -> GpuCheckReport:
    view = FactsView(snapshot)
    findings: list[Finding] = []
    # The hardware's health first: its findings are LAYER_HARDWARE, below every software layer.
    for rule in (*health_rules.RULES, *install_rules.RULES, *host_rules.RULES, *device_rules.RULES,
                 *companion_rules.RULES):
        findings.extend(rule(view))
    # The CUDA driver's own cuInit, where the layers below have not explained it; before the last word.
    findings.extend(driver_api_rules.driver_api_findings(view, findings))
    findings.extend(device_rules.cuda_not_available(view, findings))
    devices = usable_devices(view)
    notebook = view.notebook or {}
    findings.extend(last_error_findings(notebook, gpu_usable=bool(devices)))
    findings.extend(usage_findings(
        notebook,
        gpu_usable=bool(devices),
        gpu_kind=devices[0].kind if devices else None,
        cuda_launch_blocking=view.env.get("CUDA_LAUNCH_BLOCKING", "0") not in ("", "0"),
        shm_bytes=view.system.get("shm_bytes"),
        cpu_count=view.platform.get("cpu_count"),
        hosting=view.hosting,
    ))
    last_cell = activity_rules.last_long_cell(view)
    findings.extend(activity_rules.low_utilization(last_cell))
    findings = gate(by_layer(_dedupe(order_findings(findings))), view)  # no rule prints a fix around the gate
    return GpuCheckReport(
        status=overall_status(findings),
        verdict=verdict_line(devices, None if devices else primary_finding(findings)),
        gpu_usable=bool(devices),
        devices=devices,
        findings=findings,
        facts=snapshot,
        verbose=verbose,
        stack=build_stack(view, last_cell),
    )


def by_layer(findings: list[Finding]) -> list[Finding]:
    """The first broken layer of the machine, from the hardware up, gives the headline (layers.LAYERS); findings of
    no machine layer (the notebook's) follow in their own order. Stable: within a layer, the rules' order holds."""
    def rank(finding: Finding) -> tuple[int, int]:
        layer = layer_of(finding.code)
        if finding.code in BLIND:
            return SEVERITY_RANK[finding.severity], -1
        return SEVERITY_RANK[finding.severity], LAYERS.index(layer) if layer else len(LAYERS) + finding.layer

    return sorted(findings, key=rank)


def _dedupe(findings: list[Finding]) -> list[Finding]:
    seen: set[tuple[str, str]] = set()
    unique = []
    for finding in findings:
        key = (finding.code, finding.headline)
        if key not in seen:
            seen.add(key)
            unique.append(finding)
    return unique
