"""The shared-library layer under `import torch`: which library file failed, who owns it, what torch expects.

An ImportError such as `libcudnn.so.9: cannot open shared object file` or `undefined symbol: __nvJitLinkComplete_12_4,
version libnvJitLink.so.12` names a library. Three owners can answer for it: a pip wheel (nvidia-*-cuNN, whose RECORD
lists the file), a conda package (conda-meta/*.json lists it), or a system CUDA reached through LD_LIBRARY_PATH. Two
findings live here: a wheel of the other CUDA major sharing torch's library path (STRAY_NVIDIA_WHEEL), and a folder
of LD_LIBRARY_PATH that holds the library (LD_LIBRARY_PATH_SHADOWING), each naming the file, its owner and torch's pin.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from jupyter_gpu.gpucheck.diagnose.fixes import RESTART
from jupyter_gpu.gpucheck.diagnose.view import FactsView
from jupyter_gpu.models import LAYER_BUILD, Finding

SONAME = r"lib[\w+-]+?\.so(?:\.\d+)*"
MISSING = re.compile(rf"({SONAME}): cannot open shared object file")
# "undefined symbol: S, version libY.so.N" and ld.so's "symbol S version libY.so.N not defined in file libY.so.N".
VERSIONED = re.compile(rf"symbol:? (\w+),? version ({SONAME})")
UNDEFINED = re.compile(r"undefined symbol: ([A-Za-z_]\w*)")
# The nvidia-* wheel a library or a symbol comes from, by the words of its name (libcudnn -> nvidia-cudnn-cu12);
# longer words first, so cusparselt is not read as cusparse and cublasLt goes to cublas.
WHEEL_OF_LIBRARY = (("cudnn", "cudnn"), ("nccl", "nccl"), ("cusparselt", "cusparselt"), ("cusparse", "cusparse"),
                    ("cublas", "cublas"), ("cufft", "cufft"), ("curand", "curand"), ("cusolver", "cusolver"),
                    ("nvjitlink", "nvjitlink"), ("cupti", "cupti"), ("cudart", "cuda-runtime"),
                    ("nvrtc", "nvrtc"), ("cufile", "cufile"), ("nvshmem", "nvshmem"), ("nvtx", "nvtx"))
TORCH_OWN = re.compile(r"^lib(torch|c10|shm|caffe2)")  # torch's own libraries: no wheel or toolkit provides them


@dataclass(frozen=True)
class FailingLibrary:
    """What the import error says failed: the library file (`soname`, None when only a symbol is named), the symbol,
    and the wheel part both point to ("nvjitlink"), None for torch's own libraries and unknown names."""

    soname: str | None
    symbol: str | None
    part: str | None
    missing: bool

    @property
    def label(self) -> str:
        return self.soname or (f"lib{self.part}" if self.part else "a CUDA library")


def _part(name: str) -> str | None:
    word = name.lower().removeprefix("lib").lstrip("_")  # __nvJitLinkComplete_12_4: nvJitLink's own symbols
    return next((wheel for prefix, wheel in WHEEL_OF_LIBRARY if word.startswith(prefix)), None)


def failing_library(error: str) -> FailingLibrary | None:
    missing = MISSING.search(error)
    if missing:
        return FailingLibrary(missing.group(1), None, _part(missing.group(1)), True)
    versioned = VERSIONED.search(error)
    if versioned:  # the library named after "version" is the one that lacks the symbol
        return FailingLibrary(versioned.group(2), versioned.group(1), _part(versioned.group(2)), False)
    undefined = UNDEFINED.search(error)
    if undefined:
        return FailingLibrary(None, undefined.group(1), _part(undefined.group(1)), False)
    return None


def _torch_major(view: FactsView) -> int | None:
    for pin in view.install.get("nvidia_pins") or []:
        match = re.search(r"-cu(\d+)$", pin["name"])
        if match:
            return int(match.group(1))
    cuda = view.torch_cuda
    return int(cuda.split(".")[0]) if cuda and cuda.split(".")[0].isdigit() else None


def _pin_for(view: FactsView, part: str | None) -> dict[str, Any] | None:
    return next((p for p in view.install.get("nvidia_pins") or [] if part and part in p["name"]), None)


def _wheels(view: FactsView) -> list[dict[str, Any]]:
    return view.install.get("nvidia_wheels") or []


def _asked_for_by(wheel: dict[str, Any]) -> list[str]:
    return [f"{r['name']} {r['version']} ({wheel['name']}{r['spec']})" for r in wheel.get("required_by") or []
            if r["name"].lower() != "torch"]


def stray_wheel(view: FactsView, error: str) -> Finding | None:
    """A wheel of another CUDA major than torch's provides the library `import torch` failed on."""
    failing = failing_library(error)
    torch_major = _torch_major(view)
    if failing is None or failing.part is None or torch_major is None:
        return None
    strays = [w for w in _wheels(view) if failing.part in w["name"] and w.get("cuda_major")
              and w["cuda_major"] != torch_major]
    if not strays:
        return None
    stray = strays[0]
    pin = _pin_for(view, failing.part)
    own = next((w for w in _wheels(view) if pin and w["name"] == pin["name"]), None)
    shared = sorted(set(stray.get("libraries") or []) & set((own or {}).get("libraries") or []))
    library = failing.soname or (shared[0].rsplit("/", 1)[-1] if shared else failing.label)
    torch_text = f"torch {view.torch_version}" if view.torch_version else "torch"
    headline = (f"`import torch` fails on {library}: {stray['name']} {stray['version']}, a CUDA "
                f"{stray['cuda_major']} wheel, is installed beside {torch_text} (CUDA {torch_major})"
                + (f", which needs {pin['name']}=={pin['required']}" if pin else "")
                + (f"; both install {shared[0]}, so the one installed last is the file torch loads." if shared
                   else "."))
    asked = _asked_for_by(stray)
    fix = [f"%pip uninstall -y {stray['name']}"]
    if pin and (shared or pin.get("installed") != pin["required"]):
        why = f"puts back {shared[0]}, which the two wheels shared" if shared else "the version torch pins"
        fix.append(f"%pip install --force-reinstall --no-deps {pin['name']}=={pin['required']}   # {why}")
    fix.append(RESTART)
    if asked:
        fix.append(f"{', '.join(asked)} asks for the CUDA {stray['cuda_major']} wheel: keep it in its own environment "
                   "(a venv or a kernel of its own), or the two will keep replacing each other's files.")
    return Finding(
        "STRAY_NVIDIA_WHEEL", "fail", headline,
        evidence={"import_error": error, "stray wheel": f"{stray['name']} {stray['version']}",
                  "torch needs": f"{pin['name']}=={pin['required']}" if pin else None,
                  "installed": (pin.get("installed") or "not installed") if pin else None,
                  "shared files": shared or None, "asked for by": asked or None},
        fix=fix, refs=["pytorch/pytorch#186591", "rwth-i6/returnn#1802"], layer=LAYER_BUILD)


def _library_path(view: FactsView) -> list[dict[str, Any]] | None:
    entries = view.raw.get("library_path")
    return entries if isinstance(entries, list) else None


def _holders(entries: list[dict[str, Any]], failing: FailingLibrary) -> list[tuple[dict[str, Any], str]]:
    """(folder, file) of each LD_LIBRARY_PATH folder holding the failing library: by its file name, else (a symbol
    alone) by the library its symbol's words name."""
    found = []
    for entry in entries:
        for name in entry.get("libraries") or []:
            if failing.soname:
                if name == failing.soname:
                    found.append((entry, name))
            elif failing.part and _part(name) == failing.part and ".so." in name:
                found.append((entry, name))
                break
    return found


def _owner(view: FactsView, entry: dict[str, Any], name: str) -> str:
    owner = (entry.get("owners") or {}).get(name)
    if owner:
        return f"the {owner}"
    path = f"{entry['dir'].rstrip('/')}/{name}"
    for wheel in _wheels(view):
        if any(view.paths.same(path, f"{wheel['location'].rstrip('/')}/{lib}") for lib in wheel.get("libraries") or []):
            return f"the pip wheel {wheel['name']} {wheel['version']}"
    return "no Python package (a CUDA toolkit installed on the system)"


def _expected(view: FactsView, failing: FailingLibrary) -> str:
    """What torch expects for this library: its pin, and the wheel's own copy of the file where it is installed."""
    pin = _pin_for(view, failing.part)
    wheel = next((w for w in _wheels(view) if failing.part and failing.part in w["name"]
                  and (pin is None or w["name"] == pin["name"])), None)
    own = next((f"{wheel['location'].rstrip('/')}/{lib}" for lib in (wheel or {}).get("libraries") or []
                if failing.soname and lib.endswith("/" + failing.soname)), None)
    if pin:
        return f"{pin['name']}=={pin['required']}" + (f" ({own})" if own else "")
    if wheel:
        return f"the {wheel['name']} {wheel['version']} wheel" + (f" ({own})" if own else "")
    return "the copy torch's wheels ship"


def ld_library_path_shadowing(view: FactsView, error: str) -> list[Finding] | None:
    """LD_LIBRARY_PATH holds the library the import failed on: name the file, its owner and torch's pin. None: the
    facts say LD_LIBRARY_PATH is not the cause (or name no CUDA library), so another finding must explain it."""
    ld_path = view.paths.library_search_path(view.env)
    entries = _library_path(view)
    failing = failing_library(error)
    if not ld_path or failing is None or failing.missing or (failing.soname and TORCH_OWN.match(failing.soname)):
        return None
    if entries is None:  # a snapshot from before the folders were read: the old, general finding
        return [_generic_shadowing(error, ld_path)]
    holders = _holders(entries, failing)
    if not holders:
        # Folders that hold no such library, or do not exist (NVIDIA's images name /usr/local/nvidia/lib, often
        # absent), cannot answer for it: another finding explains the error.
        return None
    entry, name = holders[0]
    path = f"{entry['dir'].rstrip('/')}/{name}"
    owner = _owner(view, entry, name)
    lacks = f" (it lacks {failing.symbol})" if failing.symbol else ""
    headline = (f"`import torch` fails because LD_LIBRARY_PATH loads {path}{lacks}, from {owner}, ahead of the "
                f"library torch expects: {_expected(view, failing)}.")
    culprits = [e["dir"] for e, _ in holders]
    keep = [d for d in ld_path if d not in culprits]
    export = f"export LD_LIBRARY_PATH={':'.join(keep)}" if keep else "unset LD_LIBRARY_PATH"
    return [Finding(
        "LD_LIBRARY_PATH_SHADOWING", "fail", headline,
        evidence={"import_error": error, "LD_LIBRARY_PATH": ld_path, "loaded": path,
                  "owner": owner.removeprefix("the "), "torch expects": _expected(view, failing)},
        fix=[f"Remove {', '.join(culprits)} from LD_LIBRARY_PATH where it is set (the kernelspec's \"env\", "
             "~/.bashrc, the container's ENV): the loader reads it only when a process starts.",
             f"In the shell that starts Jupyter: {export}", RESTART],
        refs=["infiniflow/ragflow#4466", "pytorch#111469"], layer=LAYER_BUILD)]


def _generic_shadowing(error: str, ld_path: list[str]) -> Finding:
    return Finding(
        "LD_LIBRARY_PATH_SHADOWING", "fail",
        "torch fails to import because LD_LIBRARY_PATH puts other CUDA libraries ahead of the ones "
        "torch ships with.",
        evidence={"import_error": error, "LD_LIBRARY_PATH": ld_path},
        fix=["Remove these entries from LD_LIBRARY_PATH (also in the kernelspec \"env\" and ~/.bashrc): "
             + ", ".join(ld_path), RESTART],
        refs=["infiniflow/ragflow#4466", "pytorch#111469"], layer=LAYER_BUILD)
