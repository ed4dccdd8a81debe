"""Runs in a *subprocess* of the kernel's own interpreter and prints one JSON document.

Why a subprocess: `torch.cuda.is_available()` runs cuInit, after which any forked DataLoader worker that
touches CUDA dies ("Cannot re-initialize CUDA in forked subprocess"), and the "CUDA initialization: ..."
warning is only emitted once per process. A child process sees the same interpreter, environment and
working directory as the kernel, captures warnings, import errors and even segfaults verbatim, and
leaves the kernel untouched.

This file must stay self-contained (standard library only, no jupyter_gpu imports): it is sent to the
child with `python -c`, so `sys.path[0]` is the working directory exactly as in the kernel, where a stray
`torch/` folder shadows the real package.

Every section records its own error instead of raising: a broken environment is a fact to diagnose.
"""

import contextlib
import json
import os
import platform
import re
import sys
import time
import traceback
import warnings

MARKER = "@@JUPYTER_GPU_PROBE@@"
STARTED = time.monotonic()


def _error_text(exc):
    return f"{type(exc).__name__}: {exc}"


def python_facts():
    import site

    try:
        user_site = site.getusersitepackages()
    except Exception as exc:  # a broken site module is reported, not fatal
        user_site = f"unknown ({_error_text(exc)})"
    return {
        "executable": sys.executable,
        "executable_realpath": os.path.realpath(sys.executable),
        "version": ".".join(str(part) for part in sys.version_info[:3]),
        "prefix": sys.prefix,
        "base_prefix": sys.base_prefix,
        "user_site": user_site,
        "user_site_enabled": bool(site.ENABLE_USER_SITE),
        "sys_path": list(sys.path),
        "cwd": os.getcwd(),
    }


VERSION_ASSIGNMENT = re.compile(r"^(__version__|cuda|hip|rocm|xpu)\s*(?::[^=]*)?=\s*(.+?)\s*$", re.M)


def read_version_file(package_dir):
    """torch/version.py, read as text: the build (CUDA, ROCm, CPU) without importing torch."""
    path = os.path.join(package_dir, "version.py")
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError:
        return None
    values = {}
    for name, raw in VERSION_ASSIGNMENT.findall(text):
        raw = raw.strip()
        if raw == "None":
            values[name] = None
        elif raw[:1] in "'\"":
            values[name] = raw.strip("'\"")
    return {"path": path, "version": values.get("__version__"), "cuda": values.get("cuda"),
            "hip": values.get("hip") or values.get("rocm")}


CUDA_FLAVOUR = re.compile(r"^nvidia-[a-z0-9-]+-cu(\d+)\b", re.I)


def distribution_facts(name):
    from importlib import metadata

    found = []
    for dist in metadata.distributions(name=name):
        requires = dist.requires or []
        flavours = sorted({m.group(1) for r in requires for m in [CUDA_FLAVOUR.match(r)] if m})
        installer = (dist.read_text("INSTALLER") or "").strip() or None
        found.append({
            "version": dist.version,
            "location": str(dist.locate_file("")),
            "cuda_requirements": ["cu" + f for f in flavours],
            "installer": installer,
        })
    return found


COMPANIONS = ("torchvision", "torchaudio")
TORCH_PIN = re.compile(r"^torch\s*\(?\s*==\s*([^\s;,)]+)", re.I)


def package_dir(name):
    import importlib.util

    spec = importlib.util.find_spec(name)  # finds without importing a top-level package
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return spec, (locations[0] if locations else None)


def companion_facts(name, records=()):
    """torchvision or torchaudio as installed on disk: version, the torch it was built for, its version.py, and the
    conda package that installed it (None when pip or another installer did)."""
    from importlib import metadata

    dists = distribution_facts(name)
    if not dists:
        return None
    pins = []
    conda = None
    for dist in metadata.distributions(name=name):
        pins += [m.group(1) for r in dist.requires or [] for m in [TORCH_PIN.match(r)] if m]
        conda = conda_owner(dist, records)
        break
    _, folder = package_dir(name)
    return {"version": dists[0]["version"], "location": dists[0]["location"], "installs": len(dists),
            "requires_torch": pins[0] if pins else None, "package_dir": folder,
            "build": read_version_file(folder) if folder else None, "conda": conda}


# The conda packages that install torch and its companions (conda-forge splits libtorch out of pytorch).
CONDA_TORCH_PACKAGES = ("pytorch", "torchvision", "torchaudio", "libtorch")


def channel_name(url):
    """"https://conda.anaconda.org/conda-forge/linux-64" -> "conda-forge"; Anaconda's own -> "defaults"."""
    url = (url or "").rstrip("/")
    if "repo.anaconda.com" in url or url.startswith("pkgs/"):
        return "defaults"
    parts = [part for part in url.split("/") if part]
    if parts and re.fullmatch(r"(linux|osx|win|noarch)(-\w+)?", parts[-1]):
        parts = parts[:-1]
    return parts[-1] if parts else None


def conda_records():
    """conda-meta/<name>-<version>-<build>.json of the torch packages in this environment: only those files are read
    (a conda environment holds hundreds), and a record only counts for the name it gives itself (pytorch-cuda-*.json
    is not pytorch's)."""
    import glob

    found = []
    for name in CONDA_TORCH_PACKAGES:
        for path in glob.glob(os.path.join(sys.prefix, "conda-meta", name + "-*.json")):
            try:
                with open(path, encoding="utf-8") as handle:
                    record = json.load(handle)
            except (OSError, ValueError):
                continue
            if record.get("name") == name:
                found.append({"name": name, "version": record.get("version"), "build": record.get("build"),
                              "channel": channel_name(record.get("channel")),
                              "files": set(record.get("files") or [])})
    return found


def conda_owner(dist, records):
    """The conda package whose files include this distribution's METADATA (it installed it), or None."""
    folder = getattr(dist, "_path", None)  # PathDistribution's .dist-info folder
    if folder is None or not records:
        return None
    relative = os.path.relpath(os.path.join(str(folder), "METADATA"), sys.prefix).replace(os.sep, "/")
    for record in records:
        if relative in record["files"]:
            return {key: record[key] for key in ("name", "version", "build", "channel")}
    return None


CUDA_SUFFIX = re.compile(r"-cu(\d+)$")


def nvidia_wheel_facts():
    """Every installed nvidia-* distribution: its CUDA major (from -cuNN; None for unsuffixed CUDA 13 names), the
    shared libraries its RECORD lists (wheels of both majors install the same paths, nvidia/nccl/lib/libnccl.so.2),
    and, where two CUDA majors are installed, the packages that ask for each."""
    from importlib import metadata

    wheels = {}
    for dist in metadata.distributions():
        name = _project(dist.metadata["Name"] or "")
        if not name.startswith("nvidia-") or name in wheels:
            continue
        suffix = CUDA_SUFFIX.search(name)
        wheels[name] = {"name": name, "version": dist.version, "cuda_major": int(suffix.group(1)) if suffix else None,
                        "location": str(dist.locate_file("")), "required_by": [],
                        "libraries": sorted(str(f).replace(os.sep, "/") for f in dist.files or []
                                            if ".so" in f.name or f.name.endswith(".dll"))}
    if len({w["cuda_major"] for w in wheels.values() if w["cuda_major"]}) > 1:
        for dist in metadata.distributions():
            owner = dist.metadata["Name"] or ""
            for requirement in dist.requires or []:
                match = NVIDIA_PIN.match(requirement.strip())
                wheel = wheels.get(_project(match.group(1))) if match else None
                if wheel is not None and marker_holds(match.group(3)):
                    wheel["required_by"].append(
                        {"name": owner, "version": dist.version, "spec": (match.group(2) or "").replace(" ", "")})
    return list(wheels.values())


NVIDIA_PIN = re.compile(r"^(nvidia-[A-Za-z0-9_.-]+)\s*\(?\s*(==\s*[^\s;,)]+)?\s*\)?\s*(?:;\s*(.*))?$")
MARKER_CLAUSE = re.compile(r"^\(?\s*(platform_system|platform_machine|sys_platform)\s*(==|!=)\s*"
                           r"""["']([^"']*)["']\s*\)?$""")


def marker_holds(marker):
    """torch's markers on its nvidia-* pins (platform_system == "Linux" and platform_machine == "x86_64"); a
    marker this reader does not know is taken as holding, so no pin is dropped on a guess."""
    if not marker:
        return True
    here = {"platform_system": platform.system(), "platform_machine": platform.machine(),
            "sys_platform": sys.platform}
    for clause in marker.split(" and "):
        match = MARKER_CLAUSE.match(clause.strip())
        if match is None:
            continue
        name, operator, value = match.groups()
        if (here[name] == value) != (operator == "=="):
            return False
    return True


def _project(name):
    """A distribution name as pip compares them (nvidia_cudnn_cu12 is nvidia-cudnn-cu12)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def nvidia_pins(torch_requires):
    """torch's exact pins on the nvidia-* wheels it loads its CUDA libraries from, each with the version installed
    and, when that differs, which other installed packages ask for the same wheel and how."""
    from importlib import metadata

    pins = []
    for requirement in torch_requires:
        match = NVIDIA_PIN.match(requirement.strip())
        if match is None or not match.group(2) or not marker_holds(match.group(3)):
            continue
        name, spec = match.group(1), match.group(2).replace(" ", "")
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = None
        pins.append({"name": name, "required": spec[2:], "installed": installed, "required_by": []})
    unmet = {_project(pin["name"]): pin for pin in pins if pin["installed"] != pin["required"]}
    if unmet:
        for dist in metadata.distributions():
            owner = dist.metadata["Name"] or ""
            if owner.lower() == "torch":
                continue
            for requirement in dist.requires or []:
                match = NVIDIA_PIN.match(requirement.strip())
                pin = unmet.get(_project(match.group(1))) if match else None
                if pin is not None and marker_holds(match.group(3)):
                    pin["required_by"].append(
                        {"name": owner, "version": dist.version, "spec": (match.group(2) or "").replace(" ", "")})
    return pins


def install_facts():
    import glob

    out = {"distributions": distribution_facts("torch"), "spec_origin": None, "build": None, "companions": {}}
    from importlib import metadata

    try:
        out["nvidia_pins"] = nvidia_pins(metadata.requires("torch") or [])
    except metadata.PackageNotFoundError:
        out["nvidia_pins"] = []
    out["nvidia_wheels"] = nvidia_wheel_facts()
    records = conda_records()
    out["conda_torch"] = next((conda_owner(dist, records) for dist in metadata.distributions(name="torch")), None)
    for companion in COMPANIONS:
        facts = companion_facts(companion, records)
        out["companions"][companion] = facts
        out[companion] = facts["version"] if facts else None
    spec, folder = package_dir("torch")
    if spec is not None:
        out["spec_origin"] = spec.origin
        if folder:
            out["package_dir"] = folder
            out["build"] = read_version_file(folder)
    conda = []
    for path in glob.glob(os.path.join(sys.prefix, "conda-meta", "pytorch-*.json")):
        try:
            with open(path, encoding="utf-8") as handle:
                conda.append(json.load(handle).get("build"))
        except (OSError, ValueError):
            continue
    out["conda_builds"] = conda
    return out


def nvml_facts():
    try:
        import pynvml
    except ImportError as exc:
        return {"status": "not_installed", "error": _error_text(exc)}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return {"status": "init_failed", "error_code": getattr(exc, "value", None), "error": str(exc)}
    out = {"status": "ok", "devices": []}
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
        out["driver_version"] = version.decode() if isinstance(version, bytes) else version
        out["cuda_driver_version"] = pynvml.nvmlSystemGetCudaDriverVersion()
        for index in range(pynvml.nvmlDeviceGetCount()):
            out["devices"].append(nvml_device(pynvml, index))
    except pynvml.NVMLError as exc:
        out["status"] = "error"
        out["error_code"] = getattr(exc, "value", None)
        out["error"] = str(exc)
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
    return out


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


def ecc_uncorrected(pynvml, handle):
    """None on a GPU without ECC (or with ECC off), which answers NotSupported: most consumer GPUs do."""
    uncorrected = getattr(pynvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
    counters = {"volatile": getattr(pynvml, "NVML_VOLATILE_ECC", 0),
                "aggregate": getattr(pynvml, "NVML_AGGREGATE_ECC", 1)}
    try:
        return {name: int(pynvml.nvmlDeviceGetTotalEccErrors(handle, uncorrected, counter))
                for name, counter in counters.items()}
    except pynvml.NVMLError_NotSupported:
        return None


def nvml_device(pynvml, index):
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    device = {"index": index, "errors": {}}

    # NVMLLibraryMismatchError is not an NVMLError: one call this driver lacks must not lose the whole section.
    failures = (pynvml.NVMLError, getattr(pynvml, "NVMLLibraryMismatchError", pynvml.NVMLError))

    def read(key, getter):
        # A field this GPU does not support stays None (never a made-up 0) and the reason is kept.
        try:
            device[key] = getter()
        except failures as exc:
            device[key] = None
            device["errors"][key] = str(exc)

    read("name", lambda: _text(pynvml.nvmlDeviceGetName(handle)))
    read("uuid", lambda: _text(pynvml.nvmlDeviceGetUUID(handle)))
    read("compute_capability", lambda: list(pynvml.nvmlDeviceGetCudaComputeCapability(handle)))
    read("memory_total", lambda: int(pynvml.nvmlDeviceGetMemoryInfo(handle).total))
    read("memory_used", lambda: int(pynvml.nvmlDeviceGetMemoryInfo(handle).used))
    read("memory_free", lambda: int(pynvml.nvmlDeviceGetMemoryInfo(handle).free))
    read("compute_mode", lambda: int(pynvml.nvmlDeviceGetComputeMode(handle)))
    # Uncorrectable ECC errors since the driver loaded (volatile) and over the GPU's life (aggregate), as
    # `nvidia-smi -q -d ECC` counts them; a GPU without ECC answers NotSupported and the field stays None.
    read("ecc_uncorrected", lambda: ecc_uncorrected(pynvml, handle))
    # Named as the live metrics name them (jupyter_gpu.metrics.sample): mig_enabled, mig_instances, memory_used.
    # The current mode, not the pending one; NVML_DEVICE_MIG_ENABLE is 1.
    read("mig_enabled", lambda: mig_enabled(pynvml, handle))
    read("processes", lambda: [
        {"pid": int(p.pid), "memory_used": None if p.usedGpuMemory is None else int(p.usedGpuMemory)}
        for p in gpu_processes(pynvml, handle, device.get("mig_enabled"))
    ])
    if device.get("mig_enabled"):
        read("mig_instances", lambda: mig_instances(pynvml, handle))
    return device


def mig_enabled(pynvml, handle):
    """Whether MIG is on now; False on a GPU without MIG, which answers NotSupported (most GPUs do)."""
    try:
        return int(pynvml.nvmlDeviceGetMigMode(handle)[0]) == 1
    except pynvml.NVMLError_NotSupported:
        return False


def gpu_processes(pynvml, handle, mig):
    """The GPU's compute processes. With MIG on, the parent's list covers every slice and needs root; without
    root, each slice's own list is read instead."""
    try:
        return compute_processes(pynvml, handle)
    except pynvml.NVMLError_NoPermission:
        if not mig:
            raise
    found = []
    for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            slice_handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except pynvml.NVMLError_NotFound:
            continue
        found.extend(compute_processes(pynvml, slice_handle))
    return found


def compute_processes(pynvml, handle):
    """The compute processes on a GPU, on any driver.

    pynvml's unversioned call is the _v3 one, which drivers before R510 lack; pynvml then raises
    NVMLLibraryMismatchError, which is not an NVMLError, so without this fallback the whole NVML section
    would be lost on exactly the old-driver machines. Those drivers have _v2.
    """
    missing = tuple(getattr(pynvml, name) for name in ("NVMLError_FunctionNotFound", "NVMLLibraryMismatchError")
                    if isinstance(getattr(pynvml, name, None), type))
    try:
        return pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except missing:
        return pynvml.nvmlDeviceGetComputeRunningProcesses_v2(handle)


def mig_instances(pynvml, handle):
    found = []
    for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except pynvml.NVMLError:
            continue  # an empty slot: no instance was created there
        found.append({"uuid": _text(pynvml.nvmlDeviceGetUUID(mig)),
                      "memory_total": int(pynvml.nvmlDeviceGetMemoryInfo(mig).total)})
    return found


def torch_facts():
    out = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            import torch
        except BaseException as exc:  # ImportError, OSError, even SystemExit from a broken install
            out["import_error"] = _error_text(exc)
            out["traceback"] = traceback.format_exc()[-4000:]
            out["warnings"] = [str(w.message) for w in caught]
            out["driver_api"] = driver_api_facts()
            return out
        # After the import (which loads no libcuda of its own accord, or the one torch links) and before torch's
        # first CUDA call: cuInit's code is then the driver's own answer, not torch's reading of it.
        out["driver_api"] = driver_api = driver_api_facts()
        if driver_api and driver_api.get("init_timed_out"):
            # torch's cuInit would wait on the same stuck driver call: the driver's silence is the answer.
            out["warnings"] = [str(w.message) for w in caught]
            return out
        try:
            cuda_facts(torch, out)
        except Exception as exc:  # torch imported, but a later query failed: keep what was learnt
            out["cuda_error"] = _error_text(exc)
        # Imported here, beside the same torch, so their errors ("operator torchvision::nms does not exist")
        # are quoted verbatim; only those installed, since each import costs time.
        out["companions"] = {name: companion_import(name) for name in COMPANIONS if package_dir(name)[0]}
    out["warnings"] = [str(w.message) for w in caught]
    out["loaded_libraries"] = loaded_gpu_libraries()
    return out


# The name the CUDA runtime (and so torch) asks the loader for; Windows' driver is nvcuda.dll.
LIBCUDA = "nvcuda.dll" if os.name == "nt" else "libcuda.so.1"
# cuInit waits on the kernel module; a GPU in a bad state can hold it for minutes. Below the probe's own timeout.
DRIVER_INIT_TIMEOUT_S = 20.0


def driver_api_facts():
    """The CUDA driver API, asked directly: which libcuda the loader gives this process, its version, and cuInit's
    CUresult code with the driver's own name for it. Every call returns a code (a stub libcuda answers 34 to all);
    none raises, so each answer is kept as it came."""
    import ctypes

    if sys.platform == "darwin":
        return None  # macOS has no CUDA driver
    out = {"library": LIBCUDA}
    try:
        lib = ctypes.CDLL(LIBCUDA)
    except OSError as exc:  # not found, wrong architecture, unreadable
        out.update(loaded=False, error=str(exc))
        return out
    out.update(loaded=True, path=loaded_path("libcuda.so"))
    try:
        version = ctypes.c_int(0)
        out["version_result"] = int(lib.cuDriverGetVersion(ctypes.byref(version)))
        out["driver_version"] = version.value if out["version_result"] == 0 else None
        init = lib.cuInit  # looked up here, so a missing entry point is not read as a stuck call
        code = bounded_call(lambda: int(init(0)), DRIVER_INIT_TIMEOUT_S)
    except AttributeError as exc:  # a library by that name without the driver API's entry points
        out["error"] = _error_text(exc)
        return out
    if code is None:
        out.update(init_result=None, init_timed_out=True, init_timeout_s=DRIVER_INIT_TIMEOUT_S)
        return out
    out["init_result"] = code
    out["init_name"] = driver_error_name(lib, code)
    if code == 0:
        count = ctypes.c_int(0)
        out["device_count"] = count.value if int(lib.cuDeviceGetCount(ctypes.byref(count))) == 0 else None
    return out


def driver_error_name(lib, code):
    """cuGetErrorName's answer ("CUDA_ERROR_NO_DEVICE"); None where the library knows no name for it."""
    import ctypes

    name = ctypes.c_char_p()
    try:
        if int(lib.cuGetErrorName(int(code), ctypes.byref(name))) != 0 or not name.value:
            return None
    except AttributeError:
        return None
    return name.value.decode(errors="replace")


def bounded_call(call, timeout_s):
    """call() in a daemon thread; None if it has not returned in timeout_s (the thread is left to the exit)."""
    import threading

    box = []
    worker = threading.Thread(target=lambda: box.append(call()), daemon=True)
    worker.start()
    worker.join(timeout_s)
    return box[0] if box else None


def loaded_path(prefix):
    """The file the loader mapped for a library (the real file, after symlinks), from /proc/self/maps."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as handle:
            paths = [line.split(None, 5)[-1].strip() for line in handle if "/" in line]
    except OSError:
        return None
    return next((p for p in paths if os.path.basename(p).startswith(prefix)), None)


def companion_import(name):
    import importlib

    try:
        module = importlib.import_module(name)
    except BaseException as exc:  # RuntimeError, OSError (undefined symbol), ImportError alike
        return {"ok": False, "error": _error_text(exc)}
    return {"ok": True, "version": getattr(module, "__version__", None)}


def nccl_version(torch):
    """"2.27.3" for a CUDA build with NCCL; None without (CPU, macOS, Windows builds)."""
    try:
        parts = torch.cuda.nccl.version()
    except Exception:  # AttributeError/RuntimeError: this build has no NCCL
        return None
    if not isinstance(parts, tuple):
        return str(parts)
    # (2, 27, 3), or (2, 27, 3, "+cuda12.9") when NCCL was built with a suffix, which follows the number.
    return ".".join(str(part) for part in parts[:3]) + "".join(str(part) for part in parts[3:])


def cuda_facts(torch, out):
    out["version"] = torch.__version__
    out["file"] = torch.__file__
    out["cuda"] = torch.version.cuda
    out["hip"] = getattr(torch.version, "hip", None)
    compiled = hasattr(torch._C, "_cuda_getDeviceCount")
    out["compiled_with_cuda"] = compiled
    # None on some source builds (no TORCH_CUDA_ARCH_LIST recorded): unknown, not "no architectures".
    flags = torch._C._cuda_getArchFlags() if compiled else ""
    out["arch_flags"] = flags.split() if flags is not None else None
    # The only cuInit in the whole tool, and it happens here, in the child.
    out["device_count"] = torch._C._cuda_getDeviceCount() if compiled else 0
    out["devices"] = []
    for index in range(out["device_count"]):
        props = torch.cuda.get_device_properties(index)
        out["devices"].append({"index": index, "name": props.name, "capability": [props.major, props.minor],
                               "memory_total": int(props.total_memory),
                               "uuid": str(getattr(props, "uuid", "") or "") or None})
    if out["device_count"]:
        try:
            (torch.ones(1, device="cuda") * 2).sum().item()
            torch.cuda.synchronize()
        except Exception as exc:  # "no kernel image", "busy or unavailable", ...
            out["init_error"] = _error_text(exc)
    try:
        out["cudnn_version"] = torch.backends.cudnn.version() if compiled else None
    except Exception as exc:
        out["cudnn_error"] = _error_text(exc)
    out["nccl_version"] = nccl_version(torch) if compiled else None
    try:
        out["mps"] = {"built": bool(torch.backends.mps.is_built()),
                      "available": bool(torch.backends.mps.is_available())}
    except (AttributeError, RuntimeError):
        out["mps"] = None
    try:
        out["xpu_available"] = bool(torch.xpu.is_available())
    except (AttributeError, RuntimeError):
        out["xpu_available"] = None


def distributed_facts():
    """What torch.distributed offers in this build (for `--distributed`): backends, NCCL, the visible GPUs."""
    import torch

    out = {"torch_version": torch.__version__, "cuda_build": getattr(torch.version, "cuda", None)}
    distributed = getattr(torch, "distributed", None)
    out["distributed_available"] = bool(distributed is not None and distributed.is_available())
    for backend in ("nccl", "gloo", "mpi"):
        check = getattr(distributed, f"is_{backend}_available", None) if out["distributed_available"] else None
        out[f"{backend}_available"] = bool(check()) if check is not None else False
    out["nccl_version"] = nccl_version(torch) if out["nccl_available"] else None
    try:
        # Counts what CUDA_VISIBLE_DEVICES leaves visible; this child may create a context, the kernel never does.
        out["device_count"] = int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception as exc:
        out["device_count"] = 0
        out["cuda_error"] = _error_text(exc)
    out["device_names"] = [torch.cuda.get_device_name(i) for i in range(out["device_count"])]
    return out


GPU_LIBRARIES = ("libcuda.so", "libcudart", "libcudnn", "libnvJitLink", "libnvidia-ml", "libamdhip64")


def loaded_gpu_libraries():
    try:
        with open("/proc/self/maps", encoding="utf-8") as handle:
            paths = {line.split()[-1] for line in handle if "/" in line}
    except OSError:
        return []
    return sorted(p for p in paths if any(name in os.path.basename(p) for name in GPU_LIBRARIES))


def main(argv):
    sections = set(argv[1].split(",")) if len(argv) > 1 else {"python", "install", "nvml"}
    out = {}
    runners = [("python", python_facts), ("install", install_facts), ("nvml", nvml_facts),
               ("torch", torch_facts), ("distributed", distributed_facts)]
    for name, runner in runners:
        if name not in sections:
            continue
        try:
            out[name] = runner()
        except Exception as exc:
            out[name] = {"probe_error": _error_text(exc), "traceback": traceback.format_exc()[-4000:]}
    out["duration_s"] = round(time.monotonic() - STARTED, 4)
    sys.stdout.write("\n" + MARKER + json.dumps(out, default=str) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv)
