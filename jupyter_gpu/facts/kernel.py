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

from jupyter_gpu.facts.context import ProbeContext

CUDA_REQUIREMENT = re.compile(r"^Requires-Dist:\s*nvidia-[a-z0-9-]+-cu(\d+)\b", re.I | re.M)
TORCH_DIST_INFO = re.compile(r"^torch-([^-]+)\.dist-info$")


def site_packages_dirs(ctx: ProbeContext, prefix: str) -> list[str]:
    """An environment's site-packages: lib/python3.X/site-packages on POSIX, Lib\\site-packages on Windows."""
    paths = ctx.flavour
    if ctx.windows:
        # Windows folders ignore case, and a fake machine's may be spelt either way.
        return [paths.join(prefix, lib, "site-packages") for lib in ctx.listdir(prefix) if lib.lower() == "lib"]
    return [paths.join(prefix, lib, python_dir, "site-packages") for lib in ("lib", "lib64")
            for python_dir in ctx.listdir(paths.join(prefix, lib)) if python_dir.startswith("python3")]


def torch_in_prefix(ctx: ProbeContext, prefix: str) -> dict[str, Any] | None:
    """The torch installed in an environment, read from its dist-info METADATA, or None."""
    for site in site_packages_dirs(ctx, prefix):
        for entry in ctx.listdir(site):
            match = TORCH_DIST_INFO.match(entry)
            if match:
                metadata = ctx.read_text(ctx.flavour.join(site, entry, "METADATA")) or ""
                flavours = sorted({"cu" + m for m in CUDA_REQUIREMENT.findall(metadata)})
                version = match.group(1)
                return {"version": version, "site_packages": site, "cuda_requirements": flavours,
                        "cuda_build": bool(flavours) or "+cu" in version or "+rocm" in version}
    return None


def which(ctx: ProbeContext, program: str) -> str | None:
    """The file a shell of the checked machine runs for `program`, as its PATH (and PATHEXT) decide."""
    paths = ctx.flavour
    extensions = paths.executable_extensions(ctx.env)
    if any(program.lower().endswith(ext) for ext in extensions if ext):
        extensions = [""]  # `python.exe` is looked up as given, as Windows does
    for directory in paths.split_list(ctx.env.get("PATH")):
        if ctx.windows:
            found = _windows_program_in(ctx, directory, program, extensions)
            if found:
                return found
            continue
        candidate = paths.join(directory, program)
        mapped = ctx.path(candidate)
        if os.path.isfile(mapped) and os.access(mapped, os.X_OK):
            return candidate
    return None


def _windows_program_in(ctx: ProbeContext, directory: str, program: str, extensions: list[str]) -> str | None:
    # Windows matches names without regard to case (PATHEXT says .EXE, the file is python.exe), so the
    # folder is listed once and compared in lower case; Windows has no execute bit to check.
    entries = {name.lower(): name for name in ctx.listdir(directory)}
    for extension in extensions:
        name = entries.get((program + extension).lower())
        if name is not None:
            candidate = ctx.flavour.join(directory, name)
            if os.path.isfile(ctx.path(candidate)):
                return candidate
    return None


def kernelspec_dirs(ctx: ProbeContext, kernel_prefix: str) -> list[str]:
    """jupyter_client's search order: JUPYTER_PATH, the user's data dir, the environment's, the system's."""
    env = ctx.env
    paths = ctx.flavour
    dirs = paths.split_list(env.get("JUPYTER_PATH"))
    if ctx.windows:
        data_home = env.get("JUPYTER_DATA_DIR") or (paths.join(env["APPDATA"], "jupyter") if env.get("APPDATA")
                                                    else None)
        system_dirs = [paths.join(env.get("PROGRAMDATA") or "C:\\ProgramData", "jupyter")]
    else:
        data_home = env.get("JUPYTER_DATA_DIR") or (paths.join(env["HOME"], ".local", "share", "jupyter")
                                                    if env.get("HOME") else None)
        system_dirs = ["/usr/local/share/jupyter", "/usr/share/jupyter"]
    if data_home:
        dirs.append(data_home)
    dirs += [paths.join(kernel_prefix, "share", "jupyter"), *system_dirs]
    unique: list[str] = []
    for directory in dirs:
        if not any(paths.same(directory, seen) for seen in unique):
            unique.append(directory)
    return [paths.join(d, "kernels") for d in unique]


def kernelspec_facts(ctx: ProbeContext, kernel_prefix: str) -> list[dict[str, Any]]:
    specs = []
    seen: set[str] = set()
    for directory in kernelspec_dirs(ctx, kernel_prefix):
        for name in ctx.listdir(directory):
            if name in seen:
                continue  # earlier directories win, as in jupyter_client
            text = ctx.read_text(ctx.flavour.join(directory, name, "kernel.json"))
            if text is None:
                continue
            seen.add(name)
            try:
                spec = json.loads(text)
            except ValueError as exc:
                specs.append({"name": name, "path": directory, "error": f"invalid kernel.json: {exc}"})
                continue
            argv0 = (spec.get("argv") or [None])[0]
            entry: dict[str, Any] = {"name": name, "path": ctx.flavour.join(directory, name),
                                     "display_name": spec.get("display_name"), "python": argv0}
            if argv0 and ctx.flavour.is_absolute(argv0):
                entry["python_exists"] = ctx.exists(argv0)
                entry["torch"] = torch_in_prefix(ctx, ctx.flavour.prefix_of_interpreter(argv0))
            specs.append(entry)
    return specs


def interpreter_of_prefix(ctx: ProbeContext, prefix: str) -> str | None:
    """The environment's own python, found on disk (a Windows venv and a conda env put it in different places)."""
    return next((path for path in ctx.flavour.interpreters_in_prefix(prefix) if ctx.exists(path)), None)


def gather_kernel(ctx: ProbeContext, python: dict[str, Any]) -> dict[str, Any]:
    """Kernel identity: the probe's view of the interpreter plus the environment around it."""
    env = ctx.env
    paths = ctx.flavour
    which_python = which(ctx, "python") or which(ctx, "python3")
    which_pip = which(ctx, "pip") or which(ctx, "pip3")
    prefix = python.get("prefix") or paths.prefix_of_interpreter(ctx.python)
    others: dict[str, Any] = {}
    for label, other_prefix in (("virtual_env", env.get("VIRTUAL_ENV")), ("conda_prefix", env.get("CONDA_PREFIX")),
                                ("which_python", paths.prefix_of_interpreter(which_python) if which_python else None)):
        if other_prefix:
            others[label] = {"prefix": other_prefix, "torch": torch_in_prefix(ctx, other_prefix),
                             "python": which_python if label == "which_python"
                             else interpreter_of_prefix(ctx, other_prefix)}
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
