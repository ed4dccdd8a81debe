"""Worker rules: what goes wrong once a DataLoader starts worker processes, judged before any starts.

Core ring: pure functions over the loader dicts `jupyter_gpu.facts.loader.loader_facts` returns (its
docstring lists the keys). `%gpucheck` judges the notebook's loaders here (through `usage.usage_findings`) and
`%dataprobe` judges the settings its sweep would start, so both name the same pitfalls with the same evidence.
Keys added after a snapshot was saved are read with `.get()`: an older snapshot simply lacks their findings.
"""

from __future__ import annotations

import math

from jupyter_gpu.models import LAYER_USAGE, Finding
from jupyter_gpu.rendering.units import format_bytes

GIB = 1 << 30
SHM_MIN_BYTES = 512 * 1024 * 1024  # DeepSpeed's threshold: below it, any worker setup is at risk
# Sizing /dev/shm for DataLoader workers: each worker keeps `prefetch_factor` collated batches in shared
# memory, so the batches in flight are num_workers x prefetch_factor. Headroom covers the batch being
# handed over to the main process and the pin-memory thread's copies.
SHM_DEFAULT_PREFETCH = 2  # torch's default prefetch_factor once num_workers > 0
SHM_HEADROOM = 2
# When one sample's size is unknown (any dataset but a TensorDataset), each worker is allowed this much
# before headroom: 8 workers then come to the 8 GiB that Docker users are usually told to give.
SHM_UNKNOWN_WORKER_BYTES = 512 * 1024 * 1024
MOVE_DATASET = "# move {0} into a file such as datasets.py next to the notebook, then:"
# torch/cuda/__init__.py raises exactly this in a forked child once the parent has initialised CUDA, when the
# child's first CUDA call goes through torch's lazy initialisation (creating a CUDA tensor, say).
CUDA_FORK_ERROR = (
    "RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, "
    "you must use the 'spawn' start method"
)
# What the child gets instead when it reads a CUDA tensor the parent made (indexing a CUDA dataset): the copied
# "initialised" flag skips the lazy init and the driver refuses the call. Seen on the H200 with torch 2.11, in
# the DataLoader's "Caught AcceleratorError in DataLoader worker process 0".
CUDA_FORK_READ_ERROR = "CUDA error: initialization error"
CUDA_MULTIPROCESSING_DOC = "https://pytorch.org/docs/stable/notes/multiprocessing.html#cuda-in-multiprocessing"
COPY_ON_READ_ISSUE = "https://github.com/pytorch/pytorch/issues/13246"


def _usage(code: str, severity: str, headline: str, evidence: dict, fix: list[str], *refs: str) -> Finding:
    return Finding(code, severity, headline, evidence, fix, list(refs), LAYER_USAGE)  # type: ignore[arg-type]


def _quoted(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def worker_findings(loaders: list[dict], *, shm_bytes: int | None, hosting: dict | None) -> list[Finding]:
    """Findings about the worker processes of `loaders` (loaders without workers have none).

    Per loader: NOTEBOOK_SPAWN_PICKLING, CUDA_IN_FORKED_WORKER, DATASET_COPY_ON_READ; then one SHM_TOO_SMALL
    over all of them when `shm_bytes` (the size of /dev/shm, None when unknown) is too small. `hosting` is the
    snapshot's `system.hosting`: it picks the container engine whose flags the /dev/shm fix gives."""
    findings = []
    workers = [dl for dl in loaders if dl["num_workers"] > 0]
    for dl in workers:
        findings += _spawn_pickling(dl) + _cuda_in_forked_worker(dl) + _copy_on_read(dl)
    if workers and shm_bytes is not None:
        findings += _shared_memory(workers, shm_bytes, hosting)
    return findings


def workers_blocked(findings: list[Finding]) -> str | None:
    """One sentence when the findings say no worker setting can run (each worker fails as it starts or reads a
    sample, whatever num_workers, prefetch_factor or pin_memory), naming why; None otherwise."""
    reasons = []
    for finding in findings:
        evidence = finding.evidence
        if finding.code == "NOTEBOOK_SPAWN_PICKLING":
            defined = [dict(zip(("what", "name"), item.rsplit(" ", 1), strict=True))
                       for item in evidence["defined_in_the_notebook"]]
            reasons.append(f"workers started with '{evidence['start_method']}' cannot import "
                           f"{_defined_text(defined)}, defined in the notebook")
        elif finding.code == "CUDA_IN_FORKED_WORKER":
            reasons.append(f"forked workers cannot use CUDA, where the dataset's tensors are "
                           f"({evidence['dataset_cuda']})")
    if not reasons:
        return None
    return f"No worker setting can run: {'; and '.join(reasons)}; only num_workers=0 loads here."


def _notebook_defined(dl: dict) -> list[dict[str, str]]:
    defined = list(dl.get("notebook_defined") or [])
    if not defined and dl["dataset_module"] == "__main__":  # a snapshot from before notebook_defined was read
        defined = [{"what": "dataset class", "name": dl["dataset_class"]}]
    return defined


def _defined_text(defined: list[dict[str, str]]) -> str:
    """"the dataset class `Images` and the collate_fn `collate`"."""
    items = [f"the {item['what']} `{item['name']}`" for item in defined]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _spawn_pickling(dl: dict) -> list[Finding]:
    defined = _notebook_defined(dl)
    if dl["start_method"] not in ("spawn", "forkserver") or not defined:
        return []
    name = dl["name"]
    headline = (
        f"DataLoader `{name}` starts workers with '{dl['start_method']}', which cannot import "
        f"{_defined_text(defined)} (defined in the notebook): iterating it fails or hangs."
    )
    keys = ("start_method", "num_workers", "dataset_class", "dataset_module")
    evidence = {"variable": name, **{k: dl[k] for k in keys},
                "defined_in_the_notebook": [f"{item['what']} {item['name']}" for item in defined]}
    names = ", ".join(item["name"] for item in defined)
    fix = [MOVE_DATASET.format(names), f"from datasets import {names}"]
    fix.append(f"# or load in the kernel's process: {name} = DataLoader(..., num_workers=0)")
    return [_usage("NOTEBOOK_SPAWN_PICKLING", "warn", headline, evidence, fix)]


def _cuda_in_forked_worker(dl: dict) -> list[Finding]:
    where = dl.get("dataset_cuda")
    if dl["start_method"] != "fork" or not dl.get("cuda_initialized") or not where:
        return []
    name = dl["name"]
    headline = (
        f"DataLoader `{name}` forks its workers after this kernel initialised CUDA, and its dataset holds CUDA "
        f"tensors ({where}): every worker will fail, with `{CUDA_FORK_READ_ERROR}` where it reads them or "
        f"`{CUDA_FORK_ERROR}` where it makes one."
    )
    evidence = {"variable": name, "start_method": "fork", "num_workers": dl["num_workers"],
                "cuda_initialized": True, "dataset_cuda": where}
    fix = [
        "# keep the dataset on the CPU, and move each batch to the GPU in the training step:",
        'data = torch.load(path, map_location="cpu")  # or tensor.cpu() before building the dataset',
        'batch = batch.to("cuda", non_blocking=True)  # in the training step, not in the Dataset',
        f"# or load in the kernel's process: {name} = DataLoader(..., num_workers=0)",
        "# ('spawn', which the error suggests, copies the dataset to each worker and needs its class in a .py file)",
    ]
    return [_usage("CUDA_IN_FORKED_WORKER", "warn", headline, evidence, fix, CUDA_MULTIPROCESSING_DOC)]


def _copy_on_read(dl: dict) -> list[Finding]:
    containers = dl.get("dataset_python_containers") or []
    if not containers:
        return []
    name, workers = dl["name"], dl["num_workers"]
    held = ", ".join(f"`{c['path']}` ({c['type']}, {c['items']:,} items)" for c in containers)
    headline = (
        f"DataLoader `{name}` keeps plain Python containers in its dataset, {held}: each of its {workers} "
        f"worker{'s' if workers > 1 else ''} grows by a copy of what it reads of them, because reading an object "
        "writes its reference count, and so its memory page."
    )
    evidence = {"variable": name, "num_workers": workers,
                "containers": [f"{c['path']}: {c['type']} of {c['items']:,} items" for c in containers]}
    fix = [*_one_buffer(containers[0]),
           "# or a tensor (torch.tensor(...)); strings: one NumPy bytes array and an array of offsets into it",
           f"%dataprobe {name}   # measures each setting's worker memory"]
    return [_usage("DATASET_COPY_ON_READ", "info", headline, evidence, fix, COPY_ON_READ_ISSUE)]


def _one_buffer(container: dict) -> list[str]:
    """The lines that turn a container into NumPy arrays: one buffer each, no Python object per item."""
    attribute = "self." + container["path"].rpartition(".")[2]
    where = "# in the Dataset's __init__: one buffer, no object per item"
    if container["type"] == "dict":
        return [f"{attribute}_keys = np.array(list({attribute}))  {where}",
                f"{attribute}_values = np.array(list({attribute}.values()))  # np.searchsorted finds a key"]
    if container["type"] == "set":
        return [f"{attribute} = np.array(sorted({attribute}))  {where}"]
    return [f"{attribute} = np.array({attribute})  {where}"]


def in_flight_bytes(num_workers: int, prefetch_factor: int | None, batch_bytes: int) -> int:
    """Bytes of collated batches a loader's workers keep in /dev/shm at once."""
    return num_workers * (prefetch_factor or SHM_DEFAULT_PREFETCH) * batch_bytes


def fits_shm(num_workers: int, prefetch_factor: int | None, batch_bytes: int, shm_bytes: int) -> bool:
    """Whether these workers' batches in flight, with the headroom /dev/shm is sized with, fit in `shm_bytes`."""
    return in_flight_bytes(num_workers, prefetch_factor, batch_bytes) * SHM_HEADROOM <= shm_bytes


def _batches_in_flight(dl: dict) -> tuple[int, bool, str]:
    """Bytes one loader's workers keep in /dev/shm, whether they are known (else a per-worker allowance), and how
    they were counted. A measured `batch_bytes` (put there by `%dataprobe`) counts before the sample's size."""
    workers, prefetch = dl["num_workers"], dl.get("prefetch_factor") or SHM_DEFAULT_PREFETCH
    sample, batch, measured = dl.get("sample_bytes"), dl.get("batch_size"), dl.get("batch_bytes")
    if measured is not None:
        total = in_flight_bytes(workers, prefetch, measured)
        how = (f"{workers} workers x prefetch_factor {prefetch} x {format_bytes(measured)} per batch (measured) = "
               f"{format_bytes(total)}")
        return total, True, f"`{dl['name']}`: {how}"
    if sample is not None and batch:
        total = in_flight_bytes(workers, prefetch, batch * sample)
        how = (f"{workers} workers x prefetch_factor {prefetch} x batch_size {batch} x "
               f"{format_bytes(sample)} per sample = {format_bytes(total)}")
        return total, True, f"`{dl['name']}`: {how}"
    allowance = workers * SHM_UNKNOWN_WORKER_BYTES
    how = (f"{workers} workers x {format_bytes(SHM_UNKNOWN_WORKER_BYTES)} allowed per worker (one sample's "
           f"size is unknown) = {format_bytes(allowance)}")
    return allowance, False, f"`{dl['name']}`: {how}"


def shm_size_gib(workers: list[dict]) -> tuple[int, int, list[str]]:
    """(whole GiB to give /dev/shm, bytes known to be in flight, how each loader was counted).

    The GiB are the batches in flight (an allowance per worker where a sample's size is unknown) times the
    headroom, rounded up, at least 1."""
    known, total, how = 0, 0, []
    for dl in workers:
        in_flight, measured, line = _batches_in_flight(dl)
        known += in_flight if measured else 0
        total += in_flight
        how.append(line)
    return max(1, math.ceil(total * SHM_HEADROOM / GIB)), known, how


def _shm_fix(gib: int, hosting: dict | None) -> list[str]:
    hosting = hosting if hosting is not None else {"docker": True}
    if hosting.get("kubernetes"):
        return [
            "# Kubernetes: mount a memory-backed emptyDir on /dev/shm in the pod spec, then recreate the pod:",
            f"volumes: [{{name: dshm, emptyDir: {{medium: Memory, sizeLimit: {gib}Gi}}}}]",
            "volumeMounts: [{name: dshm, mountPath: /dev/shm}]   # in this notebook's container",
        ]
    engine = "podman" if hosting.get("podman") else "docker"
    if engine == "docker" and not (hosting.get("docker") or hosting.get("cgroup_container")):
        return [f"sudo mount -o remount,size={gib}G /dev/shm   # not a container: resize the host's /dev/shm"]
    return [
        f"{engine} run --shm-size={gib}g ...   # start the container again with this flag",
        f"{engine} run --ipc=host ...   # or share the host's /dev/shm instead",
    ]


def _shared_memory(workers: list[dict], shm_bytes: int, hosting: dict | None) -> list[Finding]:
    gib, known, how = shm_size_gib(workers)
    if shm_bytes >= SHM_MIN_BYTES and shm_bytes >= known:
        return []
    names = [dl["name"] for dl in workers]
    size = f"{shm_bytes / 2**20:.0f} MiB"
    headline = f"/dev/shm holds only {size}: workers of {_quoted(names)} can die with a bus error"
    headline += f" (their batches in flight take {format_bytes(known)})." if known > shm_bytes else "."
    fix = _shm_fix(gib, hosting)
    fix.append(f"# or, without a restart: {names[0]} = DataLoader(..., num_workers=0)")
    evidence = {
        "shm_bytes": shm_bytes,
        "dataloaders": names,
        "batches_in_flight": how,
        "shm_needed": f"{gib} GiB: the batches in flight x{SHM_HEADROOM} headroom, rounded up to whole GiB",
    }
    return [_usage("SHM_TOO_SMALL", "warn", headline, evidence, fix)]
