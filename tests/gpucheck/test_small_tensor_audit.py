"""After a device-mismatch error the audit names the tensors on the wrong device, however small they are.

Real torch on the CPU: the `meta` device gives a real device-mismatch error; CUDA's wording (which this
machine cannot produce) is the message PyTorch prints, raised as is.
"""

from __future__ import annotations

import json

import pytest
import torch
from fake_machine import Machine

from jupyter_gpu.facts.notebook import MAX_SMALL_TENSORS, gather_notebook_facts
from jupyter_gpu.gpucheck.diagnose.usage import last_error_findings, usage_findings
from jupyter_gpu.torch_errors.mismatch import find_device_mismatch

CUDA_MISMATCH = (
    "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu! "
    "(when checking argument for argument mat1 in method wrapper_CUDA_addmm)"
)


def raised(fn) -> BaseException:
    try:
        fn()
    except Exception as exc:
        return exc
    raise AssertionError("expected an exception")


def gather(namespace: dict, **kw) -> dict:
    return json.loads(json.dumps(gather_notebook_facts(namespace, **kw)))  # as a saved snapshot holds it


def tensors(facts: dict) -> dict[str, dict]:
    return {o["name"]: o for o in facts["objects"] if o["kind"] == "tensor"}


def test_the_markers_read_every_wording_torch_uses():
    real = str(raised(lambda: torch.nn.Linear(3, 2)(torch.randn(4, 3, device="meta"))))
    assert find_device_mismatch(real).devices == ("cpu", "meta")
    cuda = find_device_mismatch(CUDA_MISMATCH)
    assert cuda.devices == ("cuda:0", "cpu") and cuda.involves("cpu") and not cuda.involves("meta")
    new = find_device_mismatch("but got mat1 is on cpu, different from other tensors on cuda:0 (when checking")
    assert new.argument == "mat1" and new.involves("cuda:0")
    assert find_device_mismatch("CUDA out of memory. Tried to allocate 2.00 GiB") is None


@pytest.mark.parametrize("on_meta", ["input", "model"])
def test_a_small_tensor_on_the_wrong_device_is_named_after_a_real_mismatch(on_meta):
    if on_meta == "input":
        model, x = torch.nn.Linear(3, 2), torch.randn(4, 3, device="meta")
    else:
        model, x = torch.nn.Linear(3, 2, device="meta"), torch.randn(4, 3)
    exc = raised(lambda: model(x))
    facts = gather({"model": model, "x": x}, last_exception=exc)
    assert tensors(facts)["x"] == {"kind": "tensor", "name": "x", "device": str(x.device), "dtype": "float32",
                                   "shape": [4, 3], "nbytes": 48, "small": True}
    (f,) = last_error_findings(facts, gpu_usable=False)
    assert f.code == "DEVICE_MISMATCH_ERROR" and "`x`" in f.headline and "`model`" in f.headline
    assert f.evidence["variables_on_device"][str(x.device)] == ["x"]


def test_without_a_mismatch_small_tensors_stay_out():
    x = torch.randn(4, 3)
    assert tensors(gather({"x": x})) == {}
    oom = RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert tensors(gather({"x": x}, last_exception=oom)) == {}


def test_only_the_devices_the_error_names_are_kept():
    ns = {"x": torch.randn(4, 3), "w": torch.empty(4, 3, device="meta")}
    kept = tensors(gather(ns, last_exception=RuntimeError(CUDA_MISMATCH)))
    assert list(kept) == ["x"]  # on cpu, which the message names; meta is not part of this error
    (f,) = last_error_findings(gather(ns, last_exception=RuntimeError(CUDA_MISMATCH)), gpu_usable=True)
    assert f.evidence["variables_on_device"] == {"cuda:0": [], "cpu": ["x"]}


def test_a_named_small_tensor_is_not_marked_small():
    x = torch.randn(4, 3)
    assert "small" not in tensors(gather({"x": x}, names=["x"], last_exception=RuntimeError(CUDA_MISMATCH)))["x"]


def test_small_tensors_are_capped():
    ns = {f"t{i}": torch.zeros(2) for i in range(MAX_SMALL_TENSORS + 10)}
    kept = tensors(gather(ns, last_exception=RuntimeError(CUDA_MISMATCH)))
    assert len(kept) == MAX_SMALL_TENSORS and all(t["small"] for t in kept.values())


def test_other_rules_ignore_the_small_tensors():
    facts = gather({"x": torch.randn(4, 3)}, last_exception=RuntimeError(CUDA_MISMATCH))
    model = {"kind": "module", "name": "model", "class": "Net", "param_count": 1_000_000, "devices": ["cuda:0"],
             "dtypes": ["float32"], "has_conv": False, "has_rnn": False, "has_batchnorm": False, "part_of": None}
    facts["objects"].append(model)
    args = {"gpu_usable": True, "gpu_kind": "cuda", "cuda_launch_blocking": False, "shm_bytes": None,
            "cpu_count": 8}
    assert "TENSOR_DEVICE_MISMATCH" not in [f.code for f in usage_findings(facts, **args)]
    tensors(facts)["x"].pop("small")  # the same tensor as a big one would be reported
    assert "TENSOR_DEVICE_MISMATCH" in [f.code for f in usage_findings(facts, **args)]
    (f,) = last_error_findings(facts, gpu_usable=True)
    assert f.fix[0] == "x = x.to(next(model.parameters()).device)"


# --- %gpucheck in a real IPython shell -------------------------------------------------------------------


@pytest.fixture
def ip(shell, lay_out):
    shell.run_line_magic("load_ext", "jupyter_gpu")
    shell.magics_manager.registry["GpuCheckMagics"].context = lay_out(Machine().nvidia_host().cuda_torch())
    yield shell
    shell.run_line_magic("unload_ext", "jupyter_gpu")
    for name in ("model", "x", "torch"):
        shell.user_ns.pop(name, None)


def test_gpucheck_after_a_failed_cell_names_the_small_tensor(ip):
    ip.run_cell("import torch\nmodel = torch.nn.Linear(3, 2)\nx = torch.randn(4, 3, device='meta')")
    failed = ip.run_cell("model(x)")
    assert not failed.success
    report = ip.run_line_magic("gpucheck", "-q -o")
    finding = next(f for f in report.findings if f.code == "DEVICE_MISMATCH_ERROR")
    assert "on meta: `x`" in finding.headline and "on cpu: `model`" in finding.headline


def test_gpucheck_after_a_cuda_mismatch_names_the_small_cpu_tensor(ip):
    ip.run_cell("import torch\nx = torch.randn(4, 3)")
    ip.run_cell(f"raise RuntimeError({CUDA_MISMATCH!r})")
    report = ip.run_line_magic("gpucheck", "-q -o")
    finding = next(f for f in report.findings if f.code == "DEVICE_MISMATCH_ERROR")
    assert "on cpu: `x`" in finding.headline
    assert "TENSOR_DEVICE_MISMATCH" not in report.codes
