"""One out-of-memory table: `%batchprobe`'s classifier and `%gpucheck`'s last-error rule agree on every marker."""

from __future__ import annotations

import pytest

from jupyter_gpu.batchprobe.oom import FailureKind, classify
from jupyter_gpu.gpucheck.diagnose.usage import last_error_findings
from jupyter_gpu.torch_errors.oom import OOM_MARKERS, find_oom_marker


def gpucheck_last_error(type_: str, message: str) -> list:
    exception = {"type": type_, "message": message, "chain": []}
    return last_error_findings({"torch_imported": True, "objects": [], "last_exception": exception}, gpu_usable=True)


@pytest.mark.parametrize("marker", OOM_MARKERS, ids=lambda m: m.flavour)
def test_both_features_call_each_marker_out_of_memory(marker) -> None:
    message = f"Something failed: {marker.marker} (while running a kernel)"
    failure = classify(RuntimeError(message))
    assert failure is not None and failure.kind is FailureKind.OUT_OF_MEMORY and failure.flavour == marker.flavour
    findings = gpucheck_last_error("RuntimeError", message)
    if marker.probable:
        # "usually memory" is worth shrinking a trial for, not worth telling the user it was memory.
        assert [f.code for f in findings] != ["OUT_OF_MEMORY"]
    else:
        assert [f.code for f in findings] == ["OUT_OF_MEMORY"]
        assert findings[0].evidence["memory"] == marker.memory


@pytest.mark.parametrize(("message", "memory"), [
    ("cuDNN error: CUDNN_STATUS_ALLOC_FAILED", "cuda"),
    ("cuFFT error: CUFFT_ALLOC_FAILED", "cuda"),
    ("HIP error: out of memory\nHIP kernel errors might be asynchronously reported", "rocm"),
    ("NPU out of memory. Tried to allocate 2.00 GiB", "npu"),
])
def test_gpucheck_now_explains_the_library_and_runtime_out_of_memory_errors(message: str, memory: str) -> None:
    (finding,) = gpucheck_last_error("RuntimeError", message)
    assert finding.code == "OUT_OF_MEMORY" and finding.evidence["memory"] == memory
    assert classify(RuntimeError(message)).kind is FailureKind.OUT_OF_MEMORY


def test_the_first_marker_in_table_order_wins() -> None:
    text = "CUBLAS_STATUS_NOT_INITIALIZED after CUDA out of memory"
    assert find_oom_marker(text).flavour == "CUDA caching allocator"
    assert find_oom_marker("CUBLAS_STATUS_NOT_INITIALIZED").probable
    assert find_oom_marker("CUBLAS_STATUS_NOT_INITIALIZED", probable=False) is None
