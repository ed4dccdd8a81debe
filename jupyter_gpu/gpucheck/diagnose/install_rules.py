"""Layers 0 and 1 of the catalogue: the kernel's Python, the torch install and the torch build (§3 A)."""

from __future__ import annotations

import re
from typing import Any

from jupyter_gpu.gpucheck.diagnose import library_rules
from jupyter_gpu.gpucheck.diagnose.fixes import RESTART, advice_evidence, pip_fix_lines, torch_not_for_this_jetson
from jupyter_gpu.gpucheck.diagnose.view import FactsView
from jupyter_gpu.models import LAYER_BUILD, LAYER_KERNEL, Finding

REFS_KERNEL = ["jupyter/notebook#4629", "jupyter/jupyter#270"]


def kernel_probe_failed(view: FactsView) -> list[Finding]:
    if view.base_probe_ok:
        return []
    run = (view.raw.get("probe") or {}).get("base") or {}
    return [Finding(
        "KERNEL_PROBE_FAILED", "fail",
        f"Could not run this kernel's Python ({view.kernel_python}) to inspect its packages.",
        evidence={"python": view.kernel_python, **{k: v for k, v in run.items() if v not in (None, "")}},
        fix=["Check that the kernel's interpreter still exists and starts: "
             f"`{view.kernel_python} -c 'import sys; print(sys.prefix)'`"],
        layer=LAYER_KERNEL,
    )]


def other_environments_with_torch(view: FactsView) -> list[dict[str, Any]]:
    """Environments the user may think they use (active venv/conda, python on PATH, kernelspecs)."""
    paths = view.paths
    own_prefix = view.python.get("prefix") or ""
    found = []
    for label, other in (view.kernel.get("other_environments") or {}).items():
        if not paths.same(other["prefix"], own_prefix) and other.get("torch"):
            found.append({"where": label, "prefix": other["prefix"], "torch": other["torch"],
                          "python": other.get("python")})
    for spec in view.kernel.get("kernelspecs") or []:
        python = spec.get("python") or ""
        spec_prefix = paths.prefix_of_interpreter(python)
        if spec.get("torch") and not paths.same(spec_prefix, own_prefix):
            found.append({"where": f"kernel '{spec['name']}'", "prefix": spec_prefix, "python": python,
                          "torch": spec["torch"], "kernelspec": spec["name"],
                          "display_name": spec.get("display_name")})
    return found


def env_mismatch_signals(view: FactsView) -> dict[str, str]:
    paths = view.paths
    prefix = view.python.get("prefix") or ""
    signals = {}
    venv = view.kernel.get("virtual_env")
    if venv and not paths.same(venv, prefix):
        signals["VIRTUAL_ENV"] = venv
    conda = view.kernel.get("conda_prefix")
    if conda and not (paths.same(conda, prefix) or paths.same(conda, view.python.get("base_prefix"))):
        signals["CONDA_PREFIX"] = conda
    which_python = view.kernel.get("which_python")
    if which_python and not paths.same(paths.prefix_of_interpreter(which_python), prefix):
        signals["python on PATH"] = which_python
    return signals


def torch_missing_or_env_mismatch(view: FactsView) -> list[Finding]:
    if not view.base_probe_ok:
        return []
    others = other_environments_with_torch(view)
    signals = env_mismatch_signals(view)
    python = view.kernel_python
    cuda_elsewhere = [o for o in others if o["torch"].get("cuda_build")]
    evidence = {"kernel_python": python, "kernel_prefix": view.python.get("prefix"), **signals}
    if others and (not view.torch_installed or (view.cpu_only_build and cuda_elsewhere)):
        best = (cuda_elsewhere or others)[0]
        env_python = best.get("python") or view.paths.interpreters_in_prefix(best["prefix"])[0]
        fix = []
        if best.get("kernelspec"):
            fix.append(f"Kernel → Change Kernel → \"{best.get('display_name') or best['kernelspec']}\" "
                       f"(that environment has torch {best['torch']['version']})")
        else:
            name = view.paths.basename(best["prefix"]) or "env"
            fix.append(f"{env_python} -m pip install ipykernel && {env_python} -m ipykernel install --user "
                       f"--name {name} --display-name \"Python ({name})\"  # then Kernel → Change Kernel")
        fix.append("Or install into this kernel itself with %pip (never !pip, which may target another env):")
        fix += pip_fix_lines(view)
        return [Finding(
            "KERNEL_ENV_MISMATCH", "fail",
            f"This kernel runs {python}, which has "
            + ("no torch" if not view.torch_installed else f"a CPU-only torch {view.torch_version}")
            + f", but torch {best['torch']['version']} is installed in {best['prefix']} ({best['where']}).",
            evidence={**evidence, "torch_elsewhere": [
                {"where": o["where"], "prefix": o["prefix"], "version": o["torch"]["version"]} for o in others]},
            fix=fix, refs=REFS_KERNEL, layer=LAYER_KERNEL,
        )]
    findings = []
    if not view.torch_installed:
        findings.append(Finding(
            "TORCH_NOT_INSTALLED", "fail",
            f"torch is not installed in this kernel's environment ({python}).",
            evidence={**evidence, "sys_path_searched": len(view.python.get("sys_path") or [])},
            fix=pip_fix_lines(view, keep_version=False), layer=LAYER_KERNEL,
        ))
    if signals:
        findings.append(Finding(
            "KERNEL_ENV_MISMATCH", "info",
            f"The kernel's Python is not the environment active around it: `pip` or `python` in a terminal "
            f"would use another environment than this kernel ({python}).",
            evidence=evidence, fix=["Install packages from the notebook with %pip, which targets this kernel."],
            refs=REFS_KERNEL, layer=LAYER_KERNEL,
        ))
    return findings


def shadowed_install(view: FactsView) -> list[Finding]:
    dists = view.install.get("distributions") or []
    origin = view.install.get("spec_origin")
    if not origin:
        return []
    locations = [d["location"] for d in dists]
    # A `torch/` folder in the working directory or on PYTHONPATH, with no install behind it, wins over the
    # real package (source checkouts installed in develop mode are not flagged: they have a dist elsewhere).
    paths = view.paths
    stray_roots = [view.python.get("cwd") or "", *paths.split_list(view.env.get("PYTHONPATH"))]
    package_parent = paths.dirname(paths.dirname(origin))
    outside = not any(paths.is_inside(origin, loc) for loc in locations) and any(
        paths.same(root, package_parent) for root in stray_roots)
    if len(dists) <= 1 and not outside:
        return []
    user_site = view.python.get("user_site") or ""
    fix = []
    if any(paths.is_inside(loc, user_site) or paths.same(loc, user_site) for loc in locations if user_site):
        fix.append(f"{view.kernel_python} -m pip uninstall -y torch   # run with PYTHONNOUSERSITE unset, "
                   "to remove the ~/.local copy")
        fix.append('Or add "env": {"PYTHONNOUSERSITE": "1"} to the kernelspec so the user site is ignored.')
    if outside:
        fix.append(f"Rename or remove {paths.dirname(origin)}: it is imported instead of the installed torch.")
    if not fix:
        fix.append(f"Remove the extra copies so one torch remains: {view.kernel_python} -m pip uninstall torch")
    return [Finding(
        "SHADOWED_TORCH_INSTALL", "fail" if outside else "warn",
        f"{len(dists)} torch installs are visible to this kernel; `import torch` loads {origin}.",
        evidence={"imported_from": origin, "installs": [f"{d['version']} in {d['location']}" for d in dists]},
        fix=fix, refs=["cloveranon/Clover-Edition#128", "pytorch#574"], layer=LAYER_KERNEL,
    )]


def stale_import(view: FactsView) -> list[Finding]:
    imported = view.in_kernel
    if not imported.get("torch_imported"):
        return []
    on_disk = (view.install.get("build") or {}).get("version") or view.torch_version
    origin = view.install.get("spec_origin")
    version_changed = bool(on_disk and imported.get("version") and imported["version"] != on_disk)
    file_changed = bool(origin and imported.get("file") and not view.paths.same(imported["file"], origin))
    if not (version_changed or file_changed):
        return []
    return [Finding(
        "STALE_TORCH_IMPORT", "fail",
        f"The kernel still runs torch {imported.get('version')}, but torch {on_disk} is now installed: "
        "the kernel was not restarted after the install.",
        evidence={"imported_version": imported.get("version"), "imported_file": imported.get("file"),
                  "installed_version": on_disk, "installed_file": origin},
        fix=["Kernel → Restart Kernel, then run the notebook from the top."], layer=LAYER_KERNEL,
    )]


def import_broken(view: FactsView) -> list[Finding]:
    record = view.torch_probe_record
    if record.get("timed_out"):
        return [Finding(
            "TORCH_PROBE_TIMEOUT", "fail",
            f"Importing torch and initialising CUDA took longer than {record.get('timeout_s')} s in a "
            "child process: a hung driver or a stalled network file system.",
            evidence={k: record.get(k) for k in ("timeout_s", "stderr_tail")},
            fix=["Check `nvidia-smi` in a terminal; if it hangs too, the driver needs a reset or a reboot.",
                 "If torch lives on a network drive, retry when it responds."], layer=LAYER_BUILD,
        )]
    if record.get("ran") and not record.get("ok"):
        crash = record.get("signal")
        return [Finding(
            "TORCH_IMPORT_BROKEN", "fail",
            f"torch crashed while importing ({crash})" if crash else "torch could not be imported.",
            evidence={k: record.get(k) for k in ("returncode", "signal", "stderr_tail") if record.get(k)},
            fix=[f"{view.kernel_python} -m pip install --force-reinstall torch=={view.torch_version or ''}"
                 .rstrip("="), RESTART], layer=LAYER_BUILD,
        )]
    error = view.torch_import_error
    if not error:
        return []
    if torch_not_for_this_jetson(view):
        return []  # a torch for another JetPack cannot load this one's libraries: host_rules.jetson_torch says so
    # The shared-library layer (library_rules.py): a wheel of the other CUDA major, then torch's own wheel at
    # another version than its pin, then a folder of LD_LIBRARY_PATH that holds the library.
    stray = library_rules.stray_wheel(view, error)
    if stray is not None:
        return [stray]
    wheel = nvidia_wheel_mismatch(view, error)
    if wheel is not None:
        return [wheel]
    shadowing = library_rules.ld_library_path_shadowing(view, error)
    if shadowing is not None:
        return shadowing
    return [Finding(
        "TORCH_IMPORT_BROKEN", "fail", "torch is installed but `import torch` fails.",
        evidence={"import_error": error, "traceback_tail": (view.torch or {}).get("traceback", "")[-800:]},
        fix=[*_reinstall_lines(view), "Do not mix conda's pytorch and pip's torch in one environment."],
        refs=["pytorch#29544"], layer=LAYER_BUILD,
    )]


def _reinstall_lines(view: FactsView) -> list[str]:
    """The same torch again from PyPI; on a Jetson PyPI has no build for it (nor NVIDIA's versions): its JetPack's."""
    if view.jetson:
        return pip_fix_lines(view)
    return [f"%pip install --force-reinstall torch=={view.torch_version}" if view.torch_version else
            "%pip install --force-reinstall torch", RESTART]


MISSING_LIBRARY = re.compile(r"lib([A-Za-z]+)[\w.]*?\.so(?:\.\d+)*: cannot open shared object file")
UNDEFINED_SYMBOL = re.compile(r"undefined symbol: ([A-Za-z_]\w*)")
# The nvidia-* wheel a library or a symbol comes from, by the words of its name (libcudnn -> nvidia-cudnn-cu12).
WHEEL_OF_LIBRARY = (("cudnn", "cudnn"), ("nccl", "nccl"), ("cublas", "cublas"), ("cusparselt", "cusparselt"),
                    ("cusparse", "cusparse"), ("cufft", "cufft"), ("curand", "curand"), ("cusolver", "cusolver"),
                    ("nvjitlink", "nvjitlink"), ("cupti", "cupti"), ("cudart", "cuda-runtime"),
                    ("nvrtc", "nvrtc"), ("cufile", "cufile"), ("nvshmem", "nvshmem"), ("nvtx", "nvtx"))


def _wheel_part(error: str) -> str | None:
    match = MISSING_LIBRARY.search(error) or UNDEFINED_SYMBOL.search(error)
    if match is None:
        return None
    name = match.group(1).lower().lstrip("_")  # __nvJitLinkComplete_12_4: nvJitLink's own symbols
    return next((wheel for prefix, wheel in WHEEL_OF_LIBRARY if name.startswith(prefix)), None)


def nvidia_wheel_mismatch(view: FactsView, error: str) -> Finding | None:
    """`import torch` failed on a CUDA library that one of torch's pinned nvidia-* wheels provides, and that wheel is
    missing or at another version than torch's pin: name it, and the one-line install that puts it back."""
    part = _wheel_part(error)
    pins = view.install.get("nvidia_pins") or []
    pin = next((p for p in pins if part and part in p["name"] and p.get("installed") != p["required"]), None)
    if pin is None:
        return None
    installed = pin.get("installed")
    others = [f"{o['name']} {o['version']} (asks for {pin['name']}{o['spec'] or ' at any version'})"
              for o in pin.get("required_by") or []]
    fix = [f"%pip install {pin['name']}=={pin['required']}", RESTART]
    if others:
        fix.append(f"{', '.join(others)} wants another version: keep it in its own environment (a venv or a kernel "
                   "of its own), or the two will keep replacing each other's wheel.")
    fix.append(f"Or reinstall torch with all its wheels (about 2.5 GB): %pip install --force-reinstall "
               f"torch=={view.torch_version}" if view.torch_version else
               "Or reinstall torch with all its wheels (about 2.5 GB): %pip install --force-reinstall torch")
    return Finding(
        "NVIDIA_WHEEL_MISMATCH", "fail",
        f"torch{' ' + view.torch_version if view.torch_version else ''} cannot load its CUDA libraries: it needs "
        f"{pin['name']}=={pin['required']}, "
        + (f"and {installed} is installed." if installed else "and it is not installed."),
        evidence={"import_error": error, "required by torch": f"{pin['name']}=={pin['required']}",
                  "installed": installed or "not installed", "other packages asking for it": others or None},
        fix=fix, layer=LAYER_BUILD)


def cpu_only_build(view: FactsView) -> list[Finding]:
    if not view.cpu_only_build or view.platform.get("system") == "Darwin" or view.docker_desktop_vm or view.jetson:
        return []  # no PyPI CUDA build helps in Docker Desktop's VM or on a Jetson: their own findings say what can
    gpu_here = view.nvidia_present or bool(view.amd_pci)
    version = view.torch_version
    return [Finding(
        "CPU_ONLY_BUILD", "fail" if gpu_here else "info",
        f"torch {version} is a CPU-only build: it cannot use a GPU"
        + (" even though this machine has one." if gpu_here else "."),
        evidence={"torch_version": version, "torch.version.cuda": view.torch_cuda,
                  "torch.version.hip": view.torch_hip, "conda_builds": view.install.get("conda_builds") or None,
                  **advice_evidence(view)},
        fix=(pip_fix_lines(view) if gpu_here else
             ["On a machine with an NVIDIA GPU, install a CUDA build:", *pip_fix_lines(view)]),
        refs=["pytorch#28111"], layer=LAYER_BUILD,
    )]


def cudnn_unavailable(view: FactsView) -> list[Finding]:
    torch = view.torch or {}
    if not (view.probe_ran and torch.get("compiled_with_cuda") and torch.get("device_count")):
        return []
    if torch.get("cudnn_version") is not None:
        return []
    return [Finding(
        "CUDNN_UNAVAILABLE", "warn",
        "This CUDA build of torch cannot load cuDNN: convolutions and RNNs fall back to slow kernels.",
        evidence={"cudnn_version": None, "cudnn_error": torch.get("cudnn_error"),
                  "LD_LIBRARY_PATH": view.env.get("LD_LIBRARY_PATH")},
        fix=[f"%pip install --force-reinstall nvidia-cudnn-cu{(view.torch_cuda or '12').split('.')[0]}",
             RESTART], layer=LAYER_BUILD,
    )]


RULES = (kernel_probe_failed, torch_missing_or_env_mismatch, shadowed_install, stale_import, import_broken,
         cpu_only_build, cudnn_unavailable)
