"""Which device an operator ran on, copy directions, what waits for the GPU."""

from __future__ import annotations

import pytest

from jupyter_gpu.gputime.ops import (
    DEVICE_TO_DEVICE,
    DEVICE_TO_HOST,
    HOST_TO_DEVICE,
    copy_direction,
    is_accelerator,
    op_device_type,
    sync_reason,
)


@pytest.mark.parametrize(("inputs", "outputs", "expected"), [
    (("cuda:0", "cpu"), ("cuda:0",), "cuda"),   # CUDA add with a CPU scalar tensor runs on the GPU
    (("cpu", "cuda:1"), (), "cuda"),             # an accelerator input wins even when listed second
    (("cuda:0",), ("cpu",), "cuda"),             # `.cpu()` is GPU work
    ((), ("cuda:0",), "cuda"),                   # factory function: the output decides
    ((), ("cpu",), "cpu"),
    (("cpu",), ("cpu",), "cpu"),
    (("mps",), ("mps",), "mps"),
    ((), (), None),
])
def test_op_device_type(inputs: tuple[str, ...], outputs: tuple[str, ...], expected: str | None) -> None:
    assert op_device_type(inputs, outputs) == expected


@pytest.mark.parametrize(("source", "destination", "expected"), [
    ("cpu", "cuda:0", HOST_TO_DEVICE),
    ("cuda", "cpu", DEVICE_TO_HOST),
    ("cuda:0", "cuda:1", DEVICE_TO_DEVICE),
    ("cuda", "cuda:0", None),
    ("cuda:0", "cuda:0", None),
    ("cpu", "cpu", None),
    ("meta", "cuda:0", None),
    ("cpu", "meta", None),
    ("cuda:0", "meta", None),
])
def test_copy_direction(source: str, destination: str, expected: str | None) -> None:
    assert copy_direction(source, destination) == expected


def test_item_on_cuda_is_a_sync() -> None:
    assert sync_reason("_local_scalar_dense", ("cuda:0",)) == ".item() / float() / bool(tensor)"


def test_item_on_cpu_is_not_a_sync() -> None:
    assert sync_reason("_local_scalar_dense", ("cpu",)) is None


def test_blocking_device_to_host_copy_is_a_sync() -> None:
    assert sync_reason("_to_copy", ("cuda:0",), copy=DEVICE_TO_HOST) is not None


def test_non_blocking_device_to_host_copy_is_not_a_sync() -> None:
    assert sync_reason("_to_copy", ("cuda:0",), copy=DEVICE_TO_HOST, non_blocking=True) is None


def test_host_to_device_copy_is_not_a_sync() -> None:
    assert sync_reason("_to_copy", ("cpu",), copy=HOST_TO_DEVICE) is None


@pytest.mark.parametrize(("device", "accelerator"), [
    ("cuda:0", True), ("cuda", True), ("mps", True), ("xpu:1", True), ("cpu", False), ("meta", False),
])
def test_is_accelerator(device: str, accelerator: bool) -> None:
    assert is_accelerator(device) is accelerator
