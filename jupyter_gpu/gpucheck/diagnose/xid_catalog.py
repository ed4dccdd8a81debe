"""NVIDIA's Xid numbers: what each means and what the operator does about it (https://docs.nvidia.com/deploy/
xid-errors/, its Xid catalogue's resolution buckets: RESTART_APP, RESET_GPU, RESTART_BM, CHECK_MECHANICALS,
WORKFLOW_XID_48, CONTACT_SUPPORT). Pure Python.

Three kinds, by whose fault the catalogue says it usually is:
- the application's (13, 31, 43, 45, ...): the program that hit it is stopped, the GPU stays healthy; restart the
  program, and debug it where it repeats (info).
- the memory's, contained or recoverable (63, 92, 94): the GPU keeps working; a reset activates what the driver
  marked (warn).
- the GPU's or the bus's (48, 64, 74, 79, 95, 119, 120, ...): the GPU needs a reset or the machine a reboot, and
  one that repeats needs its operator (fail).
A number not listed reads as unknown: the catalogue's page names it.
"""

from __future__ import annotations

from dataclasses import dataclass

CATALOGUE = "https://docs.nvidia.com/deploy/xid-errors/"

APP, MEMORY, HARDWARE, UNKNOWN = "application", "memory (recoverable)", "hardware", "unknown"
SEVERITY_OF_KIND = {APP: "info", MEMORY: "warn", HARDWARE: "fail", UNKNOWN: "info"}

RESET = "sudo nvidia-smi -r -i {index}   # reset the GPU: once no process uses it (nvidia-smi lists none)"
REBOOT = "Reboot the machine (a GPU off the bus comes back only with a reboot, often only with a power cycle)."
MECHANICALS = ("If it happens again: check the GPU's seating, riser and power cables, and its temperature under load "
               "(CHECK_MECHANICALS); then report it to the machine's operator or cloud provider with the output of "
               "sudo nvidia-bug-report.sh")
SUPPORT = ("If it repeats after the reset: report the GPU to the machine's operator or cloud provider with the output "
           "of sudo nvidia-bug-report.sh (CONTACT_SUPPORT)")
REMAP = "nvidia-smi -q -d ROW_REMAPPER,PAGE_RETIREMENT -i {index}   # pending remaps, and whether one failed"
RESTART_PROGRAM = ("Restart the program that hit it (RESTART_APP): the GPU itself stays healthy. Where it repeats, run "
                   "the program under compute-sanitizer, or with CUDA_LAUNCH_BLOCKING=1, to find the kernel at fault.")


@dataclass(frozen=True)
class Xid:
    number: int
    meaning: str
    kind: str
    bucket: str  # the catalogue's resolution bucket (immediate action)
    action: tuple[str, ...]  # fix lines; "{index}" is the GPU's NVML index

    @property
    def severity(self) -> str:
        return SEVERITY_OF_KIND[self.kind]


def _app(number: int, meaning: str) -> Xid:
    return Xid(number, meaning, APP, "RESTART_APP", (RESTART_PROGRAM,))


XIDS: dict[int, Xid] = {x.number: x for x in (
    _app(8, "GPU stopped processing (a channel timed out)"),
    _app(13, "Graphics Engine Exception (an illegal instruction or out-of-range access in a kernel)"),
    _app(31, "GPU memory page fault (MMU fault: a kernel touched an address it does not own)"),
    _app(32, "invalid or corrupted push buffer stream"),
    _app(43, "GPU stopped processing (the program's channel was reset)"),
    _app(45, "preemptive cleanup, due to a previous error (the channels of a stopped program)"),
    _app(69, "Graphics Engine class error"),
    _app(109, "context switch timeout"),
    Xid(48, "double-bit ECC error (DBE): uncorrectable memory error", HARDWARE, "RESET_GPU, then WORKFLOW_XID_48",
        (RESET, REMAP, "If a row remap failed or the count keeps growing: the GPU's memory is failing; "
         "report it (CONTACT_SUPPORT) with the output of sudo nvidia-bug-report.sh")),
    Xid(63, "ECC page retirement or row remapping recorded: a faulty memory row was marked", MEMORY, "RESET_GPU",
        (RESET + " when convenient: the reset activates the remap", REMAP)),
    Xid(64, "ECC page retirement or row remapping failed", HARDWARE, "RESET_GPU, then CONTACT_SUPPORT",
        (RESET, REMAP, SUPPORT)),
    Xid(74, "NVLink error", HARDWARE, "RESET_GPU",
        (RESET, "nvidia-smi nvlink -s -i {index}   # which links are down or erroring", SUPPORT)),
    Xid(79, "GPU has fallen off the bus", HARDWARE, "RESTART_BM, then CHECK_MECHANICALS", (REBOOT, MECHANICALS)),
    Xid(92, "high single-bit ECC error rate", MEMORY, "RESET_GPU when convenient",
        (RESET + " when convenient", "nvidia-smi -q -d ECC -i {index}   # the corrected-error counts")),
    Xid(94, "contained ECC error: the program using the faulty memory was stopped, the GPU keeps running", MEMORY,
        "RESTART_APP, then RESET_GPU", (RESTART_PROGRAM.split(":")[0] + ".",
                                        RESET + " when convenient: it retires the faulty memory", REMAP)),
    Xid(95, "uncontained ECC error: every program on this GPU is affected", HARDWARE, "RESET_GPU",
        (RESET, REMAP, SUPPORT)),
    Xid(62, "internal micro-controller halt", HARDWARE, "RESET_GPU", (RESET, SUPPORT)),
    Xid(119, "GSP RPC timeout: the GPU's firmware (GSP) stopped answering the driver", HARDWARE, "RESET_GPU",
        (RESET, "If the reset is refused: " + REBOOT.lower(), SUPPORT)),
    Xid(120, "GSP error: the GPU's firmware (GSP) reported an error", HARDWARE, "RESET_GPU",
        (RESET, "If the reset is refused: " + REBOOT.lower(), SUPPORT)),
    Xid(140, "unrecovered ECC error", HARDWARE, "RESET_GPU", (RESET, REMAP, SUPPORT)),
    Xid(154, "GPU recovery action changed: the driver says what the GPU now needs (reset, reboot or drain)",
        HARDWARE, "as the line says", (RESET, "If the line asks for a reboot (Node Reboot Required): reboot the "
                                      "machine instead", SUPPORT)),
)}


def xid(number: int) -> Xid:
    """The catalogue's entry; a number it does not hold reads as unknown, pointing at the catalogue."""
    return XIDS.get(number) or Xid(number, f"Xid {number} (see NVIDIA's Xid catalogue)", UNKNOWN, "see the catalogue",
                                   (f"Look up Xid {number} in NVIDIA's Xid catalogue: {CATALOGUE}",))


SEVERITY_RANK = {"fail": 0, "warn": 1, "info": 2}


def worst(numbers: list[int]) -> Xid:
    """The most serious of these Xids (the hardware's before the memory's before the application's)."""
    return min((xid(n) for n in numbers), key=lambda x: (SEVERITY_RANK[x.severity], -x.number))
