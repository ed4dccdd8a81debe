"""The CUDA paths this machine cannot run, against a `torch.cuda` that fails as the real one does (fake_cuda.py).

Each test is a defect a read of torch's sources found: synchronising GPUs the kernel never used (creating a
context on each), timing work on the current device only, events on two devices after `set_device`, the
bfloat16 check asked of the wrong device, and `is_available()` called in a kernel that never used CUDA.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from fake_cuda import FakeCuda, FakeGpu, FakeStream, nvml_uuid

from jupyter_gpu.gputime.advice import timing_findings
from jupyter_gpu.gputime.availability import GpuAvailability
from jupyter_gpu.gputime.opcount import OpCounter
from jupyter_gpu.gputime.result import OpCounts
from jupyter_gpu.kernel_torch import context_devices
from jupyter_gpu.probekit.clock import DeviceClock, record_event
from jupyter_gpu.probekit.training_state import TrainingObjects
from jupyter_gpu.speedprobe.variants import StepSetting, why_not

MIB = 1 << 20


def four_gpus(**held: bool) -> FakeCuda:
    """Four H200s; this kernel initialised CUDA on GPU 0. `held={"gpu2": True}`: another process owns GPU 2."""
    return FakeCuda([FakeGpu(uuid=nvml_uuid(i), exclusive_elsewhere=held.get(f"gpu{i}", False)) for i in range(4)])


def on(cuda: FakeCuda) -> SimpleNamespace:
    return SimpleNamespace(cuda=cuda)


def test_timing_synchronises_only_the_gpus_this_kernel_has_a_context_on() -> None:
    cuda = four_gpus(gpu2=True)  # GPU 2 is held by another process in exclusive mode
    _, gpu = DeviceClock(on(cuda)).time(lambda: cuda.launch(5.0))
    assert cuda.contexts == {0}, "no CUDA context (hundreds of MiB each) on GPUs the notebook never used"
    assert set(cuda.synchronized) == {0}
    assert gpu == pytest.approx(0.005)


def test_a_gpu_with_memory_on_it_is_synchronised_and_timed_there() -> None:
    cuda = four_gpus()
    cuda.allocate(64 * MIB, device=1)  # the model lives on cuda:1; cuda:0 stays current
    assert context_devices(on(cuda)) == (0, 1)
    _, gpu = DeviceClock(on(cuda)).time(lambda: cuda.launch(7.0, device=1))
    assert gpu == pytest.approx(0.007), "the work ran on cuda:1, not on the current device"
    assert set(cuda.synchronized) == {0, 1} and cuda.contexts == {0, 1}


def test_a_cell_that_switches_device_is_timed_without_an_error() -> None:
    cuda = four_gpus()

    def cell() -> None:
        cuda.set_device(1)
        cuda.launch(3.0)

    _, gpu = DeviceClock(on(cuda)).time(cell)
    assert gpu is not None  # events on one device each: elapsed_time no longer mixes cuda:0 and cuda:1
    _, gpu = DeviceClock(on(cuda)).time(lambda: cuda.launch(4.0))  # the next run sees cuda:1's context
    assert gpu == pytest.approx(0.004)


def test_the_devices_the_operators_named_are_timed() -> None:
    cuda = four_gpus()
    cuda.need_context(3)  # the counted run used cuda:3 without leaving memory there
    _, gpu = DeviceClock(on(cuda), devices=(3,)).time(lambda: cuda.launch(2.0, device=3))
    assert gpu == pytest.approx(0.002)


def test_an_event_pair_is_recorded_on_the_named_device_whatever_is_current() -> None:
    cuda = four_gpus()
    cuda.need_context(1)
    ready = record_event(on(cuda), 1)
    cuda.set_device(2)  # the step switches device
    cuda.launch(6.0, device=1)
    done = record_event(on(cuda), 1)
    done.synchronize()  # elapsed_time before the end event completed raises "device not ready", as CUDA's does
    assert ready.elapsed_time(done) == pytest.approx(6.0)


def test_before_cuda_starts_nothing_is_synchronised_or_timed() -> None:
    cuda = FakeCuda(initialized=False)
    _, gpu = DeviceClock(on(cuda)).time(lambda: None)
    assert gpu is None and cuda.contexts == set() and not cuda.initialized


def test_side_streams_are_counted_and_make_the_gpu_time_a_lower_bound() -> None:
    cuda = four_gpus()
    counter = OpCounter(SimpleNamespace(cuda=cuda, Tensor=torch.Tensor))
    with counter:
        counter._note_stream(("cuda:0",))
        cuda.use_stream(FakeStream(0, 7))  # `with torch.cuda.stream(s):`
        counter._note_stream(("cuda:0",))
        counter._note_stream(("cuda:0", "cpu"))
    counts = counter.result()
    assert (counts.cuda_devices, counts.side_stream_ops) == ((0,), 2)
    findings = timing_findings(first_time=0.1, stats=None, ops=counts, availability=GpuAvailability(True, ["H200"]),
                               busy=None, throttle_reasons=[], cuda_initialized_by_cell=False)
    [bound] = [f for f in findings if f.code == "GPU_TIME_LOWER_BOUND"]
    assert "lower bound" in bound.headline and bound.evidence["operations on side streams"] == "2"


def test_no_side_stream_no_lower_bound_note() -> None:
    counts = OpCounts(by_device={"cuda": 3}, by_name={"mm": 3}, cuda_devices=(0,))
    findings = timing_findings(first_time=0.1, stats=None, ops=counts, availability=GpuAvailability(True, ["H200"]),
                               busy=None, throttle_reasons=[], cuda_initialized_by_cell=False)
    assert "GPU_TIME_LOWER_BOUND" not in [f.code for f in findings]


def test_bfloat16_is_judged_on_the_steps_gpu_not_the_current_one() -> None:
    cuda = FakeCuda([FakeGpu("NVIDIA H100", nvml_uuid(0), (9, 0)), FakeGpu("Tesla V100", nvml_uuid(1), (7, 0))])
    fake_torch = SimpleNamespace(cuda=cuda, version=SimpleNamespace(hip=None), float16=torch.float16,
                                 bfloat16=torch.bfloat16)
    model = torch.nn.Linear(2, 2)
    objects = TrainingObjects(modules=[model], optimizers=[], schedulers=[], scalers=[])
    on_v100 = StepSetting(fake_torch, objects, torch.device("cuda", 1))  # current device: the H100
    reason = why_not("amp-bf16", on_v100)
    assert reason is not None and "Tesla V100" in reason and "7.0" in reason
    assert why_not("amp-bf16", StepSetting(fake_torch, objects, torch.device("cuda", 0))) is None


def test_the_batch_probe_never_calls_is_available_in_a_kernel_without_cuda() -> None:
    from jupyter_gpu.batchprobe.runner import _budget_for

    cuda = FakeCuda(initialized=False)  # its is_available() fails the test: it would run cuInit
    fake_torch = SimpleNamespace(cuda=cuda, device=torch.device, Tensor=torch.Tensor)
    budget = _budget_for(fake_torch, 1 << 30, None)
    assert budget.device == "cpu" and not cuda.initialized


def test_an_event_rerecorded_on_another_devices_stream_fails_as_cudas_does_and_record_event_never_does_it() -> None:
    cuda = four_gpus()
    event = cuda.Event(enable_timing=True)
    event.record()  # the current device's stream: cuda:0
    cuda.set_device(1)
    with pytest.raises(RuntimeError, match="Event device 0 does not match recording stream's device 1"):
        event.record()
    # The probes' own events name their device's stream: a cell that switches device between the two is timed.
    start = record_event(on(cuda), 0)
    cuda.launch(2.0, device=0)
    end = record_event(on(cuda), 0)
    end.synchronize()
    assert start.elapsed_time(end) == pytest.approx(2.0)


def test_reading_an_event_pair_before_the_end_completed_is_not_ready_and_the_device_clock_waits_first() -> None:
    cuda = four_gpus()
    start = record_event(on(cuda), 0)
    cuda.launch(4.0)
    end = record_event(on(cuda), 0)
    with pytest.raises(RuntimeError, match="device not ready"):
        start.elapsed_time(end)
    _, gpu = DeviceClock(on(cuda)).time(lambda: cuda.launch(4.0))
    assert gpu == pytest.approx(0.004)


def test_current_stream_starts_cuda_as_the_real_one_does_so_the_clock_never_asks_for_it_first() -> None:
    cuda = FakeCuda(initialized=False)
    DeviceClock(on(cuda)).time(lambda: None)
    assert not cuda.initialized
    cuda.current_stream()
    assert cuda.initialized
