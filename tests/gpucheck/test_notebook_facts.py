"""Notebook facts gathered from real PyTorch objects on the CPU, then diagnosed like a saved snapshot."""

from __future__ import annotations

import io
import json
import multiprocessing
import pickle
import subprocess
import sys

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from jupyter_gpu.facts.notebook import gather_notebook_facts
from jupyter_gpu.gpucheck.diagnose.usage import last_error_findings, usage_findings

CPU_BUILD = not torch.backends.cuda.is_built()
TOP_KEYS = {
    "torch_imported",
    "flags",
    "objects",
    "missing_names",
    "unsupported_names",
    "unreadable",
    "last_exception",
}
FLAG_KEYS = {
    "float32_matmul_precision",
    "matmul_allow_tf32",
    "matmul_fp32_precision",
    "cudnn_allow_tf32",
    "cudnn_enabled",
    "cudnn_benchmark",
    "cudnn_deterministic",
    "anomaly_enabled",
    "deterministic_algorithms",
    "cuda_initialized",
    "sync_debug_mode",
}


def gather(ns, **kw):
    facts = gather_notebook_facts(ns, **kw)
    assert json.loads(json.dumps(facts)) == facts  # the snapshot must survive --save / --facts unchanged
    return facts


def by_name(facts):
    return {o["name"]: o for o in facts["objects"]}


def usage(facts, **kw):
    args = {
        "gpu_usable": True,
        "gpu_kind": "cuda",
        "cuda_launch_blocking": False,
        "shm_bytes": None,
        "cpu_count": 8,
    } | kw
    return usage_findings(json.loads(json.dumps(facts)), **args)


def findings(facts, code, **kw):
    return [f for f in usage(facts, **kw) if f.code == code]


def raised(fn):
    try:
        fn()
    except BaseException as exc:  # the test wants the exception object itself
        return exc
    raise AssertionError("expected an exception")


def cnn():
    return nn.Sequential(
        nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 30 * 30, 10)
    )


@pytest.fixture
def restore_torch_flags():
    saved = (
        torch.get_float32_matmul_precision(),
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.enabled,
        torch.is_anomaly_enabled(),
        torch.are_deterministic_algorithms_enabled(),
    )
    yield
    torch.set_float32_matmul_precision(saved[0])
    torch.backends.cudnn.benchmark, torch.backends.cudnn.enabled = saved[1], saved[2]
    torch.autograd.set_detect_anomaly(saved[3])
    torch.use_deterministic_algorithms(saved[4])


def test_schema_and_modules_read_from_real_layers():
    net, rnn = cnn(), nn.LSTM(8, 16)
    facts = gather({"net": net, "rnn": rnn, "lr": 0.1, "In": [], "Out": {}, "_hidden": nn.Linear(500, 500)})
    assert set(facts) == TOP_KEYS and set(facts["flags"]) == FLAG_KEYS
    assert facts["torch_imported"] is True and facts["last_exception"] is None
    assert list(by_name(facts)) == ["net", "rnn"]
    entry = by_name(facts)["net"]
    assert entry == {
        "kind": "module",
        "name": "net",
        "class": "Sequential",
        "param_count": sum(p.numel() for p in net.parameters()),
        "devices": ["cpu"],
        "dtypes": ["float32"],
        "part_of": None,
        "has_conv": True,
        "has_rnn": False,
        "has_batchnorm": True,
    }
    assert by_name(facts)["rnn"]["has_rnn"] is True and by_name(facts)["rnn"]["has_conv"] is False


def test_cpu_model_with_usable_gpu_is_reported_by_name():
    model = cnn()
    f = findings(gather({"model": model, "head": model[4], "alias": model}), "MODEL_ON_CPU")
    assert len(f) == 1 and f[0].fix[0].startswith('model = model.to("cuda")')
    facts = gather({"model": model, "head": model[4], "alias": model})
    assert by_name(facts)["head"]["part_of"] == "model" and by_name(facts)["alias"]["part_of"] == "model"


def test_meta_parameters_make_a_model_span_devices():
    net = nn.Sequential(nn.Linear(100, 200), nn.Linear(200, 10, device="meta"))
    entry = by_name(gather({"net": net}))["net"]
    assert entry["devices"] == ["cpu", "meta"]
    (f,) = findings(gather({"net": net}), "MIXED_DEVICES")
    assert f.severity == "warn" and "`net`" in f.headline and f.evidence["devices"] == ["cpu", "meta"]


def test_double_model_is_float64():
    net = nn.Linear(64, 64).double()
    assert by_name(gather({"net": net}))["net"]["dtypes"] == ["float64"]
    (f,) = findings(gather({"net": net}), "FP64_MODEL")
    assert f.fix[0] == "net = net.float()"


def test_tensors_small_ones_only_when_named():
    ns = {
        "big": torch.zeros(512, 1024),
        "small": torch.zeros(10),
        "w": torch.empty(4096, 4096, device="meta"),
    }
    objs = by_name(gather(ns))
    assert objs["big"] == {
        "kind": "tensor",
        "name": "big",
        "device": "cpu",
        "dtype": "float32",
        "shape": [512, 1024],
        "nbytes": 2 * 2**20,
    }
    assert "small" not in objs and objs["w"]["device"] == "meta"
    named = gather(ns, names=["small", "nope", "small"])
    assert [o["name"] for o in named["objects"]] == ["small"]
    assert named["missing_names"] == ["nope"]


def test_names_that_are_not_torch_objects_are_listed():
    facts = gather({"n_epochs": 10, "net": nn.Linear(2, 2)}, names=["n_epochs", "net"])
    assert facts["unsupported_names"] == ["n_epochs"] and list(by_name(facts)) == ["net"]


def _stepped(model):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, 300)).sum().backward()
    opt.step()
    return opt


def test_optimizer_after_a_real_step():
    model = nn.Linear(300, 100)
    opt = _stepped(model)
    entry = by_name(gather({"opt": opt}))["opt"]
    # Adam's 0-dim `step` counter lives on the CPU by design and is left out of state_devices.
    assert entry == {
        "kind": "optimizer",
        "name": "opt",
        "class": "Adam",
        "param_devices": ["cpu"],
        "state_devices": ["cpu"],
    }


def test_moving_a_model_after_the_optimizer_step_strands_the_state_and_the_fix_works():
    model = nn.Linear(300, 100)
    ns = {"model": model, "opt": _stepped(model)}
    # model.to("cuda") keeps parameter identity, so the optimizer follows its params but not its state;
    # swapping tensors reproduces that on the CPU with the "meta" device.
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        model.to("meta")
    finally:
        torch.__future__.set_swap_module_params_on_conversion(False)
    entry = by_name(gather(ns))["opt"]
    assert (entry["param_devices"], entry["state_devices"]) == (["meta"], ["cpu"])
    (f,) = findings(gather(ns), "OPTIMIZER_DEVICE_MISMATCH")
    assert "`opt`" in f.headline
    exec(f.fix[0], ns)  # the suggested line, run as the user would paste it
    assert by_name(gather(ns))["opt"]["state_devices"] == ["meta"]
    assert findings(gather(ns), "OPTIMIZER_DEVICE_MISMATCH") == []


class NotebookDataset(Dataset):
    __module__ = "__main__"  # what a class defined in a notebook cell reports

    def __len__(self):
        return 100

    def __getitem__(self, i):
        return torch.tensor([float(i)])


def test_dataloader_settings():
    ds = TensorDataset(torch.randn(20_000, 4), torch.randn(20_000))
    facts = gather({"train_loader": DataLoader(ds, batch_size=32, shuffle=True), "model": cnn()})
    assert by_name(facts)["train_loader"] == {
        "kind": "dataloader",
        "name": "train_loader",
        "batch_size": 32,
        "num_workers": 0,
        "pin_memory": False,
        "persistent_workers": False,
        "start_method": by_name(facts)["train_loader"]["start_method"],
        "dataset_class": "TensorDataset",
        "dataset_module": "torch.utils.data.dataset",
        "dataset_len": 20_000,
        "prefetch_factor": None,  # torch holds None without workers
        "sample_bytes": 4 * 4 + 4,  # one float32 row of 4 and one float32 target
        "cuda_initialized": False,
        "dataset_cuda": None,
        "dataset_python_containers": [],
        "notebook_defined": [],
    }
    assert by_name(facts)["train_loader"]["start_method"] in multiprocessing.get_all_start_methods()


def test_spawned_workers_and_a_notebook_dataset():
    loader = DataLoader(NotebookDataset(), batch_size=8, num_workers=2, multiprocessing_context="spawn")
    facts = gather({"loader": loader})
    entry = by_name(facts)["loader"]
    assert (entry["start_method"], entry["dataset_module"], entry["dataset_len"]) == (
        "spawn",
        "__main__",
        100,
    )
    (f,) = findings(facts, "NOTEBOOK_SPAWN_PICKLING")
    assert "`NotebookDataset`" in f.headline and "from datasets import NotebookDataset" in f.fix
    (shm,) = findings(facts, "SHM_TOO_SMALL", shm_bytes=64 * 2**20)
    assert shm.evidence["dataloaders"] == ["loader"]


def test_grad_scaler_means_amp():
    entry = by_name(gather({"scaler": torch.amp.GradScaler("cpu")}))["scaler"]
    assert entry == {
        "kind": "grad_scaler",
        "name": "scaler",
        "class": "torch.amp.grad_scaler.GradScaler",
        "enabled": True,
    }


def test_a_broken_object_is_reported_and_the_rest_still_audited():
    class Broken(nn.Module):
        def parameters(self, recurse=True):
            raise RuntimeError("weights are being streamed")

    facts = gather({"broken": Broken(), "net": nn.Linear(2, 2)})
    assert facts["unreadable"] == [{"name": "broken", "error": "RuntimeError: weights are being streamed"}]
    assert list(by_name(facts)) == ["net"]


def test_flags_read_in_process(restore_torch_flags):
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.benchmark = True
    torch.autograd.set_detect_anomaly(True)
    torch.use_deterministic_algorithms(True)
    flags = gather({})["flags"]
    assert flags["float32_matmul_precision"] == "highest" and flags["cudnn_benchmark"] is True
    assert flags["anomaly_enabled"] is True and flags["deterministic_algorithms"] is True
    assert flags["cuda_initialized"] is False and flags["sync_debug_mode"] is None
    (f,) = findings(gather({}), "DEBUG_MODE_ON")
    assert f.evidence["enabled"] == ["anomaly_detection", "deterministic_algorithms"]
    torch.set_float32_matmul_precision("high")
    assert gather({})["flags"]["matmul_allow_tf32"] is True


def test_gathering_never_touches_cuda_initialisation(monkeypatch):
    def initialises(*args, **kwargs):
        raise AssertionError("gathering notebook facts called a CUDA-initialising function")

    for name in (
        "is_available",
        "device_count",
        "mem_get_info",
        "init",
        "_lazy_init",
        "current_device",
        "get_device_properties",
        "get_sync_debug_mode",
        "synchronize",
        "memory_allocated",
    ):
        monkeypatch.setattr(torch.cuda, name, initialises)
    model = cnn()
    facts = gather(
        {"model": model, "opt": _stepped(nn.Linear(300, 1)), "loader": DataLoader(NotebookDataset())}
    )
    assert len(facts["objects"]) == 3 and facts["unreadable"] == []
    assert facts["flags"]["cuda_initialized"] is False
    monkeypatch.undo()
    assert torch.cuda.is_initialized() is False


def test_sync_debug_mode_is_read_only_once_cuda_is_initialised(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 1)
    flags = gather({})["flags"]
    assert (flags["cuda_initialized"], flags["sync_debug_mode"]) == (True, 1)


def test_gathering_without_torch_never_imports_it():
    code = (
        "import json, sys\n"
        "from jupyter_gpu.facts.notebook import gather_notebook_facts\n"
        "try:\n"
        "    raise RuntimeError('Torch not compiled with CUDA enabled')\n"
        "except RuntimeError as e:\n"
        "    exc = e\n"
        "facts = gather_notebook_facts({'x': 1}, names=['x', 'model'], last_exception=exc)\n"
        "print(json.dumps({'facts': facts, 'torch_loaded': 'torch' in sys.modules}))\n"
    )
    out = json.loads(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    )
    assert out["torch_loaded"] is False
    facts = out["facts"]
    assert (facts["torch_imported"], facts["flags"], facts["objects"]) == (False, None, [])
    assert facts["missing_names"] == ["model"]
    assert facts["last_exception"] == {
        "type": "RuntimeError",
        "message": "Torch not compiled with CUDA enabled",
        "chain": [],
    }
    assert usage(facts) == []  # nothing in the namespace to audit without torch
    assert [f.code for f in last_error_findings(facts, gpu_usable=False)] == ["CUDA_INIT_ERROR"]


# --- real exceptions from real torch operations ---------------------------------------------------------


def test_device_mismatch_from_a_real_forward_pass():
    head, x = nn.Linear(300, 10, device="meta"), torch.randn(1024, 300)
    exc = raised(lambda: head(x))
    facts = gather({"head": head, "x": x}, last_exception=exc)
    assert facts["last_exception"]["type"] == "RuntimeError"
    (f,) = last_error_findings(facts, gpu_usable=True)
    assert f.code == "DEVICE_MISMATCH_ERROR" and sorted(f.evidence["devices"]) == ["cpu", "meta"]
    assert f.evidence["variables_on_device"] == {"meta": ["head"], "cpu": ["x"]}
    assert "`head`" in f.headline and "`x`" in f.headline


def test_cpu_out_of_memory_from_a_real_allocation():
    exc = raised(lambda: torch.empty(1 << 50, dtype=torch.uint8))
    (f,) = last_error_findings(gather({}, last_exception=exc), gpu_usable=False)
    assert f.code == "OUT_OF_MEMORY" and f.evidence["memory"] == "cpu"
    assert f.evidence["tried_to_allocate"] == f"{1 << 50} bytes"


def test_cuda_out_of_memory_wrapped_by_user_code_is_found_in_the_chain():
    def step():
        try:
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                "capacity of 79.19 GiB of which 1.06 GiB is free."
            )
        except torch.OutOfMemoryError as oom:
            raise RuntimeError("training step failed") from oom

    facts = gather({}, last_exception=raised(step))
    assert facts["last_exception"]["chain"][0].startswith("torch.OutOfMemoryError: CUDA out of memory.")
    (f,) = last_error_findings(facts, gpu_usable=True)
    assert f.code == "OUT_OF_MEMORY" and f.evidence["tried_to_allocate"] == "2.00 GiB"
    assert "torch.cuda.empty_cache()  # hands cached blocks back to the device" in f.fix


@pytest.mark.skipif(not CPU_BUILD, reason="needs a CPU-only torch build")
def test_cuda_on_a_cpu_build_and_loading_a_cuda_checkpoint():
    exc = raised(lambda: torch.zeros(1, device="cuda"))
    (f,) = last_error_findings(gather({}, last_exception=exc), gpu_usable=False)
    assert f.code == "CUDA_INIT_ERROR" and f.evidence["matched"] == "Torch not compiled with CUDA enabled"
    buffer = io.BytesIO()
    torch.save(torch.ones(3), buffer)
    buffer.seek(0)
    exc = raised(lambda: torch.load(buffer, map_location="cuda"))
    (f,) = last_error_findings(gather({}, last_exception=exc), gpu_usable=False)
    assert f.code == "TORCH_LOAD_MAP_LOCATION"
    assert torch.cuda.is_initialized() is False


def test_spawn_worker_unpickling_error():
    exc = raised(lambda: pickle.loads(b"c__main__\nNotebookDataset\n."))
    (f,) = last_error_findings(gather({}, last_exception=exc), gpu_usable=True)
    assert f.code == "NOTEBOOK_SPAWN_PICKLING" and f.evidence["class"] == "NotebookDataset"
