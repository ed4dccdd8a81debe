"""Usage rules: notebook facts -> findings (catalogue §3 D7-D9, F1-F5 and §6).

Core ring: pure functions over the dict that `jupyter_gpu.facts.notebook.gather_notebook_facts` returns
(its docstring lists the keys), so a saved snapshot diagnoses exactly like the live kernel. No torch import.

`gpu_kind` is the kind of GPU PyTorch can use in this kernel, as the environment diagnosis found it:
"cuda", "rocm" (driven through PyTorch's "cuda" device), "mps", or None. Performance rules fire only while
a model already sits on an accelerator; MODEL_ON_CPU needs `gpu_usable`. Thresholds are the catalogue's
heuristics, and performance findings are warn or info, never fail. Findings about one variable name it in
`evidence["variable"]` and in the headline, so one code can appear once per offending variable.

Tensors marked `small` (under 1 MiB, gathered only because the last error is a device mismatch) serve only
DEVICE_MISMATCH_ERROR; the other rules leave them out, as they would never have been gathered otherwise.

The rules about DataLoader worker processes live in `worker_rules`, shared with `%dataprobe`.
"""

from __future__ import annotations

import re
from typing import Any

from jupyter_gpu.gpucheck.diagnose.worker_rules import CUDA_FORK_READ_ERROR, MOVE_DATASET, worker_findings
from jupyter_gpu.models import LAYER_LAST_ERROR, LAYER_USAGE, Finding
from jupyter_gpu.torch_errors.mismatch import DeviceMismatch, find_device_mismatch, held_on
from jupyter_gpu.torch_errors.oom import TORCH_OOM_TYPE, device_out_of_memory, find_oom_marker

MODEL_MIN_PARAMS = 10_000
TUNING_GUIDE = "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html"
TF32_DOC = "https://pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices"
LOADER_ARGS = "num_workers=min(8, os.cpu_count()), pin_memory=True, persistent_workers=True"
# The measurement comes first: which settings help depends on this loader and this step, not on a rule of thumb.
DATAPROBE = "%dataprobe {0} --step train_step   # measures which settings help here (train_step(batch) runs one step)"
MOVE_STATE = "{0}.load_state_dict({0}.state_dict())  # moves {0}'s state onto its parameters' devices"
DETERMINISTIC_OFF = "torch.use_deterministic_algorithms(False)"
CUDNN_DETERMINISTIC_OFF = "torch.backends.cudnn.deterministic = False"


def _usage(code: str, severity: str, headline: str, evidence: dict, fix: list[str], *refs: str) -> Finding:
    return Finding(code, severity, headline, evidence, fix, list(refs), LAYER_USAGE)  # type: ignore[arg-type]


def _accelerator(device: str) -> bool:
    return device.split(":")[0] not in ("cpu", "meta")


def _of(notebook: dict, kind: str) -> list[dict]:
    return [o for o in notebook.get("objects") or [] if o.get("kind") == kind]


def _models(notebook: dict) -> list[dict]:
    """Top-level modules holding parameters or buffers (layers bound to their own name are skipped)."""
    return [m for m in _of(notebook, "module") if m.get("part_of") is None and m.get("devices")]


def _on_gpu(module: dict) -> bool:
    return any(_accelerator(d) for d in module["devices"])


def _quoted(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def usage_findings(
    notebook: dict,
    *,
    gpu_usable: bool,
    gpu_kind: str | None,
    cuda_launch_blocking: bool,
    shm_bytes: int | None,
    cpu_count: int | None,
    hosting: dict | None = None,
) -> list[Finding]:
    """Findings about how the notebook uses the GPU. Without torch imported (or from the command line) only
    the environment's CUDA_LAUNCH_BLOCKING is left to check.

    `hosting` is the snapshot's `system.hosting` (docker, podman, kubernetes, ...): it picks the container
    engine whose flags the fixes give; without it they are Docker's."""
    if not notebook.get("torch_imported"):
        return _debug_modes({}, cuda_launch_blocking=cuda_launch_blocking)
    flags = notebook.get("flags") or {}
    models = _models(notebook)
    gpu_models = [m for m in models if _on_gpu(m)]
    loaders = _of(notebook, "dataloader")
    target = "mps" if gpu_kind == "mps" else "cuda"
    findings = _placement(notebook, models, gpu_usable=gpu_usable, target=target)
    findings += _tensor_mismatch(notebook, models)
    if gpu_models:
        findings += _loader_bottlenecks(loaders, gpu_models, cpu_count=cpu_count, gpu_kind=gpu_kind)
        findings += _tensor_cores(notebook, flags, gpu_models, gpu_kind=gpu_kind)
    findings += _cudnn(flags, models, gpu_models, gpu_kind=gpu_kind)
    findings += _fp64(models, gpu_usable=gpu_usable)
    findings += _debug_modes(flags, cuda_launch_blocking=cuda_launch_blocking)
    findings += worker_findings(loaders, shm_bytes=shm_bytes, hosting=hosting)
    return findings


def _placement(notebook: dict, models: list[dict], *, gpu_usable: bool, target: str) -> list[Finding]:
    findings = []
    optimizers = _of(notebook, "optimizer")
    for m in models:
        name = m["name"]
        if gpu_usable and m["devices"] == ["cpu"] and m["param_count"] > MODEL_MIN_PARAMS:
            fix = [f'{name} = {name}.to("{target}")  # moves the parameters in place; optimizers follow them']
            stale = [o["name"] for o in optimizers if o["state_devices"] and "cpu" in o["param_devices"]]
            fix += [MOVE_STATE.format(o) for o in stale]
            headline = f"Model `{name}` ({m['param_count']:,} parameters) is on the CPU, not the GPU."
            evidence = {"variable": name, "param_count": m["param_count"], "devices": m["devices"]}
            findings.append(_usage("MODEL_ON_CPU", "warn", headline, evidence, fix, TUNING_GUIDE))
    for obj in [*models, *optimizers]:
        devices = obj["devices"] if obj["kind"] == "module" else obj["param_devices"]
        if len(devices) > 1:
            findings.append(_mixed(obj, devices, target))
    for o in optimizers:
        stray = sorted(set(o["state_devices"]) - set(o["param_devices"]))
        if stray and o["param_devices"]:
            headline = (
                f"Optimizer `{o['name']}` keeps its state on {', '.join(stray)} but its parameters are on "
                f"{', '.join(o['param_devices'])}: its next step fails or copies the state."
            )
            evidence = {"variable": o["name"], "state_devices": o["state_devices"]}
            evidence["param_devices"] = o["param_devices"]
            fix = [MOVE_STATE.format(o["name"])]
            findings.append(_usage("OPTIMIZER_DEVICE_MISMATCH", "warn", headline, evidence, fix))
    return findings


def _mixed(obj: dict, devices: list[str], target: str) -> Finding:
    name, what = obj["name"], "Model" if obj["kind"] == "module" else "Optimizer"
    evidence = {"variable": name, "devices": devices}
    if all(_accelerator(d) for d in devices):  # model parallelism (device_map="auto") is usually deliberate
        headline = f"{what} `{name}` is split over {', '.join(devices)}."
        return _usage("MIXED_DEVICES", "info", headline, evidence, [])
    if "meta" in devices and obj["kind"] == "module":
        fix = [f"# parameters on 'meta' hold no data: load real weights into `{name}`, e.g.",
               f"{name}.load_state_dict(state_dict, assign=True)"]  # fmt: skip
    elif obj["kind"] == "module":
        fix = [f'{name} = {name}.to("{target}")']
    else:
        fix = ["# move the model it optimises to one device, then re-create the optimizer"]
    headline = f"{what} `{name}` spans several devices ({', '.join(devices)}): its next step fails or copies."
    return _usage("MIXED_DEVICES", "warn", headline, evidence, fix)


def _tensor_mismatch(notebook: dict, models: list[dict]) -> list[Finding]:
    tensors = [t for t in _of(notebook, "tensor") if t["device"] != "meta" and not t.get("small")]
    if not models or not tensors:
        return []
    if all(all(_accelerator(d) for d in m["devices"]) for m in models):
        model_devices = sorted({d for m in models for d in m["devices"]})
        odd = [t for t in tensors if not _accelerator(t["device"])]
        to = model_devices[0] if len(model_devices) == 1 else "cuda"
        fix = [f'{t["name"]} = {t["name"]}.to("{to}")' for t in odd]
    elif all(m["devices"] == ["cpu"] for m in models):
        model_devices, odd = ["cpu"], [t for t in tensors if _accelerator(t["device"])]
        fix = [f'{m["name"]} = {m["name"]}.to("{odd[0]["device"]}")' for m in models] if odd else []
    else:
        return []
    if not odd:
        return []
    headline = (
        f"Tensors {_quoted([t['name'] for t in odd])} are on {odd[0]['device']} but the models are on "
        f"{', '.join(model_devices)}: each use copies them, or fails with a device mismatch."
    )
    evidence = {"tensors": {t["name"]: t["device"] for t in odd}}
    evidence["model_devices"] = {m["name"]: m["devices"] for m in models}
    return [_usage("TENSOR_DEVICE_MISMATCH", "warn", headline, evidence, fix)]


def _loader_bottlenecks(
    loaders: list[dict], gpu_models: list[dict], *, cpu_count: int | None, gpu_kind: str | None
) -> list[Finding]:
    findings = []
    for dl in loaders:
        reasons = []
        if dl["num_workers"] == 0 and cpu_count is not None and cpu_count > 2:
            reasons.append(f"num_workers=0 loads every batch in the kernel's process ({cpu_count} CPUs)")
        if not dl["pin_memory"] and gpu_kind != "mps":
            reasons.append("pin_memory=False makes every host-to-GPU copy synchronous")
        if (dl["batch_size"] or 16) < 16 and (dl["dataset_len"] or 0) >= 10_000:
            reasons.append(f"batch_size={dl['batch_size']} is tiny for {dl['dataset_len']:,} samples")
        if not reasons:
            continue
        headline = f"DataLoader `{dl['name']}` starves the GPU: {'; '.join(reasons)}."
        keys = ("num_workers", "pin_memory", "batch_size", "dataset_len")
        evidence = {"variable": dl["name"], **{k: dl[k] for k in keys}, "cpu_count": cpu_count}
        evidence["gpu_models"] = [m["name"] for m in gpu_models]
        fix = [DATAPROBE.format(dl["name"]), "import os",
               f"{dl['name']} = DataLoader(..., {LOADER_ARGS})  # keep your other arguments"]
        findings.append(_usage("DATALOADER_BOTTLENECK", "warn", headline, evidence, fix, TUNING_GUIDE))
    return findings


def _tensor_cores(notebook: dict, flags: dict, gpus: list[dict], *, gpu_kind: str | None) -> list[Finding]:
    cuda = [m["name"] for m in gpus if "float32" in m["dtypes"] and any("cuda" in d for d in m["devices"])]
    precision, allow = flags.get("float32_matmul_precision"), flags.get("matmul_allow_tf32")
    fp32 = flags.get("matmul_fp32_precision")
    tf32_on = precision in ("high", "medium") or allow is True or fp32 == "tf32"
    tf32_off = precision == "highest" or allow is False or fp32 == "ieee"
    if not cuda or gpu_kind == "mps" or tf32_on or not tf32_off:
        return []
    fix = ['torch.set_float32_matmul_precision("high")']
    if not _of(notebook, "grad_scaler"):
        fix.append('# or train in mixed precision: with torch.autocast("cuda", dtype=torch.bfloat16): ...')
    headline = f"Float32 matmuls of {_quoted(cuda)} run in full precision: Ampere+ tensor cores stay idle."
    evidence = {"float32_matmul_precision": precision, "matmul_allow_tf32": allow}
    evidence |= {"matmul_fp32_precision": fp32, "models": cuda}
    return [_usage("TENSOR_CORES_UNUSED", "warn", headline, evidence, fix, TF32_DOC)]


def _cudnn(flags: dict, models: list[dict], gpu_models: list[dict], *, gpu_kind: str | None) -> list[Finding]:
    findings = []
    affected = [m["name"] for m in models if m["has_conv"] or m["has_rnn"] or m in gpu_models]
    if flags.get("cudnn_enabled") is False and affected:
        headline = f"cuDNN is switched off, so {_quoted(affected)} fall back to slow native kernels."
        evidence = {"cudnn_enabled": False, "models": affected}
        fix = ["torch.backends.cudnn.enabled = True"]
        findings.append(_usage("CUDNN_DISABLED", "warn", headline, evidence, fix))
    conv = [m["name"] for m in gpu_models if m["has_conv"]]
    if conv and gpu_kind != "mps" and flags.get("cudnn_benchmark") is False:
        headline = f"cudnn.benchmark is off: for {_quoted(conv)} cuDNN could pick faster convolution kernels."
        fix = ["torch.backends.cudnn.benchmark = True  # best when input shapes do not change"]
        evidence = {"cudnn_benchmark": False, "models": conv}
        findings.append(_usage("CUDNN_BENCHMARK_OFF", "info", headline, evidence, fix, TUNING_GUIDE))
    return findings


def _fp64(models: list[dict], *, gpu_usable: bool) -> list[Finding]:
    findings = []
    for m in models:
        if "float64" in m["dtypes"] and (_on_gpu(m) or gpu_usable):
            name = m["name"]
            headline = f"Model `{name}` has float64 parameters, which GPUs run far slower than float32."
            evidence = {"variable": name, "dtypes": m["dtypes"], "devices": m["devices"]}
            fix = [f"{name} = {name}.float()", "# and its inputs too, e.g. torch.from_numpy(x).float()"]
            findings.append(_usage("FP64_MODEL", "warn", headline, evidence, fix))
    return findings


def _debug_modes(flags: dict, *, cuda_launch_blocking: bool) -> list[Finding]:
    checks = [  # (what, is it on, how to switch it off)
        ("anomaly_detection", flags.get("anomaly_enabled"), "torch.autograd.set_detect_anomaly(False)"),
        ("deterministic_algorithms", flags.get("deterministic_algorithms"), DETERMINISTIC_OFF),
        ("cudnn.deterministic", flags.get("cudnn_deterministic"), CUDNN_DETERMINISTIC_OFF),
        ("sync_debug_mode", bool(flags.get("sync_debug_mode")), "torch.cuda.set_sync_debug_mode(0)"),
        ("CUDA_LAUNCH_BLOCKING=1", cuda_launch_blocking, "# unset CUDA_LAUNCH_BLOCKING; restart the kernel"),
    ]
    enabled = [(label, fix) for label, value, fix in checks if value]
    if not enabled:
        return []
    labels = [label for label, _ in enabled]
    headline = f"Debugging aids that slow every step are on: {', '.join(labels)}."
    fix = [f for _, f in enabled]
    return [_usage("DEBUG_MODE_ON", "warn", headline, {"enabled": labels}, fix, TUNING_GUIDE)]


# --- the last cell's exception ---------------------------------------------------------------------------

_CUDA_INIT = [
    "Torch not compiled with CUDA enabled", "Found no NVIDIA driver", "No CUDA GPUs are available",
    "CUDA unknown error", "too old (found version", "no kernel image is available",
]  # fmt: skip
# Spawned workers import the parent's main module as __main__ or __mp_main__ (under pytest: pytest.__main__).
_MAIN_ATTRIBUTE = re.compile(r"Can't get attribute '([^']+)' on <module '[\w.]*__(?:mp_)?main__'")
_EMPTY_CACHE = {"cuda": "torch.cuda", "rocm": "torch.cuda", "xpu": "torch.xpu", "mps": "torch.mps"}


def _last(code: str, headline: str, evidence: dict, fix: list[str]) -> Finding:
    return Finding(code, "fail", headline, evidence, fix, [], LAYER_LAST_ERROR)


def last_error_findings(notebook: dict, *, gpu_usable: bool) -> list[Finding]:
    """Explain the last failed cell's exception when it is one PyTorch users meet on the way to a GPU.

    Every finding here is a fail: the cell failed, and it fails again until the fix is applied.
    """
    exc = notebook.get("last_exception")
    if not exc:
        return []
    lines = [f"{exc['type']}: {exc['message']}", *exc.get("chain", [])]
    text = "\n".join(lines)
    evidence: dict[str, Any] = {"exception": lines[0][:500], "chain": lines[1:]}
    if "Attempting to deserialize object on a CUDA device" in text:
        why = "a GPU is usable now: re-run the cell" if gpu_usable else "the diagnosis above says why"
        headline = f"torch.load met CUDA tensors in a checkpoint, but the kernel had no usable GPU ({why})."
        fix = ['obj = torch.load(path, map_location="cpu")  # loads the checkpoint onto the CPU instead']
        return [_last("TORCH_LOAD_MAP_LOCATION", headline, evidence, fix)]
    if "Cannot re-initialize CUDA in forked subprocess" in text or (
            "DataLoader worker" in text and CUDA_FORK_READ_ERROR in text):
        headline = "A forked DataLoader worker touched CUDA after the notebook had initialised it."
        fix = ["# keep CUDA out of Dataset.__getitem__ and collate_fn: call .to(device) in the training loop"]
        fix.append('loader = DataLoader(..., multiprocessing_context="spawn")  # Dataset class in a .py file')
        return [_last("CUDA_FORK_REINIT", headline, evidence, fix)]
    if mismatch := find_device_mismatch(text):
        return [_device_mismatch(notebook, mismatch, evidence)]
    if memory := _out_of_memory(text):
        return [_oom(memory, text, evidence)]
    if hit := next((needle for needle in _CUDA_INIT if needle in text), None):
        headline = (
            f"The last cell failed because PyTorch could not initialise the GPU ('{hit}'); "
            "the environment diagnosis above explains the cause."
        )
        fix = ["# apply the environment fixes above, then restart the kernel"]
        return [_last("CUDA_INIT_ERROR", headline, {**evidence, "matched": hit}, fix)]
    if match := _MAIN_ATTRIBUTE.search(text):
        cls = match.group(1)
        headline = f"DataLoader workers could not import `{cls}`, a class defined in the notebook."
        fix = [
            MOVE_DATASET.format(cls),
            f"from datasets import {cls}",
            "# or: DataLoader(..., num_workers=0)",
        ]
        return [_last("NOTEBOOK_SPAWN_PICKLING", headline, {**evidence, "class": cls}, fix)]
    return []


def _device_mismatch(notebook: dict, mismatch: DeviceMismatch, evidence: dict) -> Finding:
    devices = list(mismatch.devices)
    evidence = {**evidence, "devices": devices}
    if mismatch.argument is not None:
        evidence["argument"] = mismatch.argument

    def held(entry: dict) -> list[str]:
        return entry["devices"] if entry["kind"] == "module" else [entry["device"]]

    def on(device: str, entry: dict) -> bool:
        return any(held_on(h, device) for h in held(entry))

    models, tensors = _models(notebook), _of(notebook, "tensor")
    by_device = {d: [e["name"] for e in models + tensors if on(d, e)] for d in devices}
    evidence["variables_on_device"] = by_device
    real = [m for m in models if "meta" not in m["devices"]]
    model = next((m for m in real if _on_gpu(m)), real[0] if real else None)
    where = f"next({model['name'] if model else 'model'}.parameters()).device"
    model_devices = set(held(model)) if model else set()
    stray = [t for t in tensors if any(on(d, t) for d in devices) and t["device"] not in model_devices]
    fix = [f"{t['name']} = {t['name']}.to({where})" for t in stray if t["device"] != "meta"]
    fix = fix or [f"inputs = inputs.to({where})  # each batch"]
    if "meta" in devices:
        fix.append(
            "# tensors and modules on 'meta' hold no data: create them on a real device, or load weights"
        )
    fix.append("# tensors kept as plain module attributes: self.register_buffer(...) lets .to() move them")
    named = "; ".join(f"on {d}: {_quoted(names)}" for d, names in by_device.items() if names)
    headline = f"The last cell mixed tensors on {devices[0]} and {devices[1]} in one operation"
    headline += f" (in this notebook {named})." if named else "."
    return _last("DEVICE_MISMATCH_ERROR", headline, evidence, fix)


def _out_of_memory(text: str) -> str | None:
    """Whose memory the last error says ran out, by the table `%batchprobe` classifies with; None if not memory."""
    if (marker := find_oom_marker(text, probable=False)) is not None:
        return marker.memory
    if (device := device_out_of_memory(text)) is not None:
        return device.lower()
    return "cuda" if TORCH_OOM_TYPE in text else None  # the type name, when the message itself says less


def _oom(kind: str, text: str, evidence: dict) -> Finding:
    evidence = {**evidence, "memory": kind}
    if tried := re.search(r"[Tt]ried to allocate (\d[\d.]*\s*\w+)", text):
        evidence["tried_to_allocate"] = tried.group(1)
    fix = [
        "%gpumem --free traceback  # first: the failed cell's traceback keeps its step's tensors alive",
        "%gpumem  # who holds the rest, by name (Out, _, a kept loss's graph), and --free NAME to give it back",
        "# halve the batch size, then re-run the cell",
    ]
    if kind in _EMPTY_CACHE:
        fix.append(f"{_EMPTY_CACHE[kind]}.empty_cache()  # hands cached blocks back to the device")
    fix.append("# %batchprobe finds the largest batch size that fits")
    where = "host memory (RAM)" if kind == "cpu" else f"GPU memory ({kind})"
    return _last("OUT_OF_MEMORY", f"The last cell ran out of {where}.", evidence, fix)
