"""Which Python the kernel is, which Pythons the user *thinks* they use, and where torch lives in each.

The classic notebook failure is that `pip install` went into one environment and the kernel runs
another, so everything here compares interpreters and looks for torch in their environments without
importing anything (dist-info folders only).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from jupyter_gpu.gpucheck.facts.context import ProbeContext
from jupyter_gpu.gpucheck.paths import prefix_of_interpreter

CUDA_REQUIREMENT = re.compile(r"^Requires-Dist:\s*nvidia-[a-z0-9-]+-cu(\d+)\b", re.I | re.M)
TORCH_DIST_INFO = re.compile(r"^torch-([^-]+)\.dist-info$")


def torch_in_prefix(ctx: ProbeContext, prefix: str) -> dict[str, Any] | None:
    """The torch installed in an environment, read from its dist-info METADATA, or None."""
    for lib in ("lib", "lib64"):
        for python_dir in ctx.listdir(f"{prefix}/{lib}"):
            if not python_dir.startswith("python3"):
                continue
            site = f"{prefix}/{lib}/{python_dir}/site-packages"
            for entry in ctx.listdir(site):
                match = TORCH_DIST_INFO.match(entry)
                if match:
                    metadata = ctx.read_text(f"{site}/{entry}/METADATA") or ""
                    flavours = sorted({"cu" + m for m in CUDA_REQUIREMENT.findall(metadata)})
                    version = match.group(1)
                    return {"version": version, "site_packages": site, "cuda_requirements": flavours,
                            "cuda_build": bool(flavours) or "+cu" in version or "+rocm" in version}
    return None


def which(ctx: ProbeContext, program: str) -> str | None:
    for directory in ctx.env.get("PATH", "").split(os.pathsep):
        if not directory:
            continue
        candidate = f"{directory.rstrip('/')}/{program}"
        mapped = ctx.path(candidate)
        if os.path.isfile(mapped) and os.access(mapped, os.X_OK):
            return candidate
    return None


def kernelspec_dirs(ctx: ProbeContext, kernel_prefix: str) -> list[str]:
    env = ctx.env
    dirs = [p for p in env.get("JUPYTER_PATH", "").split(os.pathsep) if p]
    data_home = env.get("JUPYTER_DATA_DIR") or (
        f"{env['HOME']}/.local/share/jupyter" if env.get("HOME") else None
    )
    if data_home:
        dirs.append(data_home)
    dirs += [f"{kernel_prefix}/share/jupyter", "/usr/local/share/jupyter", "/usr/share/jupyter"]
    unique: list[str] = []
    for directory in dirs:
        if directory not in unique:
            unique.append(directory)
    return [f"{d}/kernels" for d in unique]


def kernelspec_facts(ctx: ProbeContext, kernel_prefix: str) -> list[dict[str, Any]]:
    specs = []
    seen: set[str] = set()
    for directory in kernelspec_dirs(ctx, kernel_prefix):
        for name in ctx.listdir(directory):
            if name in seen:
                continue  # earlier directories win, as in jupyter_client
            text = ctx.read_text(f"{directory}/{name}/kernel.json")
            if text is None:
                continue
            seen.add(name)
            try:
                spec = json.loads(text)
            except ValueError as exc:
                specs.append({"name": name, "path": directory, "error": f"invalid kernel.json: {exc}"})
                continue
            argv0 = (spec.get("argv") or [None])[0]
            entry: dict[str, Any] = {"name": name, "path": f"{directory}/{name}",
                                     "display_name": spec.get("display_name"), "python": argv0}
            if argv0 and argv0.startswith("/"):
                entry["python_exists"] = ctx.exists(argv0)
                entry["torch"] = torch_in_prefix(ctx, prefix_of_interpreter(argv0))
            specs.append(entry)
    return specs


def gather_kernel(ctx: ProbeContext, python: dict[str, Any]) -> dict[str, Any]:
    """Kernel identity: the probe's view of the interpreter plus the environment around it."""
    env = ctx.env
    which_python = which(ctx, "python") or which(ctx, "python3")
    which_pip = which(ctx, "pip") or which(ctx, "pip3")
    prefix = python.get("prefix") or prefix_of_interpreter(ctx.python)
    others: dict[str, Any] = {}
    for label, other_prefix in (("virtual_env", env.get("VIRTUAL_ENV")), ("conda_prefix", env.get("CONDA_PREFIX")),
                                ("which_python", prefix_of_interpreter(which_python) if which_python else None)):
        if other_prefix:
            others[label] = {"prefix": other_prefix, "torch": torch_in_prefix(ctx, other_prefix)}
    return {
        "python": ctx.python,
        "in_ipykernel": "ipykernel" in ctx.modules,
        "which_python": which_python,
        "which_python_resolved": ctx.resolve(which_python) if which_python else None,
        "which_pip": which_pip,
        "virtual_env": env.get("VIRTUAL_ENV"),
        "conda_prefix": env.get("CONDA_PREFIX"),
        "conda_env": env.get("CONDA_DEFAULT_ENV"),
        "other_environments": others,
        "kernelspecs": kernelspec_facts(ctx, prefix),
    }
