"""Run a compiled cell the way `%%gputime` promises: a separate first run with operators counted, warm-up,
then synchronised, repeated timing; memory, NVML utilisation and advice gathered around it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from jupyter_gpu.gputime.advice import timing_findings
from jupyter_gpu.gputime.availability import gpu_availability
from jupyter_gpu.gputime.busy import BusyWatch
from jupyter_gpu.gputime.compiled import LOOP_COUNT, LOOP_INDEX, CompiledCell
from jupyter_gpu.gputime.opcount import OpCounter, counting_overhead_per_op
from jupyter_gpu.gputime.ops import is_accelerator
from jupyter_gpu.gputime.result import GpuTimeResult, OpCounts
from jupyter_gpu.gputime.stats import summarize
from jupyter_gpu.kernel_torch import cuda_initialized, loaded_torch, torch_uuid
from jupyter_gpu.metrics.hub import Lease
from jupyter_gpu.probekit.clock import CudaMemoryWatch, DeviceClock
from jupyter_gpu.rendering.units import format_seconds

DEFAULT_REPEAT = 7       # as `%timeit`
PROGRESS_AFTER_SECONDS = 2.0  # quicker timings finish before a progress line would help
AUTO_CALIBRATION_SHARE = 0.05  # calibrate --auto on about 5% of the budget
AUTO_MAX_LOOPS = 10_000_000


@dataclass(frozen=True)
class TimingRequest:
    label: str
    loops: int | None = None
    repeat: int | None = None
    warmup: int = 0
    auto: bool = False
    budget: float = 2.0
    count_ops: bool = True

    @property
    def repeated(self) -> bool:
        return self.auto or self.loops is not None or self.repeat is not None or self.warmup > 0


@dataclass
class TimedCell:
    result: GpuTimeResult
    value: Any  # the value of the cell's last expression on its first run, shown like %%time shows it
    interrupted: KeyboardInterrupt | None = None


def time_cell(namespace: dict[str, Any], cell: CompiledCell, request: TimingRequest,
              lease: Lease | None, progress: Callable[[str], None] | None = None) -> TimedCell:
    """Run and time the cell in `namespace`. An exception in the cell propagates with a traceback that
    starts at the cell's own frame, after every watcher has been stopped.

    `lease` is a lease on the shared sampler taken with `start=False` at `busy.SAMPLE_INTERVAL`; it is
    closed here. `progress` receives a status line during long repeated timing (and "" when done). An interrupt
    after at least one timed repeat keeps what was measured: it comes back in `TimedCell.interrupted`
    for the caller to show the partial result before re-raising it, so "Run all" still stops.
    """
    __tracebackhide__ = True  # read by IPython: the traceback shows the cell's lines, not ours
    torch_before = loaded_torch()
    cuda_before = cuda_initialized(torch_before)
    backend = lease.sampler.backend if lease is not None else None
    first_sample = lease.sampler.read_now() if lease is not None else None
    busy = BusyWatch(lease, first_sample) if lease is not None and first_sample and first_sample.devices else None
    if lease is not None and busy is None:
        lease.close()  # nothing to watch: the shared thread need not speed up
    memory = CudaMemoryWatch(torch_before)
    runner = _Runs(namespace, cell)
    if busy is not None:
        busy.start()
    try:
        counted = torch_before is not None and request.count_ops
        per_op_cost = counting_overhead_per_op(torch_before) if counted else None
        counter = OpCounter(torch_before) if counted else None
        first_wall, first_gpu = DeviceClock(torch_before).time(lambda: runner.first(counter))
        ops = counter.result(per_op_cost * sum(counter.ops.values())) if counter and per_op_cost is not None else None
        times, gpu_times, loops, repeat = [first_wall], [first_gpu], 1, 1
        interrupted: KeyboardInterrupt | None = None
        if request.repeated:
            torch = loaded_torch()  # the cell may have imported it
            clock = DeviceClock(torch, extra_sync=_other_accelerators(ops), devices=ops.cuda_devices if ops else ())
            for _ in range(request.warmup):
                clock.time(lambda: runner.loop(1))
            loops, repeat = _plan(request, clock, runner, first_wall)
            times, gpu_times, interrupted = _timed_repeats(clock, runner, loops, repeat, progress)
    except BaseException as error:
        # Re-raised as is (cause and context kept), only its traceback trimmed to the cell's frames.
        raise error.with_traceback(runner.cell_traceback(error.__traceback__))  # noqa: B904
    finally:
        runner.clean_namespace()
        if busy is not None:
            busy.stop()
    torch = loaded_torch()
    memory_use = memory.finish()
    busy_result, busy_note, throttles = (busy.result(_device_uuids(torch, memory_use)) if busy is not None
                                         else (None, _no_busy_reason(first_sample), []))
    availability = gpu_availability(torch, first_sample)
    cuda_by_cell = not cuda_before and cuda_initialized(torch)
    stats = summarize(times) if request.repeated else None
    result = GpuTimeResult(
        label=request.label, times=times, gpu_times=gpu_times, first_time=first_wall, first_gpu_time=first_gpu,
        loops=loops, repeat=repeat, warmup=request.warmup, ops=ops, ops_note=_ops_note(torch_before, request),
        memory=memory_use, busy=busy_result, busy_note=busy_note, throttle_reasons=throttles,
        findings=timing_findings(first_time=first_wall, stats=stats, ops=ops, availability=availability,
                                 busy=busy_result, throttle_reasons=throttles, cuda_initialized_by_cell=cuda_by_cell),
        context={"repeated": request.repeated, "auto": request.auto, "budget": request.budget if request.auto else None,
                 "backend": backend.name if backend is not None else None,
                 "simulated": bool(backend is not None and backend.simulated),
                 "gpu_available": availability.usable, "gpu_devices": availability.devices,
                 "torch": getattr(torch, "__version__", None), "cuda_initialized_by_cell": cuda_by_cell,
                 "interrupted": (f"interrupted after {len(times)} of {repeat} repeats"
                                 if interrupted is not None else None)},
    )
    if interrupted is not None:
        interrupted = interrupted.with_traceback(runner.cell_traceback(interrupted.__traceback__))
    return TimedCell(result=result, value=runner.value, interrupted=interrupted)


class _Runs:
    """Executes the cell's code objects in the user's namespace."""

    def __init__(self, namespace: dict[str, Any], cell: CompiledCell) -> None:
        self.namespace = namespace
        self.cell = cell
        self.value: Any = None

    def first(self, counter: OpCounter | None) -> None:
        if counter is None:
            self._once()
            return
        with counter:
            self._once()

    def _once(self) -> None:
        exec(self.cell.body, self.namespace)
        if self.cell.last_expression is not None:
            self.value = eval(self.cell.last_expression, self.namespace)

    def loop(self, loops: int) -> None:
        self.namespace[LOOP_COUNT] = range(loops)
        exec(self.cell.loop, self.namespace)

    def clean_namespace(self) -> None:
        self.namespace.pop(LOOP_COUNT, None)
        self.namespace.pop(LOOP_INDEX, None)

    def cell_traceback(self, tb: TracebackType | None) -> TracebackType | None:
        """The traceback from the cell's own frame down: the user sees their lines, not ours."""
        codes = self.cell.code_objects()
        start = tb
        while start is not None and start.tb_frame.f_code not in codes:
            start = start.tb_next
        return start if start is not None else tb


def _timed_repeats(clock: DeviceClock, runner: _Runs, loops: int, repeat: int,
                   progress: Callable[[str], None] | None) -> tuple[list[float], list[float | None],
                                                                   KeyboardInterrupt | None]:
    times: list[float] = []
    gpu_times: list[float | None] = []
    started = time.perf_counter()
    shown = False
    try:
        for done in range(1, repeat + 1):
            wall, gpu = clock.time(lambda: runner.loop(loops))
            times.append(wall / loops)
            gpu_times.append(gpu / loops if gpu is not None else None)
            elapsed = time.perf_counter() - started
            if progress is not None and done < repeat and elapsed > PROGRESS_AFTER_SECONDS:
                left = elapsed / done * (repeat - done)
                progress(f"gputime: repeat {done}/{repeat} done, {format_seconds(elapsed)} elapsed, "
                         f"about {format_seconds(left)} left")
                shown = True
    except KeyboardInterrupt as stop:
        if not times:
            raise
        return times, gpu_times, stop
    finally:
        if shown and progress is not None:
            progress("")
    return times, gpu_times, None


def _plan(request: TimingRequest, clock: DeviceClock, runner: _Runs, first_wall: float) -> tuple[int, int]:
    """(loops per repeat, repeats). `--auto` spends the budget on the timed runs, estimated cheaply:
    from the first run when it already took a noticeable share of the budget, else from calibration
    blocks of 1, 10, 100... loops (not counted) until one takes about 5% of the budget."""
    repeat = request.repeat or (DEFAULT_REPEAT if request.auto else 1)
    if not request.auto:
        return request.loops or 1, repeat
    calibration = AUTO_CALIBRATION_SHARE * request.budget
    per_run = first_wall
    if first_wall < calibration:
        loops = 1
        while True:
            wall, _ = clock.time(lambda: runner.loop(loops))  # noqa: B023 - called at once
            per_run = wall / loops
            if wall >= calibration or loops >= AUTO_MAX_LOOPS:
                break
            loops *= 10
    total = max(1, min(int(request.budget / max(per_run, 1e-9)), AUTO_MAX_LOOPS * repeat))
    if total < repeat:
        return 1, total
    return max(1, total // repeat), repeat


def _other_accelerators(ops: OpCounts | None) -> frozenset[str]:
    if ops is None:
        return frozenset()
    return frozenset(kind for kind in ops.by_device if is_accelerator(kind) and kind != "cuda")


def _device_uuids(torch: Any | None, memory: list[Any]) -> set[str] | None:
    if not memory or not cuda_initialized(torch):
        return None
    uuids = set()
    for use in memory:
        uuid = torch_uuid(torch, int(use.device.split(":")[1]))
        if uuid is not None:
            uuids.add(uuid)
    return uuids or None


def _ops_note(torch_before: Any | None, request: TimingRequest) -> str | None:
    if not request.count_ops:
        return "not counted (--no-ops)"
    if torch_before is None:
        return "not counted: torch was not imported before this cell (import it in an earlier cell)"
    return None


def _no_busy_reason(sample: Any | None) -> str | None:
    if sample is None or sample.status == "no_driver":
        return None  # no GPU here at all: nothing to say about how busy it was
    if sample.status != "ok":
        return f"not sampled: {sample.message or sample.status}"
    return "not sampled: NVML sees no GPU"
