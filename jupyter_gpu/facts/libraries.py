"""The folders LD_LIBRARY_PATH puts ahead of torch's own CUDA libraries, and which CUDA libraries each holds.

Read through the probe context (the checked machine's files), only when `import torch` failed: the dynamic loader
searches these folders before the nvidia-* wheels' own, so a system CUDA (/usr/local/cuda-12.1/lib64) or a conda
environment's lib/ there can answer for a library torch expects from its wheel. A folder's owner is named where it
can be: a conda environment's conda-meta/*.json lists the files each package installed.
"""

from __future__ import annotations

import json
import re
from typing import Any

from jupyter_gpu.facts.context import ProbeContext

# The CUDA user-space libraries (toolkit, cuDNN, NCCL, cuSPARSELt) and the driver's, by file name.
CUDA_LIBRARY = re.compile(r"^lib(cu|nv|nccl|cudnn|cupti|cusparse|cublas|curand|cufft|cusolver)\w*\.so(\.\d+)*$",
                          re.I)
# conda packages that can hold such libraries: only their records are read (an environment holds hundreds).
CUDA_CONDA_PACKAGE = re.compile(r"^(lib)?(cu|nv|nccl|cudnn|cuda|cutensor|cusparselt)", re.I)


def library_path_facts(ctx: ProbeContext) -> list[dict[str, Any]]:
    """One entry per LD_LIBRARY_PATH folder: `dir`, `exists`, the CUDA `libraries` in it, and `owners` ({file:
    "conda package NAME VERSION (CHANNEL)"}) where the folder is a conda environment's lib/."""
    if ctx.windows:
        return []  # Windows finds DLLs through PATH and the DLL directories torch adds, not LD_LIBRARY_PATH
    paths = ctx.flavour
    found = []
    for directory in paths.split_list(ctx.env.get("LD_LIBRARY_PATH")):
        if not directory:
            continue
        libraries = [name for name in ctx.listdir(directory) if CUDA_LIBRARY.match(name)]
        entry: dict[str, Any] = {"dir": directory, "exists": ctx.exists(directory), "libraries": libraries}
        owners = conda_owners(ctx, directory, libraries)
        if owners:
            entry["owners"] = owners
        found.append(entry)
    return found


def conda_owners(ctx: ProbeContext, directory: str, libraries: list[str]) -> dict[str, str]:
    """Which conda package installed each library of `directory`, when it is <prefix>/lib of a conda environment."""
    paths = ctx.flavour
    prefix = paths.dirname(directory.rstrip("/"))
    meta = paths.join(prefix, "conda-meta")
    if not libraries or not ctx.exists(meta):
        return {}
    wanted = {f"{paths.basename(directory.rstrip('/'))}/{name}": name for name in libraries}
    owners = {}
    for record_file in ctx.listdir(meta):
        if not (record_file.endswith(".json") and CUDA_CONDA_PACKAGE.match(record_file)):
            continue
        try:
            record = json.loads(ctx.read_text(paths.join(meta, record_file), limit=4 << 20) or "")
        except ValueError:
            continue
        channel = (record.get("channel") or "").rstrip("/").split("/")
        label = f"conda package {record.get('name')} {record.get('version')}"
        where = next((part for part in reversed(channel) if part and not re.match(r"(linux|osx|win|noarch)", part)),
                     None)
        for relative in record.get("files") or []:
            if relative in wanted:
                owners[wanted[relative]] = f"{label} ({where})" if where else label
    return owners
