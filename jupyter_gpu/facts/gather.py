"""Gather every fact `%gpucheck` needs into one JSON-serialisable snapshot (docs/facts-schema.md)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from jupyter_gpu.facts.context import ProbeContext
from jupyter_gpu.facts.inkernel import gather_in_kernel
from jupyter_gpu.facts.kernel import gather_kernel
from jupyter_gpu.facts.libraries import library_path_facts
from jupyter_gpu.facts.probe import BASE_SECTIONS, ProbeHandle, start_probe
from jupyter_gpu.facts.probe_cache import CachedProbe, TorchProbeCache, lookup_key
from jupyter_gpu.facts.system import gather_system
from jupyter_gpu.snapshot.schedulers import ACCESS_VARIABLES
from jupyter_gpu.version import __version__

SCHEMA_NAME = "jupyter-gpu/facts"
# 2: NVML fields named as the live metrics name them (mig_enabled, mig_instances, processes' memory_used).
SCHEMA_VERSION = 2
# For benchmarks (bench/bench_gpucheck.py): import torch in the child even on a machine without a GPU, as a
# GPU machine would, from a fresh `jupyter-gpu check` process.
FORCE_TORCH_PROBE_VARIABLE = "JUPYTER_GPU_FORCE_TORCH_PROBE"

RELEVANT_ENV: tuple[str, ...] = tuple(dict.fromkeys((
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
    "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HSA_OVERRIDE_GFX_VERSION", "LD_LIBRARY_PATH",
    "CUDA_HOME", "CUDA_PATH", "PYTORCH_NVML_BASED_CUDA_CHECK", "CUDA_LAUNCH_BLOCKING",
    "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "CUDA_MODULE_LOADING", "PYTHONPATH", "PYTHONNOUSERSITE",
    "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "JPY_PARENT_PID", "VSCODE_PID", "COLAB_RELEASE_TAG",
    "KAGGLE_KERNEL_RUN_TYPE", "WSL_DISTRO_NAME", "KUBERNETES_SERVICE_HOST",
    # What feeds the panels in this process: a simulated or replayed backend is said beside the real check.
    "JUPYTER_GPU_BACKEND",
    # Who may open the GPU (snapshot/schedulers.py): what the job schedulers set inside a job and when it was given
    # GPUs, Kubernetes' service variable, a JupyterHub server's variables, WSL's.
    *ACCESS_VARIABLES,
)))


def file_gpu_evidence(system: dict[str, Any], build: dict[str, Any] | None) -> list[str]:
    """Signs read from host files (PCI, device nodes, the driver): known before any child runs.

    Without the torch build (`build=None`, before the base child is back) Intel GPUs and render nodes,
    which only count for some builds, are left out.
    """
    build = build or {}
    xpu_build = "+xpu" in (build.get("version") or "")
    # Nearly every laptop has an Intel GPU: it only counts for an XPU build of torch.
    signs = [f"PCI {g['vendor']} GPU at {g['address']}" for g in system["pci_gpus"]
             if g["vendor"] != "intel" or xpu_build]
    # Render nodes exist on most Intel laptops: they only count for ROCm and XPU builds of torch.
    accelerated = bool(build.get("hip")) or xpu_build
    signs += [n["path"] for n in system["device_nodes"] if accelerated or not n["path"].startswith("/dev/dri/")]
    if system["driver"]["proc_version_text"]:
        signs.append("/proc/driver/nvidia/version")
    # Windows has no /proc or /dev: the driver's nvcuda.dll in System32 is the sign (without nvidia-ml-py).
    signs += [lib["path"] for lib in (system["driver"].get("libraries") or {}).get("nvcuda.dll") or []]
    return signs


def platform_gpu_evidence(system: dict[str, Any]) -> list[str]:
    return ["macOS (MPS)"] if system["platform"]["system"] == "Darwin" else []


def early_gpu_evidence(system: dict[str, Any]) -> list[str]:
    """The evidence that is enough to start the torch child at once, beside the base child."""
    return file_gpu_evidence(system, None) + platform_gpu_evidence(system)


def gpu_evidence(snapshot: dict[str, Any]) -> list[str]:
    """Signs that a GPU may be reachable; without any, importing torch cannot change the verdict."""
    system = snapshot["system"]
    nvml = snapshot.get("nvml") or {}
    signs = file_gpu_evidence(system, (snapshot.get("install") or {}).get("build"))
    if nvml.get("status") == "ok" or (nvml.get("status") == "init_failed" and nvml.get("error_code") != 12):
        signs.append(f"NVML {nvml.get('status')}")
    return signs + platform_gpu_evidence(system)


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


class TorchProbe:
    """The torch child's answer for one check: from the cache, from a child started early, or from a
    child started once the base child showed it is wanted (NVML evidence, a stale cache entry)."""

    def __init__(self, ctx: ProbeContext, system: dict[str, Any], env: dict[str, str], *,
                 cache: TorchProbeCache | None, refresh: bool) -> None:
        self.ctx, self.cache, self.refresh = ctx, cache, refresh
        self.key = lookup_key(ctx, system, env) if cache is not None else ""
        # Looked up before any child runs, so a hit starts no torch child at all.
        self.cached: CachedProbe | None = None if cache is None or refresh else cache.lookup(self.key)
        self.handle: ProbeHandle | None = None

    def start_early(self) -> None:
        if self.cached is None and self.handle is None:
            self.handle = start_probe(self.ctx, ("torch",))

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()

    def answer(self, snapshot: dict[str, Any], reason: str) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        status = "refresh" if self.refresh else "miss"
        if self.cached is not None and self.cache is not None:
            if self.cache.matches(self.cached, snapshot):
                return self.cached.torch, {**self.cached.record, "reason": reason, "cached": True,
                                           "cache_status": "hit", "cache_file": str(self.cached.path),
                                           "cache_created": self.cached.created}
            self.cache.discard(self.cached)  # NVML, the install or sys.path changed since it was written
            status = "stale"
        result = (self.handle or start_probe(self.ctx, ("torch",))).result()
        torch = result.get("torch")
        record = {"ran": True, "reason": reason, "cached": False, **(result.get("run") or {})}
        if self.cache is None:
            return torch, record
        written = self.cache.store(self.key, self.ctx, snapshot, torch, record) if record.get("ok") else None
        return torch, {**record, "cache_status": status, "cache_file": str(written) if written else None}


def mark_process_namespaces(ctx: ProbeContext, nvml: dict[str, Any] | None) -> None:
    """Whether each GPU process's PID exists in our /proc: inside a container NVML reports *host* PIDs,
    which can include this very kernel, and which `kill` cannot reach from here."""
    for device in (nvml or {}).get("devices") or []:
        for process in device.get("processes") or []:
            # Windows has one PID namespace and no /proc to look in.
            process["in_this_pid_namespace"] = True if ctx.windows else ctx.exists(f"/proc/{process['pid']}")


def gather_facts(
    ctx: ProbeContext,
    *,
    notebook: dict[str, Any] | None = None,
    cache: TorchProbeCache | None = None,
    refresh: bool = False,
    force_torch_probe: bool = False,
    while_waiting: Callable[[], object] | None = None,
) -> dict[str, Any]:
    """The facts snapshot. The torch child (the slow part) starts at once, beside the base child, when the
    host files already show GPU evidence; `cache` (None: none) can spare it altogether. `while_waiting`
    runs once the children are started (the caller's own imports, say), overlapping their run."""
    started = time.monotonic()
    force_torch_probe = force_torch_probe or ctx.env.get(FORCE_TORCH_PROBE_VARIABLE) == "1"
    system = gather_system(ctx)
    env = {name: ctx.env[name] for name in RELEVANT_ENV if name in ctx.env}
    torch_probe = TorchProbe(ctx, system, env, cache=cache, refresh=refresh)
    if force_torch_probe or early_gpu_evidence(system):
        torch_probe.start_early()
    base_probe = start_probe(ctx, BASE_SECTIONS)
    if while_waiting is not None:
        while_waiting()
    base = base_probe.result()
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
        "system": system,
        "env": env,
    }
    mark_process_namespaces(ctx, snapshot["nvml"])
    snapshot["kernel"] = gather_kernel(ctx, snapshot["python"] or {})
    snapshot["in_kernel"] = gather_in_kernel(ctx.modules)
    wanted, reason = torch_probe_decision(snapshot)
    if wanted or force_torch_probe:
        snapshot["torch"], snapshot["probe"]["torch"] = torch_probe.answer(snapshot, reason)
        libcuda_in_machine_paths(ctx, snapshot["torch"])
    else:
        torch_probe.cancel()
        snapshot["torch"], snapshot["probe"]["torch"] = None, {"ran": False, "reason": reason, "cached": False}
    if (snapshot["torch"] or {}).get("import_error"):
        # Only then: which folders the dynamic loader searched ahead of torch's wheels, and what they hold.
        snapshot["library_path"] = library_path_facts(ctx)
    snapshot["notebook"] = notebook
    snapshot["gather_s"] = round(time.monotonic() - started, 3)
    return snapshot


def libcuda_in_machine_paths(ctx: ProbeContext, torch: dict[str, Any] | None) -> None:
    """The libcuda the child loaded, named as the checked machine names it: under a root other than / (a mounted
    image, a test's fake machine) the loader found it inside that root, as the host files are read there."""
    api = (torch or {}).get("driver_api") or {}
    path = api.get("path")
    # The loader maps the real file, so the root is also compared as its real path.
    for root in {str(ctx.root).rstrip("/"), os.path.realpath(ctx.root).rstrip("/")}:
        if root and isinstance(path, str) and path.startswith(root + "/"):
            api["path"] = path[len(root):]
            return


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
