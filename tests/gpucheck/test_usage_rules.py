"""Usage and last-error rules over plain fact dicts (the JSON a saved snapshot holds)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from jupyter_gpu.gpucheck.diagnose.usage import last_error_findings, usage_findings
from jupyter_gpu.models import LAYER_LAST_ERROR, LAYER_USAGE

DEFAULT_FLAGS = {
    "float32_matmul_precision": "high",
    "matmul_allow_tf32": True,
    "matmul_fp32_precision": "none",
    "cudnn_allow_tf32": True,
    "cudnn_enabled": True,
    "cudnn_benchmark": True,
    "cudnn_deterministic": False,
    "anomaly_enabled": False,
    "deterministic_algorithms": False,
    "cuda_initialized": True,
    "sync_debug_mode": 0,
}


def module(name, devices=("cuda:0",), params=1_000_000, dtypes=("float32",), part_of=None, **has):
    return {
        "kind": "module",
        "name": name,
        "class": "Net",
        "param_count": params,
        "devices": list(devices),
        "dtypes": list(dtypes),
        "has_conv": has.get("conv", False),
        "has_rnn": has.get("rnn", False),
        "has_batchnorm": False,
        "part_of": part_of,
    }


def tensor(name, device="cpu", nbytes=64 * 2**20):
    return {
        "kind": "tensor",
        "name": name,
        "device": device,
        "dtype": "float32",
        "shape": [nbytes // 4],
        "nbytes": nbytes,
    }


def optimizer(name, params=("cuda:0",), state=("cuda:0",)):
    return {
        "kind": "optimizer",
        "name": name,
        "class": "Adam",
        "param_devices": list(params),
        "state_devices": list(state),
    }


def loader(
    name, workers=4, pin=True, start="fork", module_name="torch.utils.data.dataset", batch=64, length=50_000
):
    return {
        "kind": "dataloader",
        "name": name,
        "batch_size": batch,
        "num_workers": workers,
        "pin_memory": pin,
        "persistent_workers": workers > 0,
        "start_method": start,
        "dataset_class": "FaceDataset",
        "dataset_module": module_name,
        "dataset_len": length,
    }


def notebook(*objects, last_exception=None, **flags):
    return {
        "torch_imported": True,
        "flags": {**DEFAULT_FLAGS, **flags},
        "objects": list(objects),
        "missing_names": [],
        "unsupported_names": [],
        "unreadable": [],
        "last_exception": last_exception,
    }


def usage(nb, **kw):
    args = {
        "gpu_usable": True,
        "gpu_kind": "cuda",
        "cuda_launch_blocking": False,
        "shm_bytes": 8 * 2**30,
        "cpu_count": 8,
    } | kw
    return usage_findings(nb, **args)


def only(findings, code):
    hits = [f for f in findings if f.code == code]
    assert len(hits) == 1, [f.code for f in findings]
    return hits[0]


def codes(findings):
    return sorted(f.code for f in findings)


def test_a_well_set_up_gpu_notebook_has_no_findings():
    nb = notebook(module("net"), optimizer("opt"), loader("train_loader"), tensor("x", "cuda:0"))
    assert usage(nb) == []


def test_without_torch_only_the_environment_debug_switch_is_reported():
    nb = {"torch_imported": False, "flags": None, "objects": [], "last_exception": None}
    assert usage(nb) == []
    assert [f.code for f in usage(nb, cuda_launch_blocking=True)] == ["DEBUG_MODE_ON"]


def test_model_on_cpu_names_the_variable_and_moves_optimizer_state():
    nb = notebook(
        module("net", devices=["cpu"], params=120_000), optimizer("opt", params=["cpu"], state=["cpu"])
    )
    f = only(usage(nb), "MODEL_ON_CPU")
    assert (f.severity, f.layer) == ("warn", LAYER_USAGE)
    assert "`net`" in f.headline and "120,000" in f.headline
    assert f.fix[0].startswith('net = net.to("cuda")')
    assert f.fix[1].startswith("opt.load_state_dict(opt.state_dict())")
    assert f.evidence == {"variable": "net", "param_count": 120_000, "devices": ["cpu"]}


def test_model_on_cpu_needs_a_usable_gpu_a_real_model_and_a_top_level_name():
    assert usage(notebook(module("net", devices=["cpu"])), gpu_usable=False) == []
    assert usage(notebook(module("tiny", devices=["cpu"], params=10_000))) == []
    layer = module("fc", devices=["cpu"], part_of="net")
    assert codes(usage(notebook(module("net", devices=["cpu"]), layer))) == ["MODEL_ON_CPU"]


def test_model_on_cpu_on_a_mac_moves_to_mps():
    f = only(usage(notebook(module("net", devices=["cpu"])), gpu_kind="mps"), "MODEL_ON_CPU")
    assert f.fix[0].startswith('net = net.to("mps")')


def test_mixed_devices_cpu_and_gpu():
    f = only(usage(notebook(module("net", devices=["cpu", "cuda:0"]))), "MIXED_DEVICES")
    assert f.severity == "warn" and "`net`" in f.headline and "cpu, cuda:0" in f.headline
    assert f.evidence["devices"] == ["cpu", "cuda:0"]
    assert f.fix == ['net = net.to("cuda")']


def test_mixed_devices_with_meta_says_weights_are_missing():
    f = only(usage(notebook(module("llm", devices=["cpu", "meta"]))), "MIXED_DEVICES")
    assert "meta" in f.fix[0] and f.fix[1] == "llm.load_state_dict(state_dict, assign=True)"


def test_model_split_over_gpus_is_only_info():
    f = only(usage(notebook(module("llm", devices=["cuda:0", "cuda:1"]))), "MIXED_DEVICES")
    assert f.severity == "info"


def test_optimizer_spanning_devices_and_state_mismatch():
    nb = notebook(module("net"), optimizer("opt", params=["cpu", "cuda:0"], state=[]))
    assert "`opt`" in only(usage(nb), "MIXED_DEVICES").headline
    f = only(usage(notebook(module("net"), optimizer("opt", state=["cpu"]))), "OPTIMIZER_DEVICE_MISMATCH")
    assert f.evidence == {"variable": "opt", "state_devices": ["cpu"], "param_devices": ["cuda:0"]}
    assert f.fix[0].startswith("opt.load_state_dict(opt.state_dict())")


def test_cpu_tensors_beside_gpu_models_are_named():
    nb = notebook(module("net"), tensor("X_train", "cpu"), tensor("y", "cuda:0"), tensor("w", "meta"))
    f = only(usage(nb), "TENSOR_DEVICE_MISMATCH")
    assert "`X_train`" in f.headline and "`y`" not in f.headline
    assert f.evidence["tensors"] == {"X_train": "cpu"}
    assert f.fix == ['X_train = X_train.to("cuda:0")']


def test_gpu_tensors_beside_cpu_models_suggest_moving_the_model():
    nb = notebook(module("net", devices=["cpu"]), tensor("batch", "cuda:0"))
    f = only(usage(nb), "TENSOR_DEVICE_MISMATCH")
    assert "`batch`" in f.headline and f.fix == ['net = net.to("cuda:0")']


def test_dataloader_bottleneck_names_the_loader_and_gives_the_fast_settings():
    nb = notebook(module("net"), loader("train_loader", workers=0, pin=False))
    f = only(usage(nb), "DATALOADER_BOTTLENECK")
    assert (
        "`train_loader`" in f.headline and "num_workers=0" in f.headline and "pin_memory=False" in f.headline
    )
    # The measurement first: it runs the user's own loader and step, where the defaults below are a guess.
    assert f.fix[0] == (
        "%dataprobe train_loader --step train_step   # measures which settings help here "
        "(train_step(batch) runs one step)"
    )
    assert f.fix[1] == "import os"
    assert f.fix[2].startswith(
        "train_loader = DataLoader(..., num_workers=min(8, os.cpu_count()), "
        "pin_memory=True, persistent_workers=True)"
    )


def test_dataloader_bottleneck_reasons_depend_on_cpus_device_and_size():
    assert (
        usage(notebook(module("net", devices=["cpu"]), loader("dl", workers=0, pin=False)), gpu_usable=False)
        == []
    )
    assert usage(notebook(module("net"), loader("dl", workers=0)), cpu_count=2) == []
    assert usage(notebook(module("net", devices=["mps:0"]), loader("dl", pin=False)), gpu_kind="mps") == []
    f = only(usage(notebook(module("net"), loader("dl", batch=4, length=60_000))), "DATALOADER_BOTTLENECK")
    assert "batch_size=4" in f.headline


def test_tensor_cores_unused_when_precision_is_highest():
    nb = notebook(module("net"), float32_matmul_precision="highest", matmul_allow_tf32=False)
    f = only(usage(nb), "TENSOR_CORES_UNUSED")
    assert f.fix[0] == 'torch.set_float32_matmul_precision("high")'
    assert f.evidence["float32_matmul_precision"] == "highest" and f.evidence["models"] == ["net"]
    nb_new_api = notebook(module("net"), float32_matmul_precision=None, matmul_fp32_precision="tf32")
    assert usage(nb_new_api) == []
    assert usage(notebook(module("net", dtypes=["bfloat16"]), float32_matmul_precision="highest")) == []
    assert (
        usage(notebook(module("net", devices=["mps:0"]), float32_matmul_precision="highest"), gpu_kind="mps")
        == []
    )


def test_cudnn_disabled_and_benchmark_off():
    nb = notebook(module("cnn", devices=["cpu"], params=5_000, conv=True), cudnn_enabled=False)
    f = only(usage(nb), "CUDNN_DISABLED")
    assert "`cnn`" in f.headline and f.fix == ["torch.backends.cudnn.enabled = True"]
    info = only(usage(notebook(module("cnn", conv=True), cudnn_benchmark=False)), "CUDNN_BENCHMARK_OFF")
    assert info.severity == "info" and info.fix[0].startswith("torch.backends.cudnn.benchmark = True")
    assert usage(notebook(module("mlp"), cudnn_benchmark=False)) == []


def test_float64_model():
    f = only(usage(notebook(module("net", dtypes=["float64"]))), "FP64_MODEL")
    assert f.fix[0] == "net = net.float()" and f.evidence["dtypes"] == ["float64"]
    assert usage(notebook(module("net", devices=["cpu"], dtypes=["float64"])), gpu_usable=False) == []


def test_debug_mode_lists_what_is_on():
    nb = notebook(module("net"), anomaly_enabled=True, cudnn_deterministic=True)
    f = only(usage(nb, cuda_launch_blocking=True), "DEBUG_MODE_ON")
    assert f.evidence == {"enabled": ["anomaly_detection", "cudnn.deterministic", "CUDA_LAUNCH_BLOCKING=1"]}
    assert "torch.autograd.set_detect_anomaly(False)" in f.fix
    assert "torch.backends.cudnn.deterministic = False" in f.fix


def test_spawn_workers_cannot_import_a_notebook_dataset():
    nb = notebook(module("net"), loader("dl", start="spawn", module_name="__main__"))
    f = only(usage(nb), "NOTEBOOK_SPAWN_PICKLING")
    assert "`dl`" in f.headline and "`FaceDataset`" in f.headline
    assert "from datasets import FaceDataset" in f.fix
    assert usage(notebook(module("net"), loader("dl", start="fork", module_name="__main__"))) == []
    assert usage(notebook(module("net"), loader("dl", start="spawn", module_name="mydata"))) == []


def test_small_shm_with_workers():
    nb = notebook(module("net"), loader("dl", workers=4), loader("val_dl", workers=0))
    f = only(usage(nb, shm_bytes=64 * 2**20), "SHM_TOO_SMALL")
    assert "64 MiB" in f.headline and f.evidence["dataloaders"] == ["dl"]
    # One sample's size is unknown here: 4 workers x 512 MiB allowed each, x2 headroom.
    assert any(line.startswith("docker run --shm-size=4g ") for line in f.fix)
    assert "SHM_TOO_SMALL" not in codes(usage(nb, shm_bytes=None) + usage(nb, shm_bytes=2**30))
    no_workers = notebook(module("net"), loader("val_dl", workers=0))
    assert "SHM_TOO_SMALL" not in codes(usage(no_workers, shm_bytes=64 * 2**20))


def test_findings_from_a_replayed_snapshot_match():
    nb = notebook(module("net", devices=["cpu"]), loader("dl", workers=0, pin=False), anomaly_enabled=True)
    replayed = json.loads(json.dumps(nb))
    assert [f.to_dict() for f in usage(replayed)] == [f.to_dict() for f in usage(nb)]
    assert json.loads(json.dumps([f.to_dict() for f in usage(nb)]))


# --- last errors ---------------------------------------------------------------------------------------


def error(type_, message, chain=()):
    return {"type": type_, "message": message, "chain": list(chain)}


def last(nb, gpu_usable=True):
    found = last_error_findings(nb, gpu_usable=gpu_usable)
    assert all(f.severity == "fail" and f.layer == LAYER_LAST_ERROR for f in found)
    return found


OLD_MISMATCH = (
    "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu! "
    "(when checking argument for argument mat1 in method wrapper_CUDA_addmm)"
)
NEW_MISMATCH = (
    "Expected all tensors to be on the same device, but got mat1 is on cpu, different from other "
    "tensors on cuda:0 (when checking argument in method wrapper_CUDA_addmm)"
)


@pytest.mark.parametrize("message", [OLD_MISMATCH, NEW_MISMATCH])
def test_device_mismatch_names_devices_and_variables(message):
    nb = notebook(module("model"), tensor("inputs_cpu", "cpu"), last_exception=error("RuntimeError", message))
    (f,) = last(nb)
    assert f.code == "DEVICE_MISMATCH_ERROR"
    assert sorted(f.evidence["devices"]) == ["cpu", "cuda:0"]
    assert f.evidence["variables_on_device"] == {
        **{d: [] for d in f.evidence["devices"]},
        "cpu": ["inputs_cpu"],
        "cuda:0": ["model"],
    }
    assert "`inputs_cpu`" in f.headline and "`model`" in f.headline
    assert f.fix[0] == "inputs_cpu = inputs_cpu.to(next(model.parameters()).device)"
    if message is NEW_MISMATCH:
        assert f.evidence["argument"] == "mat1"


def test_device_mismatch_without_namespace_clues_gives_the_generic_fix():
    (f,) = last(notebook(last_exception=error("RuntimeError", NEW_MISMATCH)))
    assert f.fix[0].startswith("inputs = inputs.to(next(model.parameters()).device)")


def test_fork_reinit_and_map_location():
    fork = (
        "Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must use the "
        "'spawn' start method"
    )
    (f,) = last(notebook(last_exception=error("RuntimeError", fork)))
    assert f.code == "CUDA_FORK_REINIT" and any('multiprocessing_context="spawn"' in line for line in f.fix)
    # Reading the parent's CUDA tensor in the worker fails in the driver instead (the H200, torch 2.11): the
    # DataLoader re-raises it in the kernel with the worker's traceback.
    read = ("Caught AcceleratorError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
            "  ...\ntorch.AcceleratorError: CUDA error: initialization error\n")
    (f,) = last(notebook(last_exception=error("AcceleratorError", read)))
    assert f.code == "CUDA_FORK_REINIT"
    load = (
        "Attempting to deserialize object on a CUDA device but torch.cuda.is_available() is False. If you "
        "are running on a CPU-only machine, please use torch.load with map_location=torch.device('cpu')"
    )
    (f,) = last(notebook(last_exception=error("RuntimeError", load)), gpu_usable=False)
    assert f.code == "TORCH_LOAD_MAP_LOCATION" and 'map_location="cpu"' in f.fix[0]


@pytest.mark.parametrize(
    ("type_", "message", "memory", "cache_fix"),
    [
        (
            "torch.OutOfMemoryError",
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
            "of 79.19 GiB of which 1.06 GiB is free.",
            "cuda",
            "torch.cuda.empty_cache()",
        ),
        (
            "RuntimeError",
            "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
            "you tried to allocate 1099511627776 bytes. Error code 12",
            "cpu",
            None,
        ),
        (
            "RuntimeError",
            "MPS backend out of memory (MPS allocated: 0 bytes). Tried to allocate 256.00 MiB on "
            "shared pool.",
            "mps",
            "torch.mps.empty_cache()",
        ),
        (
            "torch.OutOfMemoryError",
            "HIP out of memory. Tried to allocate 64.00 GiB.",
            "rocm",
            "torch.cuda.empty_cache()",
        ),
        ("torch.OutOfMemoryError", "", "cuda", "torch.cuda.empty_cache()"),
    ],
)
def test_out_of_memory(type_, message, memory, cache_fix):
    (f,) = last(notebook(last_exception=error(type_, message)))
    assert f.code == "OUT_OF_MEMORY" and f.evidence["memory"] == memory
    assert any("batch size" in line for line in f.fix)
    # The traceback keeps the failed step's tensors: the first line frees them, in the notebook, without a restart.
    assert f.fix[0].startswith("%gpumem --free traceback")
    assert (
        any(line.startswith(cache_fix) for line in f.fix)
        if cache_fix
        else not any("empty_cache" in x for x in f.fix)
    )


def test_out_of_memory_found_in_the_chain():
    exc = error(
        "RuntimeError",
        "training step failed",
        ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB."],
    )
    (f,) = last(notebook(last_exception=exc))
    assert f.code == "OUT_OF_MEMORY" and f.evidence["tried_to_allocate"] == "512.00 MiB"


@pytest.mark.parametrize(
    "message",
    [
        "Torch not compiled with CUDA enabled",
        "Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed a "
        "driver from http://www.nvidia.com/Download/index.aspx",
        "No CUDA GPUs are available",
        "CUDA unknown error - this may be due to an incorrectly set up environment",
        "The NVIDIA driver on your system is too old (found version 11040).",
        "CUDA error: no kernel image is available for execution on the device",
    ],
)
def test_cuda_init_errors_point_at_the_environment_diagnosis(message):
    (f,) = last(notebook(last_exception=error("RuntimeError", message)), gpu_usable=False)
    assert f.code == "CUDA_INIT_ERROR" and "environment diagnosis above" in f.headline
    assert f.evidence["exception"] == f"RuntimeError: {message}"


@pytest.mark.parametrize(
    "message",
    [
        "Can't get attribute 'CustomDataset' on <module '__main__' (built-in)>",
        "Can't get attribute 'CustomDataset' on <module '__mp_main__' from '/opt/ipykernel_launcher.py'>",
    ],
)
def test_spawn_pickling_error_names_the_class(message):
    (f,) = last(notebook(last_exception=error("AttributeError", message)))
    assert f.code == "NOTEBOOK_SPAWN_PICKLING" and f.evidence["class"] == "CustomDataset"
    assert "from datasets import CustomDataset" in f.fix


def test_unrelated_or_no_error_gives_nothing():
    assert (
        last(notebook(last_exception=error("ValueError", "could not convert string to float: 'abc'"))) == []
    )
    assert last(notebook()) == []
    assert last({"torch_imported": False, "last_exception": None}) == []


def test_rules_never_import_torch():
    code = "import sys, jupyter_gpu.gpucheck.diagnose.usage; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
