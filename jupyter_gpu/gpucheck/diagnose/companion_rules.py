"""Companion packages built for another torch: torchvision or torchaudio beside a torch they do not pair with.

The most common error after installing torch from one index and torchvision from another (a CPU torch from
`/whl/cpu`, then `pip install torchvision` from PyPI, which on Linux is a CUDA build). Versions and builds are
read from disk (dist-info and version.py, never imported); when the torch probe ran, the child also imported the
companions beside torch, so their error is quoted verbatim.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from jupyter_gpu.gpucheck.diagnose.fixes import RESTART
from jupyter_gpu.gpucheck.diagnose.view import FactsView
from jupyter_gpu.gpucheck.diagnose.wheels import (
    COMPANIONS,
    INDEX_BASE,
    RELEASES,
    base_version,
    companion_torch_minor,
    local_variant,
    paired_companion,
    parse_cuda_version,
    release_minor,
)
from jupyter_gpu.models import LAYER_COMPAT, Finding

NMS_ERROR = "RuntimeError: operator torchvision::nms does not exist"
CUDA_MAJOR_ERROR = (
    "RuntimeError: Detected that PyTorch and torchvision were compiled with different CUDA major versions. "
    "PyTorch has CUDA Version={torch} and torchvision has CUDA Version={companion}. "
    "Please reinstall the torchvision that matches your PyTorch install."
)
# Its C++ library links against torch's: a torchaudio built for another torch fails to load (pytorch/audio#3335).
TORCHAUDIO_ERROR = "OSError: .../torchaudio/lib/libtorchaudio.so: undefined symbol: ..."


@dataclass(frozen=True)
class Build:
    """Which wheel index a package was built for: "cpu", "cu126", "rocm6.4"."""

    label: str
    assumed: bool = False  # inferred (an unlabelled PyPI wheel), not read from a version label

    @property
    def kind(self) -> str:
        return "cuda" if self.label.startswith("cu") else "rocm" if self.label.startswith("rocm") else "cpu"

    @property
    def cuda(self) -> str | None:
        """"cu118" -> "11.8"."""
        if self.kind != "cuda":
            return None
        digits = self.label.removeprefix("cu")
        return f"{digits[:-1]}.{digits[-1]}" if digits.isdigit() and len(digits) >= 2 else None

    def describe(self) -> str:
        what = {"cpu": "CPU-only", "cuda": f"CUDA {self.cuda}", "rocm": f"ROCm ({self.label})"}[self.kind]
        return f"{what} build ({self.label}{', PyPI' if self.assumed else ''})"

    def differs_from(self, other: Build) -> bool:
        if self.kind != other.kind:
            return True
        # torchvision itself refuses only a different CUDA *major*; a minor difference loads and runs.
        if self.kind == "cuda" and self.cuda and other.cuda:
            return parse_cuda_version(self.cuda)[0] != parse_cuda_version(other.cuda)[0]
        return False


def torch_build(view: FactsView) -> Build | None:
    label = local_variant(view.torch_version or "")
    if label:
        return Build(label)
    if view.torch_cuda:
        major, minor = parse_cuda_version(view.torch_cuda)
        return Build(f"cu{major}{minor}")
    if view.torch_hip:
        return Build("rocm" + ".".join(view.torch_hip.split(".")[:2]))
    return Build("cpu") if view.build_known else None


# What a conda build string says a package was built for: conda-forge's cpu_mkl_py311h..., cuda126_py311h...,
# the pytorch channel's py3.11_cuda12.1_cudnn8.9.2_0, py311_cu121 and py311_cpu, Anaconda's gpu_cuda118py311h...
CONDA_CUDA_DOTTED = re.compile(r"cuda(\d+)\.(\d)")
CONDA_CUDA = re.compile(r"(?:cuda_?|(?<![a-z])cu)(\d{3,})")


def conda_build(build: str | None) -> Build | None:
    """The wheel-index label a conda build string amounts to ("cu126", "cpu"); None when it says neither."""
    text = (build or "").lower()
    dotted = CONDA_CUDA_DOTTED.search(text)
    if dotted:
        return Build(f"cu{dotted.group(1)}{dotted.group(2)}")
    digits = CONDA_CUDA.search(text)
    if digits:
        return Build(f"cu{digits.group(1)}")
    return Build("cpu") if "cpu" in text else None


def installed_by(facts: dict[str, Any] | None) -> str:
    """"conda (conda-forge)" for a package conda installed (its conda-meta record owns the .dist-info), else "pip"."""
    conda = (facts or {}).get("conda")
    return f"conda ({conda.get('channel') or 'unknown channel'})" if conda else "pip"


def companion_build(view: FactsView, name: str, version: str,
                    conda: dict[str, Any] | None = None) -> Build | None:
    label = local_variant(version)
    if label:
        return Build(label)
    if conda:  # conda's own package: its build string says what it was built for, not PyPI's default
        return conda_build(conda.get("build"))
    # An unlabelled wheel came from PyPI: built there for the release's default CUDA on Linux x86_64, for the
    # CPU on macOS and Windows; elsewhere (aarch64 Linux) the build cannot be told from the version.
    system, machine = view.platform.get("system"), view.platform.get("machine")
    if system in ("Darwin", "Windows"):
        return Build("cpu", assumed=True)
    release = RELEASES.get(companion_torch_minor(name, version) or (0, 0))
    if system == "Linux" and machine == "x86_64" and release is not None:
        return Build(release.pypi_default, assumed=True)
    return None


def _companions(view: FactsView) -> dict[str, dict[str, Any]]:
    found = dict(view.install.get("companions") or {})
    for name in COMPANIONS:  # snapshots from before companions were read in full kept only the version
        if found.get(name) is None and view.install.get(name):
            found[name] = {"version": view.install[name]}
    return {name: facts for name, facts in found.items() if facts and facts.get("version")}


def _imported(view: FactsView, name: str) -> dict[str, Any] | None:
    """How importing the companion beside torch went in the probe child, when it ran."""
    return ((view.torch or {}).get("companions") or {}).get(name) if view.probe_ran else None


def _expected_error(name: str, torch: Build, build: Build | None) -> str:
    if name == "torchaudio":
        return TORCHAUDIO_ERROR
    if build is not None and torch.kind == build.kind == "cuda" and torch.differs_from(build):
        return CUDA_MAJOR_ERROR.format(torch=torch.cuda, companion=build.cuda)
    return NMS_ERROR


def companion_mismatch(view: FactsView) -> list[Finding]:
    torch_version = view.torch_version
    torch = torch_build(view)
    if not view.torch_installed or not torch_version or torch is None:
        return []
    torch_base = base_version(torch_version)
    wrong: list[tuple[str, str, list[str], dict[str, Any]]] = []
    for name, facts in _companions(view).items():
        version = facts["version"]
        paired = paired_companion(name, torch_version)
        reasons = []
        pin = base_version(facts.get("requires_torch") or "")
        if pin and torch_base and pin != torch_base:
            reasons.append(f"it was built for torch {pin}")
        elif not pin and companion_torch_minor(name, version) not in (None, release_minor(torch_version)):
            reasons.append(f"it belongs to another torch release (torch {torch_base} pairs with {name} {paired})")
        build = companion_build(view, name, version, facts.get("conda"))
        if build is not None and build.differs_from(torch):
            reasons.append(f"it is a {build.describe()}, torch is a {torch.describe()}")
        torch_conda = view.install.get("conda_torch")
        # Known only in snapshots that read conda's records ("conda_torch" present, None for pip's torch).
        if "conda_torch" in view.install and bool(torch_conda) != bool(facts.get("conda")):
            reasons.append(f"{installed_by(facts)} installed it, torch came from "
                           f"{installed_by({'conda': torch_conda})}")
        imported = _imported(view, name)
        if imported is not None and not imported.get("ok"):
            reasons = reasons or [f"`import {name}` fails beside this torch"]
        if not reasons:
            continue
        evidence: dict[str, Any] = {"on disk": f"{version} in {facts.get('location') or '?'}",
                                    "built for torch": facts.get("requires_torch"),
                                    f"paired with torch {torch_version}": paired}
        if imported is not None and not imported.get("ok"):
            evidence["error"] = imported.get("error")
        elif imported is not None:
            evidence["import"] = f"imported in the probe ({imported.get('version')})"
        else:
            evidence["expected error"] = _expected_error(name, torch, build)
        wrong.append((name, version, reasons, {k: v for k, v in evidence.items() if v is not None}))
    if not wrong:
        return []
    return [_finding(view, torch, torch_version, wrong)]


def _finding(view: FactsView, torch: Build, torch_version: str,
             wrong: list[tuple[str, str, list[str], dict[str, Any]]]) -> Finding:
    names = [name for name, *_ in wrong]
    failed = [name for name, _, _, evidence in wrong if "error" in evidence]
    imported_fine = all("import" in evidence for *_, evidence in wrong)
    parts = [f"{name} {version} does not pair with torch {torch_version}: {'; '.join(reasons)}"
             for name, version, reasons, _ in wrong]
    says = "fails" if failed else "will fail"
    # The error itself is quoted verbatim in the evidence (or, without the probe, the one the import gives).
    headline = ". ".join(parts) + "." + ("" if imported_fine else f" `import {names[0]}` {says} (error below).")
    torch_conda = view.install.get("conda_torch")
    if torch_conda:
        fix = _conda_fix(view, torch, torch_version, names, torch_conda)
    else:
        pins = " ".join(f"{name}=={paired_companion(name, torch_version)}" for name in names
                        if paired_companion(name, torch_version))
        conda_installed = [name for name in names if _conda_record(view, name)]
        fix = [f"%conda remove --force -y {' '.join(conda_installed)}   # conda's copy, beside pip's torch"
               ] if conda_installed else []
        fix += [f"%pip install --force-reinstall --no-deps {pins} --index-url {INDEX_BASE}{torch.label}"
                "   # --no-deps keeps the torch you have", RESTART] if pins else [RESTART]
        if view.install.get("conda_builds") and "conda_torch" not in view.install:
            # A snapshot from before conda's records were read: how torch was installed is not known.
            fix.append("conda users: install torch and its companions from one channel, e.g. "
                       f"conda install -c conda-forge {' '.join(names)}")
    evidence = {f"{name} {key}": value for name, _, _, e in wrong for key, value in e.items()}
    return Finding("TORCHVISION_MISMATCH", "warn" if imported_fine else "fail", headline, evidence=evidence,
                   fix=fix, refs=["pytorch#122494", "pytorch#157648"],
                   # Compatibility, not the GPU question: a driver or visibility failure explains the verdict first.
                   layer=LAYER_COMPAT)


def _conda_record(view: FactsView, name: str) -> dict[str, Any] | None:
    return ((view.install.get("companions") or {}).get(name) or {}).get("conda")


def _conda_fix(view: FactsView, torch: Build, torch_version: str, names: list[str],
               torch_conda: dict[str, Any]) -> list[str]:
    """torch came from conda: its companions come from the same channel, by conda (a pip index would mix the two)."""
    channel = torch_conda.get("channel") or "conda-forge"
    from_pip = [name for name in names if not _conda_record(view, name)]
    specs = [f"{name}={paired_companion(name, torch_version)}" if paired_companion(name, torch_version) else name
             for name in names]
    if channel == "pytorch" and torch.kind == "cpu":
        specs.append("cpuonly")  # the pytorch channel's CPU builds are chosen through this package
    fix = [f"%pip uninstall -y {' '.join(from_pip)}   # pip's copy, beside conda's torch"] if from_pip else []
    return [*fix, f"%conda install -c {channel} {' '.join(specs)} -y", RESTART]


RULES = (companion_mismatch,)
