"""The hardware's health (issue 49): Xid lines in the kernel log, and each GPU's PCIe link. Hardware outranks
software: these findings sit on the lowest layer, so a failing one is the headline whatever else fails above it.

A GPU whose NVML answers already say it is lost or faulted (host_rules.gpu_lost, gpu_fault) keeps that finding; its
Xid lines and its link state join that finding's evidence (`gpu_health_evidence`) rather than repeat it here.
"""

from __future__ import annotations

import re
from typing import Any

from jupyter_gpu.gpucheck.diagnose import xid_catalog
from jupyter_gpu.gpucheck.diagnose.view import FactsView
from jupyter_gpu.models import LAYER_HARDWARE, Finding

FALLEN_OFF_XID = 79


# -- reading the snapshot ------------------------------------------------------------------------------------------
def kernel_log(view: FactsView) -> dict[str, Any]:
    return view.system.get("kernel_log") or {}


def short_address(address: str) -> str:
    """sysfs's 0000:2b:00.0 as the Xid line names it (0000:2b:00)."""
    return address.lower().rsplit(".", 1)[0]


def xids_by_address(view: FactsView) -> dict[str, list[dict[str, Any]]]:
    """Every Xid the log holds, by GPU address; a "fallen off the bus" line without its Xid counts as Xid 79."""
    log = kernel_log(view)
    found: dict[str, list[dict[str, Any]]] = {}
    for entry in log.get("xids") or []:
        found.setdefault(entry["address"], []).append(entry)
    for address in log.get("fallen_off_bus") or []:
        if not any(e["xid"] == FALLEN_OFF_XID for e in found.get(address, [])):
            found.setdefault(address, []).append({"address": address, "xid": FALLEN_OFF_XID, "count": 1,
                                                  "first": "GPU has fallen off the bus", "last": None})
    return found


def gpu_index(view: FactsView, address: str) -> int | None:
    """NVML's index of the GPU at this address: by the UUID the driver logged for it, else by PCI order where NVML
    lists exactly the GPUs sysfs does (NVML numbers GPUs by PCI bus id)."""
    uuid = (kernel_log(view).get("gpu_uuids") or {}).get(address)
    for device in view.nvml_devices:
        if uuid and device.uuid and device.uuid.lower() == uuid.lower():
            return device.index
    addresses = sorted(short_address(g["address"]) for g in view.nvidia_pci)
    if view.nvml_ok and len(addresses) == len(view.nvml_devices) and address in addresses:
        return addresses.index(address)
    return None


def gpu_label(view: FactsView, address: str) -> str:
    index = gpu_index(view, address)
    return f"GPU {index} ({address})" if index is not None else f"The GPU at {address}"


def link_state(link: dict[str, str | None] | None) -> str | None:
    """"down", "degraded" (fewer lanes than it can train), "ok", or None where sysfs did not say. Speed alone never
    degrades a link here: GPUs lower it when idle to save power, and this check runs while they idle."""
    if not link:
        return None
    speed = link.get("current_link_speed") or ""
    width, widest = _lanes(link.get("current_link_width")), _lanes(link.get("max_link_width"))
    if speed.lower().startswith("unknown") or width == 0 or (width is not None and widest and width > widest):
        return "down"  # width 0 / speed Unknown: no link; more lanes than it has: config space reads all ones
    if width is not None and widest and width < widest:
        return "degraded"
    return "ok" if width is not None else None


def _lanes(text: str | None) -> int | None:
    return int(text) if text and re.fullmatch(r"\d+", text) else None


def describe_link(link: dict[str, str | None]) -> str:
    return (f"x{link.get('current_link_width')} of x{link.get('max_link_width')}, "
            f"{link.get('current_link_speed')} of {link.get('max_link_speed')}")


def log_source_evidence(view: FactsView) -> str:
    """Where the kernel log was read, or why it could not be: said in evidence only, never a finding of its own."""
    log = kernel_log(view)
    if log.get("source"):
        return f"read with {log['source']}"
    if log.get("skipped"):
        return f"not read: {log['skipped']}"
    why = "; ".join(f"{t['command']}: {t.get('detail') or t['outcome']}" for t in log.get("tried") or [])
    return f"unreadable here ({why or 'not gathered'}): run sudo dmesg | grep -i xid where you can"


def gpu_health_evidence(view: FactsView, indices: list[int]) -> dict[str, Any]:
    """The kernel log's Xid lines and the PCIe links of these GPUs (all GPUs where none is named), for a finding about
    them that another rule writes (a lost GPU, a faulted one)."""
    addresses = [a for a in xids_by_address(view) if not indices or gpu_index(view, a) in indices]
    lines = [e.get("last") or e["first"] for a in addresses for e in xids_by_address(view)[a]]
    evidence: dict[str, Any] = {"kernel log": log_source_evidence(view), "Xid lines": lines or None}
    links = {}
    for address, link in (view.system.get("pcie_links") or {}).items():
        if not indices or gpu_index(view, short_address(address)) in indices:
            state = link_state(link)
            if state in ("down", "degraded"):
                links[address] = f"{state}: {describe_link(link)}"
    if links:
        evidence["PCIe link"] = links
    return evidence


def _worst_xid(view: FactsView, indices: list[int]) -> xid_catalog.Xid | None:
    numbers = [e["xid"] for a, entries in xids_by_address(view).items()
               if not indices or gpu_index(view, a) in indices for e in entries]
    return xid_catalog.worst(numbers) if numbers else None


def _links_down(view: FactsView, indices: list[int]) -> list[dict[str, str | None]]:
    return [link for address, link in (view.system.get("pcie_links") or {}).items()
            if (not indices or gpu_index(view, short_address(address)) in indices) and link_state(link) == "down"]


def health_headline(view: FactsView, indices: list[int]) -> str:
    """What the kernel log or the PCIe link says of these GPUs, as a sentence to end a headline with ("" if nothing):
    "The kernel log shows Xid 79 (GPU has fallen off the bus)", or "Its PCIe link is down (x0 of x16, ...)"."""
    worst = _worst_xid(view, indices)
    if worst is not None:
        return f" The kernel log shows Xid {worst.number} ({worst.meaning})."
    down = _links_down(view, indices)
    return f" Its PCIe link is down ({describe_link(down[0])})." if down else ""


def health_fix(view: FactsView, indices: list[int]) -> list[str]:
    """The catalogue's action for the worst Xid of these GPUs, else a link down's; [] where neither says more."""
    index = ",".join(map(str, indices)) or "<index>"
    worst = _worst_xid(view, indices)
    if worst is not None and worst.kind != xid_catalog.APP:
        return [line.format(index=index) for line in worst.action]
    return [xid_catalog.REBOOT, xid_catalog.MECHANICALS] if _links_down(view, indices) else []


def usable_now(view: FactsView) -> bool:
    torch = view.torch or {}
    return bool(view.probe_ran and torch.get("device_count") and not (torch.get("init_error")
                                                                       or torch.get("cuda_error")))


# -- the rules -----------------------------------------------------------------------------------------------------
def gpu_xid(view: FactsView) -> list[Finding]:
    """One finding per GPU whose kernel log holds Xids, named by the worst of them, with the catalogue's action."""
    findings = []
    for address, entries in sorted(xids_by_address(view).items()):
        index = gpu_index(view, address)
        if index is not None and index in view.gpu_faults:
            continue  # NVML already says so: gpu_lost / gpu_fault carry these lines
        worst = xid_catalog.worst([e["xid"] for e in entries])
        severity = worst.severity
        label = gpu_label(view, address)
        headline = f"{label} logged Xid {worst.number} in the kernel log: {worst.meaning}."
        if worst.kind == xid_catalog.APP:
            process = next((e["process"] for e in entries if e.get("process")), None)
            headline += (f" The program that hit it ({process})" if process else " The program that hit it") + \
                " was stopped; the GPU itself is fine."
        elif severity == "fail" and usable_now(view) and _nvml_reads_it(view, address):
            severity = "warn"  # earlier in this boot: NVML reads this GPU and PyTorch ran a kernel just now
            headline += " It happened earlier in this boot; the GPU answers now, but act before relying on it."
        elif worst.kind == xid_catalog.HARDWARE:
            headline += " This is the hardware, not the software: no reinstall helps."
        fix = [line.format(index=index if index is not None else "<index>") for line in worst.action]
        findings.append(Finding(
            "GPU_XID", severity, headline,  # type: ignore[arg-type]
            evidence={"address": address, "nvml_index": index, "catalogue": f"{worst.bucket} ({worst.kind})",
                      "Xids": {e["xid"]: e["count"] for e in entries},
                      "Xid lines": [e.get("last") or e["first"] for e in entries],
                      "kernel log": log_source_evidence(view), **_link_evidence(view, address)},
            fix=fix, refs=[xid_catalog.CATALOGUE], layer=LAYER_HARDWARE))
    return findings


def _link_evidence(view: FactsView, address: str) -> dict[str, str]:
    for full, link in (view.system.get("pcie_links") or {}).items():
        if short_address(full) == address and link_state(link) is not None:
            return {"PCIe link": f"{link_state(link)}: {describe_link(link)}"}
    return {}


def _nvml_reads_it(view: FactsView, address: str) -> bool:
    """NVML answers this GPU's queries: a link sysfs reads as down then is a misreading, not a fact to act on."""
    index = gpu_index(view, address)
    return index is not None and view.nvml_ok and index not in view.gpu_faults


def pcie_links(view: FactsView) -> list[Finding]:
    """A GPU's PCIe link down (its lost/faulted finding carries it where NVML says so), or trained narrower than it
    can (a warn: copies to and from the GPU slow down, the GPU still works)."""
    findings = []
    for address, link in sorted((view.system.get("pcie_links") or {}).items()):
        state, short = link_state(link), short_address(address)
        index = gpu_index(view, short)
        if state == "down" and (index is None or index not in view.gpu_faults) and not _nvml_reads_it(view, short):
            if any(a == short or (index is not None and gpu_index(view, a) == index) for a in xids_by_address(view)):
                continue  # its Xid finding (79, usually) names the cause; the link is in its evidence
            findings.append(Finding(
                "PCIE_LINK_DOWN", "fail",
                f"{gpu_label(view, short)}: its PCIe link is down ({describe_link(link)}), so nothing can reach the "
                "GPU. This is the hardware, its slot or its power, not the software: no reinstall helps.",
                evidence={"PCIe link": describe_link(link), "nvml": view.nvml.get("error") or view.nvml.get("status"),
                          "kernel log": log_source_evidence(view)},
                fix=[xid_catalog.REBOOT, xid_catalog.MECHANICALS], layer=LAYER_HARDWARE))
        elif state == "degraded":
            findings.append(Finding(
                "PCIE_LINK_DEGRADED", "warn",
                f"{gpu_label(view, short)} runs its PCIe link at x{link.get('current_link_width')} of "
                f"x{link.get('max_link_width')} lanes: copies between the host and the GPU run at a fraction of "
                "their speed.",
                evidence={"PCIe link": describe_link(link),
                          "note": "the speed may be low only because the GPU idles (it saves power so); the width "
                                  "is what says the link trained narrower"},
                fix=[f"sudo lspci -vv -s {address} | grep -e LnkCap -e LnkSta   # what the link can do, what it "
                     "trained to",
                     "Where it stays narrower: a slot wired for fewer lanes, a riser or bifurcation setting, or a "
                     "card not fully seated: reseat it or move it to a x16 slot (power the machine off first)."],
                layer=LAYER_HARDWARE))
    return findings


RULES = (gpu_xid, pcie_links)
