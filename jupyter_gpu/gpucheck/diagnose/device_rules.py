"""Layers 3 and 4: which GPUs this kernel may see, and whether its torch build can run on them (§3 C, D, E2, E3)."""

from __future__ import annotations

from jupyter_gpu.gpucheck.diagnose.fixes import RESTART, install_advice, pip_fix_lines, torch_not_for_this_jetson
from jupyter_gpu.gpucheck.diagnose.view import CudaDeviceSlot, FactsView
from jupyter_gpu.gpucheck.diagnose.visibility import canonical_uuid
from jupyter_gpu.gpucheck.diagnose.wheels import (
    MIN_DRIVER_FOR_CUDA_MAJOR,
    arch_flags_for,
    arch_supports,
    cuda_int_to_str,
    driver_supports_wheel,
    parse_cuda_version,
)
from jupyter_gpu.models import LAYER_BUILD, LAYER_COMPAT, LAYER_VISIBILITY, Finding

COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}
OTHER_PROCESS_MEMORY_FLOOR = 1 << 30  # 1 GiB: below this another process cannot crowd a training run out


def _gib(value: int | None) -> str:
    return "unknown" if value is None else f"{value / (1 << 30):.1f} GiB"


def visible_devices_hide_gpus(view: FactsView) -> list[Finding]:
    value = view.env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return []
    if view.batch_job is not None and not view.job_gpu_allocation:
        return []  # a job its scheduler gave no GPU: host_rules.job_given_no_gpu, never "unset it"
    vis = view.visibility
    hides_by_value = vis.mode == "indices" and not vis.indices
    if not (view.nvml_ok and view.nvml_devices):
        if not hides_by_value:
            return []
        # No GPU to hide here, but the setting would hide one: worth knowing before moving to a GPU machine.
        return [Finding(
            "CUDA_VISIBLE_DEVICES_HIDES_GPUS", "fail" if view.nvidia_present else "info",
            f"CUDA_VISIBLE_DEVICES={value!r} hides every GPU from PyTorch.",
            evidence={"CUDA_VISIBLE_DEVICES": value, "why": vis.problem},
            fix=["Unset it before torch first uses CUDA: %env CUDA_VISIBLE_DEVICES=0  (then restart the kernel)"],
            refs=["pytorch#63226"], layer=LAYER_VISIBILITY)]
    visible = view.visible_nvml_devices()
    probe_count = (view.torch or {}).get("device_count")
    all_hidden = not visible or hides_by_value
    if not all_hidden and not vis.problem:
        return []
    fix_value = ",".join(str(d.index) for d in view.nvml_devices)
    hidden = "every GPU" if all_hidden else "some GPUs"
    return [Finding(
        "CUDA_VISIBLE_DEVICES_HIDES_GPUS", "fail" if all_hidden else "warn",
        f"CUDA_VISIBLE_DEVICES={value!r} hides {hidden} from PyTorch ({len(view.nvml_devices)} on this machine).",
        evidence={"CUDA_VISIBLE_DEVICES": value, "why": vis.problem, "gpus_on_machine": len(view.nvml_devices),
                  "visible_to_torch": probe_count if probe_count is not None else len(visible)},
        fix=[f"%env CUDA_VISIBLE_DEVICES={fix_value}   # or unset it; set it before torch first uses CUDA",
             "Then restart the kernel and run this before `import torch`."],
        refs=["pytorch#63226", "pytorch/examples#115"], layer=LAYER_VISIBILITY)]


def _kernel_uses_other_devices(view: FactsView, selected: list[CudaDeviceSlot], in_use: list[dict],
                               device_count: int) -> bool:
    """The same number of devices, but other GPUs (or the same ones in another order), by UUID.

    Compared only when every UUID on both sides is known and CUDA's numbering is NVML's, so a missing
    UUID or an unknowable order never raises a false alarm.
    """
    uuids = [canonical_uuid(d.get("uuid")) for d in in_use]
    if not (view.cuda_order_known and uuids and len(uuids) == device_count and all(uuids)
            and all(slot.uuids for slot in selected)):
        return False
    if any(slot.mig for slot in selected):
        allowed = set().union(*(slot.uuids for slot in selected))
        return any(u not in allowed for u in uuids)
    return len(uuids) == len(selected) and any(u not in slot.uuids for u, slot in zip(uuids, selected, strict=True))


def visible_devices_changed_after_init(view: FactsView) -> list[Finding]:
    """CUDA reads CUDA_VISIBLE_DEVICES once, at its start: a later change is silently ignored.

    Caught when the number of devices differs, and also when it is the same but the GPUs are not: the
    UUIDs of the kernel's CUDA devices against what the variable selects now.
    """
    kernel = view.in_kernel
    if not kernel.get("cuda_initialized") or kernel.get("device_count") is None or not view.nvml_ok:
        return []
    selected = view.cuda_selection_now()
    in_use = [d for d in kernel.get("devices") or [] if isinstance(d, dict)]
    # MIG instances hide how many devices CUDA counts, so there only their UUIDs can be compared.
    mig = any(slot.mig for slot in selected)
    count_differs = not mig and len(selected) != kernel["device_count"]
    if not (count_differs or _kernel_uses_other_devices(view, selected, in_use, kernel["device_count"])):
        return []
    using = [f"cuda:{d.get('index', i)} = {view.describe_cuda_device(d.get('uuid'), d.get('name'))}"
             for i, d in enumerate(in_use)] or [f"{kernel['device_count']} GPU(s)"]
    chosen = [slot.label for slot in selected] or ["no GPU"]
    return [Finding(
        "CUDA_VISIBLE_DEVICES_CHANGED_AFTER_INIT", "warn",
        f"CUDA_VISIBLE_DEVICES now selects {'; '.join(chosen)}, but this kernel's CUDA, started earlier, "
        f"still uses {'; '.join(using)}: the change is ignored until a restart.",
        evidence={"CUDA_VISIBLE_DEVICES": view.env.get("CUDA_VISIBLE_DEVICES"),
                  "kernel_device_count": kernel["device_count"], "selected_now": len(selected),
                  "kernel_devices": using, "selected_devices": chosen},
        fix=["Restart the kernel and set the variable in the first cell, before `import torch`."],
        refs=["pytorch#40618", "pytorch#23544"], layer=LAYER_VISIBILITY)]


def mig(view: FactsView) -> list[Finding]:
    findings = []
    mig_gpus = [d for d in view.visible_nvml_devices() if d.mig_enabled]
    empty = [d for d in mig_gpus if d.mig_instances is not None and not d.mig_instances]
    if empty:
        everything = len(empty) == len(view.visible_nvml_devices())
        findings.append(Finding(
            "MIG_NO_INSTANCES", "fail" if everything else "warn",
            f"MIG is enabled on GPU {', '.join(str(d.index) for d in empty)} but no MIG instance exists, "
            "so CUDA sees no device there.",
            evidence={"gpus": [f"{d.index}: {d.name}" for d in empty], "mig_mode": "enabled", "mig_instances": 0},
            fix=["sudo nvidia-smi mig -cgi <profile> -C   # e.g. 9 for 3g.40gb on an A100 80GB",
                 "Then: %env CUDA_VISIBLE_DEVICES=MIG-<uuid>  (from `nvidia-smi -L`) and restart the kernel."],
            refs=["pytorch#130181"], layer=LAYER_VISIBILITY))
    migs = [u for u in view.visibility.uuids if u.startswith("MIG-")]
    instances = [m for d in mig_gpus for m in d.mig_instances or []]
    if len(migs) > 1 or (not migs and len(instances) > 1):
        findings.append(Finding(
            "MIG_MULTI_DEVICE", "warn" if len(migs) > 1 else "info",
            "One process can use only one MIG instance: "
            + (f"CUDA_VISIBLE_DEVICES lists {len(migs)}, torch uses the first."
               if migs else f"{len(instances)} exist, torch picks the first."),
            evidence={"mig_instances": [m.get("uuid") for m in instances] or migs},
            fix=[f"%env CUDA_VISIBLE_DEVICES={(migs or [m.get('uuid') for m in instances])[0]}   "
                 "# one per process; restart the kernel"], refs=["pytorch#102715"], layer=LAYER_VISIBILITY))
    return findings


def exclusive_busy(view: FactsView) -> list[Finding]:
    visible = view.visible_nvml_devices()
    blocked = []
    for d in visible:
        others = [p for p in d.processes or [] if p.get("pid") != view.pid]
        if d.compute_mode == 2 or (d.compute_mode in (1, 3) and others):
            blocked.append(d)
    message = view.message_containing("busy or unavailable")
    if not blocked and not message:
        return []
    everything = message is not None or len(blocked) == len(visible)
    return [Finding(
        "GPU_EXCLUSIVE_BUSY", "fail" if everything else "warn",
        "GPU " + ", ".join(str(d.index) for d in blocked) + " cannot take this kernel: its compute mode is "
        + ", ".join(COMPUTE_MODES.get(d.compute_mode or 0, "?") for d in blocked) if blocked
        else "CUDA says every GPU is busy or unavailable.",
        evidence={"compute_modes": {d.index: COMPUTE_MODES.get(d.compute_mode or 0) for d in visible},
                  "other_processes": {d.index: [p.get("pid") for p in d.processes or []] for d in blocked},
                  "torch": message},
        fix=["Use another GPU: %env CUDA_VISIBLE_DEVICES=<free index>, then restart the kernel",
             "or stop the process holding it; an admin can run: sudo nvidia-smi -c DEFAULT"],
        refs=["pytorch#3871"], layer=LAYER_VISIBILITY)]


def memory_held_by_others(view: FactsView) -> list[Finding]:
    held = []
    for d in view.visible_nvml_devices():
        for p in d.processes or []:
            used = p.get("memory_used")
            if p.get("pid") == view.pid or used is None:
                continue
            if used >= OTHER_PROCESS_MEMORY_FLOOR or (d.memory_total and used > 0.25 * d.memory_total):
                held.append((d, p))
    if not held:
        return []
    local = [str(p["pid"]) for _, p in held if p.get("in_this_pid_namespace", True)]
    foreign = [str(p["pid"]) for _, p in held if not p.get("in_this_pid_namespace", True)]
    fix = ["Shut down unused kernels (Running Terminals and Kernels tab)"]
    if local:
        fix.append("or stop them: kill " + " ".join(local))
    if foreign:
        fix.append(f"PID {', '.join(foreign)} is not visible from here (NVML reports host PIDs in a container); "
                   "find it on the host with: nvidia-smi --query-compute-apps=pid,used_memory --format=csv")
    total = _gib(sum(p["memory_used"] for _, p in held))
    headline = f"Other processes hold {total} of GPU memory (a forgotten notebook kernel or DataLoader workers?)."
    if foreign and view.in_kernel.get("cuda_initialized"):
        headline = (f"Processes hold {total} of GPU memory; NVML shows host PIDs here, "
                    "so this kernel may be one of them.")
    return [Finding(
        "GPU_MEMORY_HELD_BY_OTHER_PROCESS", "warn", headline,
        evidence={"processes": [f"pid {p['pid']} holds {_gib(p['memory_used'])} on GPU {d.index}"
                                + ("" if p.get("in_this_pid_namespace", True) else " (host PID)") for d, p in held]},
        fix=fix, layer=LAYER_VISIBILITY)]


def driver_too_old(view: FactsView) -> list[Finding]:
    wheel = view.torch_cuda
    driver = view.cuda_driver_version
    message = view.message_containing("driver on your system is too old")
    if not wheel or torch_not_for_this_jetson(view):
        return []  # a Jetson's driver is its JetPack's: a torch built for another one is jetson_torch's finding
    if not message and (driver is None or driver_supports_wheel(driver, wheel)):
        return []
    major = parse_cuda_version(wheel)[0]
    code = "WSL_WINDOWS_DRIVER_OLD" if view.hosting.get("wsl") else "DRIVER_TOO_OLD_FOR_WHEEL"
    fix = pip_fix_lines(view)
    if view.hosting.get("wsl"):
        fix.append(f"or update the NVIDIA driver on Windows (>= the CUDA {major} branch), then `wsl --shutdown`.")
    return [Finding(
        code, "fail",
        f"The NVIDIA driver {view.driver_version or ''} (CUDA {cuda_int_to_str(driver) if driver else '?'}) is too "
        f"old for torch {view.torch_version}, which needs CUDA {wheel} "
        f"(driver >= {MIN_DRIVER_FOR_CUDA_MAJOR.get(major)}).",
        evidence={"driver_version": view.driver_version, "driver_cuda_version": driver, "torch_cuda": wheel,
                  "torch": message},
        fix=fix, refs=["NVIDIA-BioNeMo/nvMolKit#209"], layer=LAYER_COMPAT)]


def minor_version_compat(view: FactsView) -> list[Finding]:
    wheel, driver = view.torch_cuda, view.cuda_driver_version
    if not wheel or not driver or not driver_supports_wheel(driver, wheel) or torch_not_for_this_jetson(view):
        return []
    major, minor = parse_cuda_version(wheel)
    if driver >= major * 1000 + minor * 10:
        return []
    return [Finding(
        "CUDA_MINOR_VERSION_COMPAT", "info",
        f"torch's CUDA {wheel} runs on this CUDA {cuda_int_to_str(driver)} driver through minor-version "
        "compatibility; PTX from newer toolkits cannot be JIT-compiled.",
        evidence={"torch_cuda": wheel, "driver_cuda_version": driver}, layer=LAYER_COMPAT)]


def arch_mismatch(view: FactsView) -> list[Finding]:
    wheel = view.torch_cuda
    if not wheel:
        return []
    flags = view.arch_flags or arch_flags_for(view.torch_version or "", wheel) or []
    devices = [(d.index, d.name, d.capability) for d in view.visible_nvml_devices() if d.capability]
    if not devices:
        devices = [(d["index"], d.get("name"), tuple(d["capability"])) for d in view.torch_devices
                   if d.get("capability")]
    no_image = view.message_containing("no kernel image is available")
    unsupported = [(i, n, cc) for i, n, cc in devices if flags and not arch_supports(flags, cc)]  # type: ignore[arg-type]
    if not unsupported and not no_image:
        return []
    sms = sorted(int(f.split("_")[1].rstrip("af")) for f in flags if f.startswith("sm_"))
    too_old = bool(unsupported) and all(cc[0] * 10 + cc[1] < (sms[0] if sms else 0) for _, _, cc in unsupported)
    code = "GPU_ARCH_TOO_OLD_FOR_WHEEL" if too_old or (no_image and not unsupported) else "GPU_ARCH_TOO_NEW_FOR_WHEEL"
    names = ", ".join(f"{n} (sm_{cc[0]}{cc[1]})" for _, n, cc in unsupported) or "this GPU"
    return [Finding(
        code, "fail",
        f"torch {view.torch_version} has no kernels for {names}: "
        + ("the GPU is too old for this build." if code.endswith("OLD_FOR_WHEEL")
           else "the GPU is newer than this build."),
        evidence={"gpus": [f"{n}: compute capability {cc[0]}.{cc[1]}" for _, n, cc in unsupported] or None,
                  "compiled_arch_list": " ".join(flags) or None, "torch": no_image},
        fix=pip_fix_lines(view), refs=["Kaggle/docker-python#1546", "pytorch#150733"], layer=LAYER_COMPAT)]


def ptx_toolchain(view: FactsView) -> list[Finding]:
    message = view.message_containing("PTX was compiled with an unsupported toolchain")
    if not message:
        return []
    return [Finding(
        "PTX_TOOLCHAIN_TOO_NEW", "fail", "The driver is too old to JIT-compile PTX shipped with this torch.",
        evidence={"torch": message, "driver_cuda_version": view.cuda_driver_version, "torch_cuda": view.torch_cuda},
        fix=["Upgrade the NVIDIA driver, or use a wheel whose CUDA minor is not above the driver's:",
             *pip_fix_lines(view)], layer=LAYER_COMPAT)]


def cuda_not_available(view: FactsView, already: list[Finding]) -> list[Finding]:
    """The last word: a CUDA build that found no usable GPU while no specific rule explained why."""
    torch = view.torch or {}
    if not view.probe_ran or not (torch.get("compiled_with_cuda") or view.torch_hip):
        return []
    failed_init = torch.get("init_error") or torch.get("cuda_error")
    if torch.get("device_count") and not failed_init:
        return []
    if any(f.severity == "fail" for f in already):
        return []
    advice = install_advice(view)
    return [Finding(
        "CUDA_NOT_AVAILABLE", "fail",
        "torch.cuda.is_available() is False in this kernel" if not failed_init else
        "CUDA initialised but a first GPU operation failed.",
        evidence={"device_count": torch.get("device_count"), "init_error": failed_init,
                  "warnings": view.cuda_messages or None, "driver_version": view.driver_version},
        fix=["Read the torch message above; run `nvidia-smi` in a terminal to check the driver.",
             f"Recommended wheel for this machine: {advice.pip_command or advice.reason}", RESTART],
        layer=LAYER_COMPAT)]


def mac(view: FactsView) -> list[Finding]:
    if view.platform.get("system") != "Darwin" or not view.probe_ran:
        return []
    mps = (view.torch or {}).get("mps") or {}
    if mps.get("available"):
        return [Finding("MAC_USE_MPS", "info", "macOS has no CUDA: use the Apple GPU with device='mps'.",
                        evidence={"mps_built": True, "mps_available": True},
                        fix=['device = torch.device("mps")', "model = model.to(device)"], layer=LAYER_BUILD)]
    if view.platform.get("machine") == "x86_64":
        return [Finding(
            "MAC_ROSETTA_PYTHON", "fail",
            "This Python is an x86_64 build (Rosetta or an Intel Mac), so the Apple GPU (MPS) is unavailable.",
            evidence={"machine": "x86_64", "mps": mps},
            fix=["Install an arm64 Python (e.g. Miniforge arm64), then: %pip install torch", RESTART],
            refs=["pytorch#146236"], layer=LAYER_BUILD)]
    return [Finding(
        "MAC_OS_TOO_OLD", "fail", "MPS is built into torch but not available: macOS is too old for this torch.",
        evidence={"mps": mps, "macos_release": view.platform.get("release")},
        fix=["Update macOS (torch >= 2.10 needs macOS 14.0+), or install an older torch."],
        refs=["pytorch#177819"], layer=LAYER_BUILD)]


def xpu(view: FactsView) -> list[Finding]:
    if not (view.torch or {}).get("xpu_available"):
        return []
    return [Finding("XPU_AVAILABLE", "info", "An Intel GPU (XPU) is available to torch: use device='xpu'.",
                    evidence={"xpu_available": True}, layer=LAYER_BUILD)]


RULES = (visible_devices_hide_gpus, visible_devices_changed_after_init, mig, exclusive_busy, memory_held_by_others,
         driver_too_old, minor_version_compat, arch_mismatch, ptx_toolchain, mac, xpu)
