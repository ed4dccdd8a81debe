"""The hardware's health as the host's kernel records it: NVRM Xid lines in the kernel log, and each NVIDIA GPU's PCIe
link as sysfs reads it (issue 49). Probe layer: files under the context's root, commands found under it.

The kernel log is read with `dmesg`, else `journalctl -k -b` (a user denied the ring buffer by kernel.dmesg_restrict
may still read the journal: systemd/systemd#12112), each bounded by a short timeout. The commands are looked up in
the system's own bin folders *under the root*, so a fake machine supplies them as it supplies its files, and a
user's PATH cannot put another program in their place. Which source answered, and why each other did not, is kept:
a log that cannot be read is a fact, never a failure.
"""

from __future__ import annotations

import os
import re
import subprocess
from typing import Any

from jupyter_gpu.facts.context import ProbeContext

# Where a distribution installs dmesg (util-linux) and journalctl (systemd).
SYSTEM_BIN_DIRS = ("/usr/bin", "/bin", "/usr/sbin", "/sbin")
COMMAND_TIMEOUT_S = 1.0
# The journal keeps every kernel line since boot; its last lines are enough (a Xid flood repeats itself).
JOURNAL_LINES = 5000
LOG_SOURCES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("dmesg", ()),
    ("journalctl", ("-k", "-b", "--no-pager", "-o", "short-monotonic", "-n", str(JOURNAL_LINES))),
)
# A Xid names the GPU by PCI domain:bus:device, with "PCI:" since R470 and without it before (0000:01:00).
_ADDRESS = r"(?P<address>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?"
XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?" + _ADDRESS + r"\): (?P<xid>\d+),\s*(?P<detail>.*)")
# "NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014-...": the driver names the GPU's UUID before its first Xid.
GPU_UUID_LINE = re.compile(r"NVRM: GPU at PCI:" + _ADDRESS + r": (?P<uuid>GPU-[0-9a-fA-F-]+)")
# Newer drivers also say it without a Xid ("NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus."), older ones
# only so ("NVRM: GPU at 0000:01:00.0 has fallen off the bus.").
FALLEN_OFF_LINE = re.compile(r"NVRM: GPU (?:at )?(?:PCI:)?" + _ADDRESS + r":? (?:GPU )?has fallen off the bus")
PROCESS = re.compile(r"pid=(?P<pid>'?[^,']*'?), name=(?P<name>[^,]*),")
# journalctl without access to the system journal answers 0 with only this on stdout.
NO_ENTRIES = "-- No entries --"
LINE_LIMIT = 400  # characters kept of one quoted line
LINK_FILES = ("current_link_speed", "max_link_speed", "current_link_width", "max_link_width")


def find_command(ctx: ProbeContext, name: str) -> str | None:
    for directory in SYSTEM_BIN_DIRS:
        path = ctx.path(f"{directory}/{name}")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return str(path)
    return None


def run_command(ctx: ProbeContext, name: str, args: tuple[str, ...]) -> dict[str, Any]:
    """One bounded run: its output, or why there is none (not found, denied, timed out, failed)."""
    path = find_command(ctx, name)
    if path is None:
        return {"outcome": "not found"}
    env = {"PATH": ":".join(SYSTEM_BIN_DIRS), "LC_ALL": "C"}  # untranslated messages, the parser's words
    try:
        done = subprocess.run([path, *args], capture_output=True, timeout=COMMAND_TIMEOUT_S, env=env,
                              stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return {"outcome": "timed out", "detail": f"no answer within {COMMAND_TIMEOUT_S:g} s"}
    except OSError as exc:
        return {"outcome": "failed", "detail": str(exc)}
    stdout = done.stdout.decode("utf-8", errors="replace")
    stderr = done.stderr.decode("utf-8", errors="replace").strip()
    first_error = stderr.splitlines()[0][:LINE_LIMIT] if stderr else None
    if done.returncode != 0:
        denied = "not permitted" in stderr.lower() or "permission denied" in stderr.lower()
        return {"outcome": "denied" if denied else "failed", "detail": first_error or f"exit {done.returncode}"}
    if not stdout.strip() or stdout.strip() == NO_ENTRIES:
        # journalctl as a user outside adm/systemd-journal: exit 0, no kernel lines, a hint on stderr.
        return {"outcome": "denied", "detail": first_error or "no kernel messages visible to this user"}
    return {"outcome": "ok", "text": stdout}


def parse_kernel_log(text: str) -> dict[str, Any]:
    """Every Xid by GPU address and number: how often, its first and last line, the process the last one names."""
    xids: dict[tuple[str, int], dict[str, Any]] = {}
    uuids: dict[str, str] = {}
    fallen_off: list[str] = []
    for line in text.splitlines():
        if "NVRM" not in line:
            continue
        quoted = line.strip()[:LINE_LIMIT]
        if match := XID_LINE.search(line):
            address, number = match["address"].lower(), int(match["xid"])
            entry = xids.setdefault((address, number), {"address": address, "xid": number, "count": 0,
                                                        "first": quoted})
            entry["count"] += 1
            entry["last"] = quoted
            process = PROCESS.search(match["detail"])
            if process and "unknown" not in process["name"]:
                entry["process"] = process["name"].strip()
        elif match := GPU_UUID_LINE.search(line):
            uuids[match["address"].lower()] = match["uuid"]
        elif (match := FALLEN_OFF_LINE.search(line)) and match["address"].lower() not in fallen_off:
            fallen_off.append(match["address"].lower())
    return {"xids": list(xids.values()), "gpu_uuids": uuids, "fallen_off_bus": fallen_off}


def kernel_log_facts(ctx: ProbeContext, pci_gpus: list[dict[str, Any]], driver_text: str | None) -> dict[str, Any]:
    """The kernel log's NVRM lines from the first source that answers; where none does, why each did not."""
    if ctx.windows or not (driver_text or any(g.get("vendor") == "nvidia" for g in pci_gpus)):
        return {"source": None, "tried": [], "skipped": "no NVIDIA GPU or driver on this machine"}
    tried: list[dict[str, Any]] = []
    for name, args in LOG_SOURCES:
        answer = run_command(ctx, name, args)
        text = answer.pop("text", None)
        tried.append({"command": name, **answer})
        if text is not None:
            return {"source": name, "tried": tried, **parse_kernel_log(text)}
    return {"source": None, "tried": tried}


def pcie_link_facts(ctx: ProbeContext, pci_gpus: list[dict[str, Any]]) -> dict[str, dict[str, str | None]]:
    """Each NVIDIA GPU's PCIe link as sysfs reads it, verbatim ("16.0 GT/s PCIe", "16"); None where unreadable.

    A link that is down reads width 0 and speed "Unknown"; a GPU gone from the bus reads all ones (width 63). GPUs
    lower their link *speed* when idle to save power, so only the width says the link trained narrower.
    """
    links = {}
    for gpu in pci_gpus:
        if gpu.get("vendor") != "nvidia":
            continue
        base = f"/sys/bus/pci/devices/{gpu['address']}"
        links[gpu["address"]] = {name: _strip(ctx.read_text(f"{base}/{name}", limit=64)) for name in LINK_FILES}
    return links


def _strip(text: str | None) -> str | None:
    return text.strip() if text is not None else None
