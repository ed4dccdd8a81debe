"""Gather every fact `%gpucheck` needs into one JSON-serialisable snapshot (docs/facts-schema.md)."""

from __future__ import annotations

import hashlib
import json
import time
from datetime import UTC, datetime
from typing import Any

from jupyter_gpu.gpucheck.facts.context import ProbeContext
from jupyter_gpu.gpucheck.facts.inkernel import gather_in_kernel
from jupyter_gpu.gpucheck.facts.kernel import gather_kernel
from jupyter_gpu.gpucheck.facts.probe import BASE_SECTIONS, run_probe
from jupyter_gpu.gpucheck.facts.system import gather_system
from jupyter_gpu.version import __version__

SCHEMA_NAME = "jupyter-gpu/facts"
# 2: NVML fields named as the live metrics name them (mig_enabled, mig_instances, processes' memory_used).
SCHEMA_VERSION = 2

RELEVANT_ENV = (
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
    "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HSA_OVERRIDE_GFX_VERSION", "LD_LIBRARY_PATH",
    "CUDA_HOME", "CUDA_PATH", "PYTORCH_NVML_BASED_CUDA_CHECK", "CUDA_LAUNCH_BLOCKING",
    "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "CUDA_MODULE_LOADING", "PYTHONPATH", "PYTHONNOUSERSITE",
    "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "JPY_PARENT_PID", "VSCODE_PID", "COLAB_RELEASE_TAG",
    "KAGGLE_KERNEL_RUN_TYPE", "SLURM_JOB_ID", "WSL_DISTRO_NAME", "KUBERNETES_SERVICE_HOST",
)


class TorchProbeCache:
    """Keeps the slow part (importing torch in a child, ~1 s) while its inputs have not changed.

    The key covers everything that can change the answer: the interpreter, the torch install on disk,
    the driver, the device nodes, the GPUs NVML lists and the relevant environment variables.
    """

    def __init__(self) -> None:
        self._key: str | None = None
        self._value: dict[str, Any] | None = None

    def get(self, key: str) -> dict[str, Any] | None:
        return self._value if key == self._key else None

    def put(self, key: str, value: dict[str, Any]) -> None:
        self._key, self._value = key, value


def torch_probe_key(ctx: ProbeContext, snapshot: dict[str, Any]) -> str:
    nvml = snapshot.get("nvml") or {}
    stable = {
        "python": ctx.python,
        "root": str(ctx.root),
        "cwd": ctx.cwd,
        "install": snapshot.get("install"),
        "driver": snapshot["system"]["driver"],
        "nodes": snapshot["system"]["device_nodes"],
        "nvml": [nvml.get("status"), nvml.get("driver_version"),
                 [(d.get("uuid"), d.get("mig_enabled")) for d in nvml.get("devices", [])]],
        "env": snapshot["env"],
    }
    return hashlib.sha256(json.dumps(stable, sort_keys=True, default=str).encode()).hexdigest()


def gpu_evidence(snapshot: dict[str, Any]) -> list[str]:
    """Signs that a GPU may be reachable; without any, importing torch cannot change the verdict."""
    system = snapshot["system"]
    nvml = snapshot.get("nvml") or {}
    build = (snapshot.get("install") or {}).get("build") or {}
    xpu_build = "+xpu" in (build.get("version") or "")
    # Nearly every laptop has an Intel GPU: it only counts for an XPU build of torch.
    signs = [f"PCI {g['vendor']} GPU at {g['address']}" for g in system["pci_gpus"]
             if g["vendor"] != "intel" or xpu_build]
    # Render nodes exist on most Intel laptops: they only count for ROCm and XPU builds of torch.
    accelerated = bool(build.get("hip")) or xpu_build
    signs += [n["path"] for n in system["device_nodes"] if accelerated or not n["path"].startswith("/dev/dri/")]
    if system["driver"]["proc_version_text"]:
        signs.append("/proc/driver/nvidia/version")
    if nvml.get("status") == "ok" or (nvml.get("status") == "init_failed" and nvml.get("error_code") != 12):
        signs.append(f"NVML {nvml.get('status')}")
    if system["platform"]["system"] == "Darwin":
        signs.append("macOS (MPS)")
    return signs


def torch_probe_decision(snapshot: dict[str, Any]) -> tuple[bool, str]:
    install = snapshot.get("install")
    if install is None:
        return False, "the kernel's interpreter could not be inspected (see probe.base)"
    if not install.get("spec_origin"):
        return False, "torch is not importable, so there is nothing to import"
    build = install.get("build") or {}
    evidence = gpu_evidence(snapshot)
    if evidence:
        return True, "GPU evidence: " + ", ".join(evidence[:4])
    if not build:
        return True, "the torch build could not be read from disk"
    return False, "no GPU, device node or driver on this machine: importing torch cannot find one"


def mark_process_namespaces(ctx: ProbeContext, nvml: dict[str, Any] | None) -> None:
    """Whether each GPU process's PID exists in our /proc: inside a container NVML reports *host* PIDs,
    which can include this very kernel, and which `kill` cannot reach from here."""
    for device in (nvml or {}).get("devices") or []:
        for process in device.get("processes") or []:
            process["in_this_pid_namespace"] = ctx.exists(f"/proc/{process['pid']}")


def gather_facts(
    ctx: ProbeContext,
    *,
    notebook: dict[str, Any] | None = None,
    cache: TorchProbeCache | None = None,
    refresh: bool = False,
    force_torch_probe: bool = False,
) -> dict[str, Any]:
    started = time.monotonic()
    base = run_probe(ctx, BASE_SECTIONS)
    snapshot: dict[str, Any] = {
        "schema": SCHEMA_NAME,
        "schema_version": SCHEMA_VERSION,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "tool_version": __version__,
        "context": {"root": str(ctx.root), "python": ctx.python, "cwd": ctx.cwd, "pid": ctx.pid},
        "probe": {"base": base.get("run")},
        "python": base.get("python"),
        "install": base.get("install"),
        "nvml": base.get("nvml"),
        "system": gather_system(ctx),
        "env": {name: ctx.env[name] for name in RELEVANT_ENV if name in ctx.env},
    }
    mark_process_namespaces(ctx, snapshot["nvml"])
    snapshot["kernel"] = gather_kernel(ctx, snapshot["python"] or {})
    snapshot["in_kernel"] = gather_in_kernel(ctx.modules)
    wanted, reason = torch_probe_decision(snapshot)
    wanted = wanted or force_torch_probe
    torch: dict[str, Any] | None = None
    probe_record: dict[str, Any] = {"ran": False, "reason": reason, "cached": False}
    if wanted:
        key = torch_probe_key(ctx, snapshot)
        cached = None if (refresh or cache is None) else cache.get(key)
        if cached is not None:
            torch, probe_record = cached["torch"], {**cached["record"], "cached": True}
        else:
            result = run_probe(ctx, ("torch",))
            torch = result.get("torch")
            probe_record = {"ran": True, "reason": reason, "cached": False, **(result.get("run") or {})}
            if cache is not None and result.get("run", {}).get("ok"):
                cache.put(key, {"torch": torch, "record": probe_record})
    snapshot["torch"] = torch
    snapshot["probe"]["torch"] = probe_record
    snapshot["notebook"] = notebook
    snapshot["gather_s"] = round(time.monotonic() - started, 3)
    return snapshot


def load_snapshot(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        snapshot = json.load(handle)
    if not isinstance(snapshot, dict) or snapshot.get("schema") != SCHEMA_NAME:
        raise ValueError(f"{path} is not a jupyter-gpu facts snapshot (no '{SCHEMA_NAME}' schema field)")
    version = snapshot.get("schema_version")
    if not isinstance(version, int):
        raise ValueError(f"{path} has no integer schema_version, so it cannot be read as a facts snapshot")
    if version > SCHEMA_VERSION:
        raise ValueError(
            f"{path} has facts schema version {snapshot['schema_version']}, newer than this jupyter-gpu "
            f"understands ({SCHEMA_VERSION}); upgrade jupyter-gpu to read it"
        )
    return upgraded(snapshot)


# Schema 1 named NVML's fields its own way; schema 2 uses the live metrics' names.
_V1_DEVICE_NAMES = {"mig_devices": "mig_instances", "mig_mode": "mig_enabled"}


def upgraded(snapshot: dict[str, Any]) -> dict[str, Any]:
    """An older snapshot in the current schema's names, so the rules know one vocabulary (the file is not changed)."""
    if snapshot.get("schema_version", SCHEMA_VERSION) >= 2:
        return snapshot
    for device in (snapshot.get("nvml") or {}).get("devices") or []:
        if "mig_mode" in device:
            mode = device["mig_mode"]
            device["mig_mode"] = None if mode is None else mode == 1
        for old, new in _V1_DEVICE_NAMES.items():
            if old in device:
                device[new] = device.pop(old)
            errors = device.get("errors") or {}
            if old in errors:
                errors[new] = errors.pop(old)
        for process in device.get("processes") or []:
            if "used_memory" in process:
                process["memory_used"] = process.pop("used_memory")
    snapshot["schema_version"] = SCHEMA_VERSION
    return snapshot


def save_snapshot(snapshot: dict[str, Any], path: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(snapshot, handle, indent=2, sort_keys=True, default=str)
        handle.write("\n")
