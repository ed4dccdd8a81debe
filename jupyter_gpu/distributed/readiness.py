"""Multi-GPU readiness rules: the distributed facts snapshot -> findings, each with the exact fix, and the launch
methods that work from this kernel. Pure: a function of the snapshot (jupyter_gpu.distributed.gather).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from jupyter_gpu.distributed.topology import Topology
from jupyter_gpu.distributed.topology_rules import topology_findings
from jupyter_gpu.models import LAYER_BUILD, LAYER_HOST, LAYER_USAGE, LAYER_VISIBILITY, Finding, order_findings
from jupyter_gpu.rendering.units import format_bytes

SMALL_SHM_BYTES = 1024**3  # Docker's default is 64 MB; NCCL's shared-memory transport and DataLoader workers need more
NCCL_DEBUG_ADVICE = "When an NCCL call fails or hangs, rerun it with `NCCL_DEBUG=WARN` (or INFO): NCCL then says why."
REFS_DDP = "https://pytorch.org/docs/stable/notes/cuda.html#use-nn-parallel-distributeddataparallel-instead-of-multiprocessing-or-nn-dataparallel"
REFS_SHM = "https://github.com/NVIDIA/nccl/issues/473"
SPAWN_ERROR = "AttributeError: Can't get attribute '{name}' on <module '__main__'>"
FORK_ERROR = "RuntimeError: Cannot re-initialize CUDA in forked subprocess"
ENV_INIT_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")  # what init_method="env://" reads
_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class LaunchMethod:
    """One way to start one process per GPU, and whether it works from here."""

    name: str
    example: str
    works: bool | None  # None: cannot be told from here (outside a kernel)
    why: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GpuView:
    """The GPUs the check reasons about: torch's visible ones, or the simulated topology's."""

    count: int
    names: tuple[str, ...]
    simulated: bool
    physical: int | None  # GPUs NVML sees on the machine (before CUDA_VISIBLE_DEVICES); None without NVML


def gpu_view(facts: dict[str, Any]) -> GpuView:
    torch = facts.get("torch") or {}
    topology = Topology.from_dict(facts["topology"])
    physical = len(topology.gpus) if topology.status == "ok" else None
    if topology.simulated and topology.status == "ok":
        # A simulated topology stands in for the GPUs this CPU machine lacks: reason about its GPUs, labelled.
        return GpuView(len(topology.gpus), tuple(g.name for g in topology.gpus), True, physical)
    return GpuView(int(torch.get("device_count") or 0), tuple(torch.get("device_names") or ()), False, physical)


def processes_hint(view: GpuView) -> int:
    return view.count if view.count >= 2 else 2


# -- the rules ------------------------------------------------------------------------------------------


def torch_findings(facts: dict[str, Any], view: GpuView) -> list[Finding]:
    torch = facts.get("torch") or {}
    if torch.get("probe_error"):
        error = str(torch["probe_error"])
        missing = "No module named 'torch'" in error
        return [Finding("DIST_NO_TORCH" if missing else "DIST_TORCH_UNREADABLE", "fail",
                        "torch is not installed in this environment" if missing else
                        f"torch could not be inspected: {error}",
                        {"error": error}, ["Run `%gpucheck` (or `jupyter-gpu check`): it names the torch build for "
                                           "this machine and the exact install command."], layer=LAYER_BUILD)]
    found = []
    version = torch.get("torch_version")
    if not torch.get("distributed_available"):
        found.append(Finding("DIST_NO_DISTRIBUTED", "fail", f"torch {version} was built without torch.distributed",
                             {"torch_version": version},
                             ["Install an official torch wheel (they all include torch.distributed): run `%gpucheck` "
                              "for the exact command."], layer=LAYER_BUILD))
        return found
    if not torch.get("nccl_available"):
        gpus_here = view.count > 0 or bool(view.physical)
        found.append(Finding(
            "DIST_NO_NCCL", "fail" if gpus_here and not view.simulated else "info",
            f"torch {version} has no NCCL" + (": training across GPUs needs it" if gpus_here else
                                              ": processes can only talk over gloo, on the CPU"),
            {"torch_version": version, "cuda_build": torch.get("cuda_build"), "gloo": torch.get("gloo_available")},
            ["Run `%gpucheck`: it names the CUDA build of torch for this driver and the exact `%pip install` line.",
             "Meanwhile gloo works on the CPU: `torch.distributed.init_process_group(\"gloo\")`."], layer=LAYER_BUILD))
    return found


def gpu_count_findings(facts: dict[str, Any], view: GpuView) -> list[Finding]:
    label = " (simulated)" if view.simulated else ""
    visible = (facts["host"]["variables"]["debug"]).get("CUDA_VISIBLE_DEVICES")
    found = []
    if view.count == 0:
        found.append(Finding("DIST_NO_GPU", "info", "No GPU is visible to torch: multi-process training here runs "
                             "on the CPU with gloo (good for testing the code, not for speed)",
                             {"device_count": 0, "CUDA_VISIBLE_DEVICES": visible},
                             ["`%gpucheck` says why no GPU is visible and how to fix it."], layer=LAYER_VISIBILITY))
    elif view.count == 1:
        found.append(Finding("DIST_ONE_GPU", "info", f"One GPU is visible{label}: DistributedDataParallel needs two or "
                             "more to speed anything up", {"device_count": 1, "CUDA_VISIBLE_DEVICES": visible},
                             [], layer=LAYER_VISIBILITY))
    if not view.simulated and view.physical and view.physical > view.count and view.count > 0:
        everything = ",".join(str(i) for i in range(view.physical))
        found.append(Finding("DIST_GPUS_HIDDEN", "info",
                             f"torch sees {view.count} of this machine's {view.physical} GPUs"
                             + (f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""),
                             {"visible": view.count, "physical": view.physical, "CUDA_VISIBLE_DEVICES": visible},
                             [f"To use them all, start the kernel (or torchrun) with "
                              f"`CUDA_VISIBLE_DEVICES={everything}`: it is read once, when CUDA starts."],
                             layer=LAYER_VISIBILITY))
    return found


def shm_findings(shm: dict[str, Any]) -> list[Finding]:
    evidence = {k: shm.get(k) for k in ("path", "size_bytes", "free_bytes", "mode", "writable")}
    container_fix = ["Docker: start the container with `--ipc=host` (or `--shm-size=16g`).",
                     "Kubernetes: mount an `emptyDir: {medium: Memory, sizeLimit: 16Gi}` volume at /dev/shm."]
    if not shm.get("exists"):
        return [Finding("DIST_SHM_MISSING", "fail", "/dev/shm does not exist: NCCL fails with \"unhandled system "
                        "error\" and DataLoader workers cannot share batches", evidence, container_fix,
                        [REFS_SHM], layer=LAYER_HOST)]
    if shm.get("writable") is False:
        return [Finding("DIST_SHM_NOT_WRITABLE", "fail", f"/dev/shm is not writable by this user (mode "
                        f"{shm.get('mode')}): NCCL fails with \"shm_open ... Permission denied\"", evidence,
                        ["As root: `chmod 1777 /dev/shm` (its usual mode).", *container_fix], [REFS_SHM],
                        layer=LAYER_HOST)]
    size = shm.get("size_bytes")
    if size is not None and size < SMALL_SHM_BYTES:
        return [Finding("DIST_SHM_SMALL", "warn", f"/dev/shm holds only {format_bytes(size)}: NCCL's shared-memory "
                        "transport and DataLoader workers run out of it (\"unhandled system error\", \"Bus error\")",
                        evidence, container_fix, [REFS_SHM], layer=LAYER_HOST)]
    return []


def _integer(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def torchrun_problems(variables: dict[str, str], view: GpuView, resolves: bool | None) -> list[str]:
    """What makes `init_process_group(init_method="env://")` fail or pick the wrong GPU, one sentence each."""
    problems = []
    numbers = {}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
        if name in variables:
            numbers[name] = _integer(variables[name])
            if numbers[name] is None:
                problems.append(f"{name}={variables[name]!r} is not a whole number")
    missing = [name for name in ENV_INIT_VARIABLES if name not in variables]
    if missing and len(missing) < len(ENV_INIT_VARIABLES):
        problems.append(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set, so "
                        f"init_process_group fails: \"environment variable {missing[0]} expected, but not set\"")
    world, rank = numbers.get("WORLD_SIZE"), numbers.get("RANK")
    if world is not None and world < 1:
        problems.append(f"WORLD_SIZE={world} must be at least 1")
    elif world is not None and rank is not None and not 0 <= rank < world:
        problems.append(f"RANK={rank} is outside 0..{world - 1} (WORLD_SIZE={world})")
    local, local_world = numbers.get("LOCAL_RANK"), numbers.get("LOCAL_WORLD_SIZE")
    if local is not None and local_world is not None and not 0 <= local < local_world:
        problems.append(f"LOCAL_RANK={local} is outside 0..{local_world - 1} (LOCAL_WORLD_SIZE={local_world})")
    if local is not None and view.count and local >= view.count:
        problems.append(f"LOCAL_RANK={local} but {view.count} GPU{'s are' if view.count != 1 else ' is'} visible: "
                        f"cuda:{local} does not exist here")
    port = numbers.get("MASTER_PORT")
    if port is not None and not 1 <= port <= 65535:
        problems.append(f"MASTER_PORT={port} is not a TCP port (1-65535)")
    if resolves is False:
        problems.append(f"MASTER_ADDR={variables.get('MASTER_ADDR')!r} does not resolve to an address")
    return problems


def torchrun_findings(facts: dict[str, Any], view: GpuView) -> list[Finding]:
    variables = facts["host"]["variables"]["torchrun"]
    if not variables:
        return []
    problems = torchrun_problems(variables, view, facts["host"].get("master_addr_resolves"))
    names = " ".join(variables)
    in_kernel = facts["launch"].get("in_kernel")
    if problems:
        fix = ([f"In this notebook, drop the stale values: `import os; [os.environ.pop(k, None) for k in "
                f"{tuple(variables)!r}]`"] if in_kernel else [f"`unset {names}`"])
        fix.append("torchrun sets all of them for each process it starts: "
                   f"`torchrun --standalone --nproc-per-node={processes_hint(view)} train.py`.")
        return [Finding("DIST_TORCHRUN_VARIABLES", "fail", "The torchrun variables here are inconsistent: "
                        + "; ".join(problems), {"variables": variables, "problems": problems}, fix, layer=LAYER_HOST)]
    if in_kernel:
        # A kernel started from a torchrun job's shell inherits one rank's identity: every launcher started here
        # would join that job's rendezvous instead of starting its own.
        return [Finding("DIST_TORCHRUN_IN_KERNEL", "warn", f"This kernel carries torchrun variables ({names}): a "
                        "launcher started from it joins that rendezvous instead of starting its own",
                        {"variables": variables},
                        [f"`import os; [os.environ.pop(k, None) for k in {tuple(variables)!r}]` before launching, "
                         "unless this kernel is meant to be one rank of that job."], layer=LAYER_HOST)]
    return [Finding("DIST_TORCHRUN_SET", "info", f"This process is rank {variables.get('RANK', '?')} of "
                    f"{variables.get('WORLD_SIZE', '?')} (torchrun variables are consistent)",
                    {"variables": variables}, [], layer=LAYER_HOST)]


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in _TRUE


def _interface_matches(spec: str, interfaces: list[str]) -> list[str]:
    """The interfaces NCCL_SOCKET_IFNAME selects: a comma list of prefixes, `=name` for exact names, `^` to exclude."""
    exclude = spec.startswith("^")
    body = spec[1:] if exclude else spec
    exact = body.startswith("=")
    patterns = [p for p in (body[1:] if exact else body).split(",") if p]

    def hit(name: str) -> bool:
        return any(name == p if exact else name.startswith(p) for p in patterns)

    return [name for name in interfaces if hit(name) != exclude]


def nccl_variable_findings(facts: dict[str, Any], topology: Topology) -> list[Finding]:
    nccl = facts["host"]["variables"]["nccl"]
    found = []
    p2p_works = topology.status == "ok" and bool(topology.pairs) and all(
        pair.p2p_read == "ok" for pair in topology.pairs)
    if _truthy(nccl.get("NCCL_P2P_DISABLE")):
        found.append(Finding(
            "DIST_NCCL_P2P_DISABLED", "warn" if p2p_works else "info",
            "NCCL_P2P_DISABLE is set: GPU-to-GPU traffic goes through host memory"
            + (", although every pair here supports P2P" if p2p_works else ""),
            {"NCCL_P2P_DISABLE": nccl["NCCL_P2P_DISABLE"]},
            ["Drop it when P2P works (`jupyter-gpu allreduce` checks every pair): `unset NCCL_P2P_DISABLE` in the "
             "shell, or `import os; os.environ.pop('NCCL_P2P_DISABLE', None)` before the first collective."],
            layer=LAYER_HOST))
    if _truthy(nccl.get("NCCL_SHM_DISABLE")):
        found.append(Finding("DIST_NCCL_SHM_DISABLED", "warn", "NCCL_SHM_DISABLE is set: without P2P, traffic between "
                             "GPUs falls back to sockets", {"NCCL_SHM_DISABLE": nccl["NCCL_SHM_DISABLE"]},
                             ["`unset NCCL_SHM_DISABLE` (fix /dev/shm instead if it was set because of it)."],
                             layer=LAYER_HOST))
    ports = [p for d in facts["host"]["infiniband"] for p in d["ports"]]
    if _truthy(nccl.get("NCCL_IB_DISABLE")) and any("ACTIVE" in (p.get("state") or "") for p in ports):
        found.append(Finding("DIST_NCCL_IB_DISABLED", "warn", "NCCL_IB_DISABLE is set although an InfiniBand port is "
                             "active: traffic between nodes goes over TCP sockets",
                             {"NCCL_IB_DISABLE": nccl["NCCL_IB_DISABLE"]}, ["`unset NCCL_IB_DISABLE`"],
                             layer=LAYER_HOST))
    spec = nccl.get("NCCL_SOCKET_IFNAME")
    interfaces = [i["name"] for i in facts["host"]["interfaces"]]
    if spec and interfaces and not _interface_matches(spec, interfaces):
        usable = [name for name in interfaces if name != "lo"] or interfaces
        found.append(Finding(
            "DIST_NCCL_SOCKET_IFNAME", "fail",
            f"NCCL_SOCKET_IFNAME={spec} matches none of this machine's interfaces ({', '.join(interfaces)}): NCCL "
            "stops with \"Bootstrap : no socket interface found\"",
            {"NCCL_SOCKET_IFNAME": spec, "interfaces": interfaces},
            [f"`export NCCL_SOCKET_IFNAME={usable[0]}` (or `os.environ['NCCL_SOCKET_IFNAME'] = '{usable[0]}'` before "
             "init_process_group), or unset it to let NCCL choose."], layer=LAYER_HOST))
    return found


def infiniband_findings(devices: list[dict[str, Any]]) -> list[Finding]:
    down = [f"{d['name']} port {p['port']} ({p.get('state') or 'unknown'})" for d in devices for p in d["ports"]
            if "ACTIVE" not in (p.get("state") or "")]
    if down:
        return [Finding("DIST_IB_PORT_DOWN", "warn", f"InfiniBand port not active: {', '.join(down)}: NCCL uses "
                        "the active ones, or falls back to TCP sockets between nodes", {"devices": devices},
                        ["`ibstat` shows each port; a port stuck in INIT has no subnet manager, one DOWN has no link.",
                         "To use sockets on purpose: `NCCL_IB_DISABLE=1`."], layer=LAYER_HOST)]
    return []


def data_parallel_findings(launch: dict[str, Any], view: GpuView) -> list[Finding]:
    found = []
    n = processes_hint(view)
    for model in launch.get("data_parallel") or []:
        found.append(Finding(
            "DIST_DATA_PARALLEL", "warn",
            f"`{model['name']}` is an nn.DataParallel ({model['module']}): GPU 0 gathers every output and the loss "
            "(more memory there than on the others) and one Python thread drives all GPUs",
            {"name": model["name"], "device_ids": model["device_ids"]},
            ["Use DistributedDataParallel, one process per GPU (PyTorch's advice; it is faster on one machine too):",
             f"from this notebook: `from accelerate import notebook_launcher; notebook_launcher(train, "
             f"num_processes={n})` with `model = DDP(model.to(rank), device_ids=[rank])` inside `train`;",
             f"from a terminal: `torchrun --standalone --nproc-per-node={n} train.py`."], [REFS_DDP],
            layer=LAYER_USAGE))
    return found


def launch_findings(launch: dict[str, Any]) -> list[Finding]:
    if not launch.get("in_kernel"):
        return []
    found = []
    if launch.get("cuda_initialized"):
        found.append(Finding(
            "DIST_FORK_AFTER_CUDA", "warn",
            "CUDA is already initialised in this kernel: fork-based launchers (accelerate's notebook_launcher, "
            f"Lightning's ddp_notebook) now fail with \"{FORK_ERROR}\"",
            {"cuda_initialized": True},
            ["Restart the kernel and run the launcher before any cell touches CUDA (`.cuda()`, `.to('cuda')`, "
             "`torch.cuda.is_available()`).",
             "To ask for GPUs without creating a context: `%env PYTORCH_NVML_BASED_CUDA_CHECK=1` before "
             "`import torch`."],
            layer=LAYER_USAGE))
    functions = launch.get("notebook_functions") or []
    if functions and "spawn" in (launch.get("start_methods") or []):
        shown = ", ".join(f"`{name}`" for name in functions[:5]) + (" ..." if len(functions) > 5 else "")
        found.append(Finding(
            "DIST_SPAWN_NOTEBOOK_FUNCTIONS", "info",
            f"{shown} {'is' if len(functions) == 1 else 'are'} defined in this notebook: spawn-based launchers "
            f"(torch.multiprocessing.spawn, Lightning's ddp_spawn) cannot import "
            f"{'it' if len(functions) == 1 else 'them'} in the child (\"{SPAWN_ERROR.format(name=functions[0])}\")",
            {"notebook_functions": functions},
            [f"Put the code in a file: start its cell with `%%writefile train_ddp.py`, run it, then "
             f"`from train_ddp import {functions[0]}`; or use a fork-based launcher from this notebook."],
            layer=LAYER_USAGE))
    return found


def launch_methods(launch: dict[str, Any], view: GpuView) -> list[LaunchMethod]:
    n = processes_hint(view)
    in_kernel = bool(launch.get("in_kernel"))
    can_fork = "fork" in (launch.get("start_methods") or [])
    cuda_started = bool(launch.get("cuda_initialized"))
    functions = launch.get("notebook_functions") or []
    methods = [LaunchMethod("torchrun", f"torchrun --standalone --nproc-per-node={n} train.py", True,
                            "a script in a terminal (or `!torchrun ...` from a cell): each rank is a fresh process")]
    if not in_kernel:
        why = "checked from a notebook: `%gpucheck --distributed` there"
        methods.append(LaunchMethod("fork from a notebook", f"notebook_launcher(train, num_processes={n})", None, why))
        methods.append(LaunchMethod("spawn from a notebook", f"torch.multiprocessing.spawn(train, nprocs={n})", None,
                                    why))
        return methods
    if not can_fork:
        fork = (False, f"{launch.get('platform')} has no fork start method")
    elif cuda_started:
        fork = (False, f"CUDA is initialised in this kernel: \"{FORK_ERROR}\"")
    else:
        fork = (True, "CUDA is not initialised in this kernel, so forked ranks can start it")
    methods.append(LaunchMethod("fork from this kernel", f"notebook_launcher(train, num_processes={n})  "
                                "# or Trainer(strategy=\"ddp_notebook\")", *fork))
    if functions:
        spawn = (False, f"{', '.join(functions[:3])}{' ...' if len(functions) > 3 else ''} defined in the notebook "
                        "cannot be imported by a spawned child")
    else:
        spawn = (True, "works for functions imported from a .py module")
    methods.append(LaunchMethod("spawn from this kernel", f"torch.multiprocessing.spawn(train, nprocs={n})", *spawn))
    return methods


def diagnose_readiness(facts: dict[str, Any]) -> tuple[list[Finding], list[LaunchMethod]]:
    view = gpu_view(facts)
    topology = Topology.from_dict(facts["topology"])
    findings = [
        *torch_findings(facts, view),
        *gpu_count_findings(facts, view),
        *topology_findings(topology),
        *shm_findings(facts["host"]["shm"]),
        *torchrun_findings(facts, view),
        *nccl_variable_findings(facts, topology),
        *infiniband_findings(facts["host"]["infiniband"]),
        *data_parallel_findings(facts["launch"], view),
        *launch_findings(facts["launch"]),
    ]
    return order_findings(findings), launch_methods(facts["launch"], view)
