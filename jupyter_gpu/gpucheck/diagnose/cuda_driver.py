"""The CUDA driver's own answer (issue 49, layer 5): cuInit's CUresult code and where the loaded libcuda came from.

Pure: the probe child (facts/probe_script.py, `driver_api_facts`) loads `libcuda.so.1` as the CUDA runtime does, calls
cuDriverGetVersion and cuInit(0) before torch touches CUDA, and records the code, the driver's name for it and the file
the loader mapped. Here each code gets a class, its meaning (NVIDIA's CUresult documentation, cuda.h) and what to do;
each path gets its origin. Codes this table does not know read as class OTHER, with the driver's own name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# -- classes of cuInit's answer -------------------------------------------------------------------------------
OK = "ok"
STUB = "stub"  # the toolkit's link-time stub, not a driver
NO_DRIVER = "no_driver"  # the libcuda is older than the runtime, or no driver answers
NOT_INITIALIZED = "not_initialized"
COMPAT = "compat"  # forward-compatibility libcuda against the kernel module or the GPU
NO_DEVICE = "no_device"
BUSY = "busy"
NOT_PERMITTED = "os"
FABRIC = "fabric"
UNKNOWN = "unknown"
OTHER = "other"


@dataclass(frozen=True)
class CuResult:
    code: int
    name: str
    kind: str
    meaning: str  # NVIDIA's wording, shortened
    todo: str  # what tells more or fixes it, where no finding with a precise fix applies


CU_RESULTS: dict[int, CuResult] = {r.code: r for r in (
    CuResult(0, "CUDA_SUCCESS", OK, "the driver started", ""),
    CuResult(3, "CUDA_ERROR_NOT_INITIALIZED", NOT_INITIALIZED,
             "the CUDA driver has not been initialized, or its initialization failed",
             "run nvidia-smi in a terminal; then sudo dmesg | grep -i nvrm for the kernel module's complaint"),
    CuResult(34, "CUDA_ERROR_STUB_LIBRARY", STUB,
             "the libcuda loaded is the CUDA toolkit's stub library (for linking), not the NVIDIA driver",
             "take the toolkit's stubs directory off the loader's path"),
    CuResult(35, "CUDA_ERROR_INSUFFICIENT_DRIVER", NO_DRIVER,
             "the installed CUDA driver is older than the CUDA runtime", "update the NVIDIA driver"),
    CuResult(46, "CUDA_ERROR_DEVICES_UNAVAILABLE", BUSY,
             "every CUDA device is busy or unavailable (exclusive-process or prohibited compute mode)",
             "nvidia-smi --query-gpu=index,compute_mode --format=csv; nvidia-smi --query-compute-apps=pid,"
             "gpu_uuid --format=csv"),
    CuResult(100, "CUDA_ERROR_NO_DEVICE", NO_DEVICE,
             "no CUDA-capable device is detected by the driver",
             "nvidia-smi -L; ls -l /dev/nvidia*; env | grep -e CUDA_VISIBLE_DEVICES -e NVIDIA_VISIBLE_DEVICES"),
    CuResult(101, "CUDA_ERROR_INVALID_DEVICE", NO_DEVICE,
             "the device ordinal is not a valid CUDA device (CUDA_VISIBLE_DEVICES names one that is not there)",
             "nvidia-smi -L, and compare with CUDA_VISIBLE_DEVICES"),
    CuResult(304, "CUDA_ERROR_OPERATING_SYSTEM", NOT_PERMITTED,
             "an OS call failed: the process may not use the driver (a sandbox, seccomp or missing device files)",
             "ls -l /dev/nvidia*; sudo dmesg | grep -i -e nvrm -e denied"),
    CuResult(802, "CUDA_ERROR_SYSTEM_NOT_READY", FABRIC,
             "the system is not yet ready (an NVSwitch system without nvidia-fabricmanager running)",
             "systemctl status nvidia-fabricmanager"),
    CuResult(803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", COMPAT,
             "the CUDA driver (libcuda) and the display driver (the kernel module) are versions that do not work "
             "together", "cat /proc/driver/nvidia/version, and compare with the loaded libcuda's version"),
    CuResult(804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", COMPAT,
             "forward compatibility was attempted on hardware that does not support it (it is for data-centre "
             "GPUs)", "take the cuda-compat libcuda off the loader's path"),
    CuResult(999, "CUDA_ERROR_UNKNOWN", UNKNOWN, "an unknown internal error in the driver",
             "sudo dmesg | grep -i -e xid -e nvrm; ls -l /dev/nvidia-uvm; nvidia-smi -q"),
)}


def cu_result(code: int, name: str | None = None) -> CuResult:
    """The table's entry for a code; an unknown code keeps the driver's own name and class OTHER."""
    known = CU_RESULTS.get(code)
    if known is not None:
        return known
    return CuResult(code, name or f"CUresult {code}", OTHER, "an error this check has no reading for",
                    "nvidia-smi -q; sudo dmesg | grep -i nvrm")


# -- where the loaded libcuda came from ----------------------------------------------------------------------
SYSTEM = "system"
WSL = "wsl"
TEGRA = "tegra"
COMPAT_PACKAGE = "compat"
TOOLKIT_STUB = "stub"
CONDA = "conda"
ORIGIN_UNKNOWN = "unknown"

ORIGIN_WORDS = {
    SYSTEM: "the NVIDIA driver's own libcuda",
    WSL: "the Windows driver's libcuda, mapped into WSL",
    TEGRA: "the Jetson (Tegra) driver's libcuda",
    COMPAT_PACKAGE: "a CUDA forward-compatibility libcuda (cuda-compat)",
    TOOLKIT_STUB: "the CUDA toolkit's stub libcuda (for linking only)",
    CONDA: "a libcuda inside a conda environment",
    ORIGIN_UNKNOWN: "a libcuda from an unexpected place",
}

# Order matters: a stub or a compat directory may sit under any prefix (even a conda environment's).
_ORIGINS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (TOOLKIT_STUB, re.compile(r"/stubs/[^/]*$")),
    (COMPAT_PACKAGE,
     re.compile(r"/(cuda[^/]*/compat(/lib[^/]*)?|cuda-compat[^/]*(/lib[^/]*)?|compat/lib[^/]*)/[^/]*$")),
    (WSL, re.compile(r"^/usr/lib/wsl/(lib|drivers)/")),
    (TEGRA, re.compile(r"^/usr/lib/aarch64-linux-gnu/(tegra|nvidia)/")),
    (CONDA, re.compile(r"/(envs/[^/]+/|(ana|mini|mamba)conda3?/|miniforge3?/|mambaforge/)lib/[^/]*$")),
    (SYSTEM, re.compile(r"^/(usr/)?lib(64|32)?/([a-z0-9_]+-linux-gnu[^/]*/)?(nvidia/(current/)?)?[^/]*$")),
    (SYSTEM, re.compile(r"^/usr/local/nvidia/lib(64)?/[^/]*$")),  # what the container runtime injects (older)
    (SYSTEM, re.compile(r"(?i)^[a-z]:\\windows\\system32\\")),
)


def libcuda_origin(path: str | None) -> str:
    """system, wsl, tegra, compat, stub, conda or unknown, from the path the loader mapped."""
    if not path:
        return ORIGIN_UNKNOWN
    for origin, pattern in _ORIGINS:
        if pattern.search(path):
            return origin
    return ORIGIN_UNKNOWN


def cuda_version_text(version: int | None) -> str | None:
    """12080 -> "12.8"."""
    return None if not version else f"{version // 1000}.{(version % 1000) // 10}"


@dataclass(frozen=True)
class DriverApiAnswer:
    """What the probe child's own cuInit learnt; `result` is None when no call answered (not loaded, timed out)."""

    loaded: bool
    path: str | None
    origin: str
    driver_version: int | None  # cuDriverGetVersion: the CUDA version the loaded libcuda implements
    result: CuResult | None
    timed_out: bool
    load_error: str | None
    device_count: int | None

    @property
    def failed(self) -> bool:
        return self.result is not None and self.result.kind != OK

    @property
    def directory(self) -> str | None:
        return self.path.rsplit("/", 1)[0] if self.path and "/" in self.path else None

    def describe(self) -> str:
        """"cuInit returned 100 (CUDA_ERROR_NO_DEVICE)"."""
        if self.timed_out:
            return "cuInit did not return"
        if self.result is None:
            return "cuInit was not called"
        return f"cuInit returned {self.result.code} ({self.result.name})"

    def evidence(self) -> dict[str, Any]:
        return {"libcuda": self.path, "libcuda_origin": ORIGIN_WORDS[self.origin],
                "libcuda_cuda_version": cuda_version_text(self.driver_version), "cuInit": self.describe()}


def driver_api_answer(raw: dict[str, Any] | None) -> DriverApiAnswer | None:
    """The probe's record read as typed values; None when the probe did not ask (macOS, an older snapshot)."""
    if not raw:
        return None
    code = raw.get("init_result")
    path = raw.get("path")
    return DriverApiAnswer(
        loaded=bool(raw.get("loaded")), path=path, origin=libcuda_origin(path),
        driver_version=raw.get("driver_version"),
        result=cu_result(int(code), raw.get("init_name")) if code is not None else None,
        timed_out=bool(raw.get("init_timed_out")), load_error=raw.get("error"),
        device_count=raw.get("device_count"))
