"""Layer 5, the CUDA driver (issue 49): the libcuda the loader gives torch, and cuInit's own code for it.

The probe child asks the driver API itself (facts/probe_script.py, `driver_api_facts`), so these rules read the
driver's answer, not torch's retelling of it (torch says nothing at all for CUDA_ERROR_NO_DEVICE). Three situations:
the toolkit's stub libcuda is reached first; a forward-compatibility libcuda where it cannot work (804 on a GPU without
forward-compat support, 803 against a kernel module it does not fit); any other cuInit failure that no lower layer (the
host, visibility, the driver's version) has already explained. Each names the file and how it was reached: through
LD_LIBRARY_PATH, or through the loader's own configuration (/etc/ld.so.conf.d), whose fixes differ.
"""

from __future__ import annotations

import re

from jupyter_gpu.gpucheck.diagnose import cuda_driver as cd
from jupyter_gpu.gpucheck.diagnose.fixes import pip_fix_lines
from jupyter_gpu.gpucheck.diagnose.view import FactsView
from jupyter_gpu.models import LAYER_COMPAT, LAYER_HOST, LAYER_VISIBILITY, Finding

# Findings at these layers explain a failing cuInit from below (a missing nvidia_uvm, a hiding CUDA_VISIBLE_DEVICES, a
# driver too old for the wheel): the driver's code then only confirms them.
EXPLAINING_LAYERS = (LAYER_HOST, LAYER_VISIBILITY, LAYER_COMPAT)
COMPAT_FOLDER_VERSION = re.compile(r"/cuda-(\d+)\.(\d+)/")
# The loader is read once, when a process starts: the kernel must start again to load another libcuda.
RESTART_LOADER = "Then restart the kernel (Kernel → Restart Kernel): the loader reads its path when a process starts."


def ld_library_path_entries(view: FactsView, origin: str) -> list[str]:
    """LD_LIBRARY_PATH's entries that lead to a libcuda of this origin (the loaded file's path is the real one, after
    /usr/local/cuda and lib64 links, so entries are judged by what they are, not compared as strings)."""
    return [p for p in view.paths.library_search_path(view.env)
            if cd.libcuda_origin(p.rstrip("/") + "/libcuda.so.1") == origin]


def removal_fix(view: FactsView, api: cd.DriverApiAnswer) -> list[str]:
    """Take the libcuda's directory off the loader's path: LD_LIBRARY_PATH where it names it, else the loader's
    configuration that does."""
    entries = ld_library_path_entries(view, api.origin)
    if entries:
        rest = [p for p in view.paths.library_search_path(view.env) if p not in entries]
        return [f"%env LD_LIBRARY_PATH={':'.join(rest)}   # without {', '.join(entries)}; also where it is set "
                "(the kernelspec's \"env\", ~/.bashrc, the image's ENV)", RESTART_LOADER]
    folder = api.directory or "that directory"
    return [f"grep -rl {folder} /etc/ld.so.conf /etc/ld.so.conf.d/   # the loader's configuration that names it",
            "Remove that line (or file), then: sudo ldconfig   # and check: ldconfig -p | grep libcuda.so.1",
            RESTART_LOADER]


def compat_package(api: cd.DriverApiAnswer) -> str:
    """cuda-compat-12-8, from the folder (/usr/local/cuda-12.8/compat) or else the libcuda's own CUDA version."""
    match = COMPAT_FOLDER_VERSION.search(api.path or "")
    if match:
        return f"cuda-compat-{match.group(1)}-{match.group(2)}"
    version = cd.cuda_version_text(api.driver_version)
    return f"cuda-compat-{version.replace('.', '-')}" if version else "cuda-compat-*"


def stub_libcuda(view: FactsView, api: cd.DriverApiAnswer) -> Finding:
    return Finding(
        "CUDA_DRIVER_STUB", "fail",
        f"torch reaches the CUDA toolkit's stub libcuda ({api.path}), not the NVIDIA driver's: {api.describe()}; "
        "the stub is for linking only and no GPU can be used through it.",
        evidence={**api.evidence(), "LD_LIBRARY_PATH": view.env.get("LD_LIBRARY_PATH"),
                  "driver_libcuda": [lib.get("resolved") for lib in
                                     (view.driver.get("libraries") or {}).get("libcuda.so.1") or []] or None},
        fix=removal_fix(view, api), refs=["NVIDIA/warp#219", "numba/numba#9732"], layer=LAYER_HOST)


def _gpu_names(view: FactsView) -> str:
    names = sorted({d.name for d in view.nvml_devices if d.name})
    return ", ".join(names) or "this GPU"


def compat_unsupported(view: FactsView, api: cd.DriverApiAnswer) -> Finding:
    package = compat_package(api)
    return Finding(
        "FORWARD_COMPAT_UNSUPPORTED", "fail",
        f"A CUDA forward-compatibility libcuda ({api.path}, CUDA {cd.cuda_version_text(api.driver_version) or '?'}) "
        f"is loaded on {_gpu_names(view)}, which does not support forward compatibility (a data-centre GPU "
        f"feature): {api.describe()}.",
        evidence={**api.evidence(), "gpus": _gpu_names(view), "driver_version": view.driver_version,
                  "LD_LIBRARY_PATH": view.env.get("LD_LIBRARY_PATH")},
        fix=[*removal_fix(view, api),
             f"or remove the package that installed it: sudo apt remove {package}   # dnf: sudo dnf remove {package}; "
             "on the host too where a container runtime injects it",
             "or install a torch wheel the host driver supports:", *pip_fix_lines(view)],
        refs=["NVIDIA/nvidia-docker#1515"], layer=LAYER_HOST)


def compat_mismatch(view: FactsView, api: cd.DriverApiAnswer) -> Finding:
    compat, host = api.driver_version, view.cuda_driver_version
    module = view.driver.get("kernel_module_version") or view.driver_version or "?"
    why = ("this driver is as new or newer, so it needs no compat libcuda" if compat and host and host >= compat
           else "the compat package supports only some older driver branches")
    package = compat_package(api)
    return Finding(
        "FORWARD_COMPAT_MISMATCH", "fail",
        f"The CUDA forward-compatibility libcuda at {api.path} (CUDA {cd.cuda_version_text(compat) or '?'}) does not "
        f"fit the loaded kernel module {module} (CUDA {cd.cuda_version_text(host) or '?'}): {api.describe()}; "
        f"{why}.",
        evidence={**api.evidence(), "kernel_module_version": module, "driver_cuda_version": host,
                  "LD_LIBRARY_PATH": view.env.get("LD_LIBRARY_PATH")},
        fix=[*removal_fix(view, api),
             f"or remove the package that installed it: sudo apt remove {package}   # dnf: sudo dnf remove {package}"],
        refs=["NVIDIA/nvidia-container-toolkit#1679", "NVIDIA-NeMo/labs-molt#44"], layer=LAYER_HOST)


def init_failed(view: FactsView, api: cd.DriverApiAnswer) -> Finding:
    result = api.result
    listed = len(view.nvml_devices) if view.nvml_ok else 0
    meaning = "it did not return (a GPU or the kernel module in a bad state)" if result is None else result.meaning
    todo = "sudo dmesg | grep -i -e xid -e nvrm; nvidia-smi -q" if result is None else result.todo
    return Finding(
        "CUDA_DRIVER_INIT_FAILED", "fail",
        f"The CUDA driver does not start: {api.describe()}: {meaning}"
        + (f", though NVML lists {listed} GPU{'s' if listed > 1 else ''}." if listed else "."),
        evidence={**api.evidence(), "nvml_gpus": listed or None, "torch": view.cuda_messages or None},
        fix=[f"What tells more, in a terminal outside Jupyter: {todo}",
             "Then check the same in a plain python: python -c \"import ctypes; print(ctypes.CDLL('libcuda.so.1')"
             ".cuInit(0))\"   # 0 is success"],
        layer=LAYER_HOST)


def _explained_below(already: list[Finding]) -> bool:
    return any(f.severity == "fail" and f.layer in EXPLAINING_LAYERS for f in already)


def driver_api_findings(view: FactsView, already: list[Finding]) -> list[Finding]:
    """The driver's own answer, where it says more than the rules below it have (run after them, before the last
    word, device_rules.cuda_not_available)."""
    api = view.driver_api
    if api is None or not api.loaded:
        return []
    kind = api.result.kind if api.result is not None else None
    if api.origin == cd.TOOLKIT_STUB or kind == cd.STUB:
        return [stub_libcuda(view, api)]
    if api.origin == cd.COMPAT_PACKAGE and api.result is not None and api.result.code == 804:
        return [compat_unsupported(view, api)]
    if api.origin == cd.COMPAT_PACKAGE and api.result is not None and api.result.code == 803:
        return [compat_mismatch(view, api)]
    if (api.failed or api.timed_out) and not _explained_below(already):
        return [init_failed(view, api)]
    return []


def compat_answered(view: FactsView, code: int) -> bool:
    """The probe's own cuInit gave this compat code from a cuda-compat libcuda: driver_api_findings names it."""
    api = view.driver_api
    return bool(api and api.origin == cd.COMPAT_PACKAGE and api.result is not None and api.result.code == code)
