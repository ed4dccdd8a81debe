"""The GPU's kernel timeline over a few steps: how busy it was, why it was idle, how many kernels a step launches and
how long they run, and each operator's kernel time; read from a torch.profiler trace (`gpu_events`,
`operator_device_seconds`, `trace_kernels`) and analysed in plain Python (the events as seconds on one clock).
`%%gpuprofile` traces a few steps of the loop; `%speedprobe` one call of its step, to tell a launch-bound step.

What counts as the device's work: kernels, memcpys and memsets. Not the GPU user-annotation spans kineto draws for
every `record_function` (`Optimizer.step#...`, the DataLoader's `__next__`, DDP's forward, the user's own) from its
first kernel's start to its last kernel's end: they come back CUDA-typed beside the kernels, and counted as work
they filled every host gap inside an optimizer step (torch leaves them out of its own device totals too:
`not evt.is_user_annotation`, pytorch#130730). Not the CUDA-typed synchronisation records either.

Idle time is split as Holistic Trace Analysis splits it (`_analyze_idle_time_for_stream`), per stream: the gap before
a kernel is **host wait** when the CPU had not yet started launching it when the stream's previous kernel ended (the
host could not keep up), else **kernel wait** when the gap is under 30 µs (launch overhead between consecutive
kernels: CUDA graphs remove it), else **other** (waits between streams, events). Host wait is split once more, by
what the host did: where it launched the kernel within `launch_spacing` of launching the one before (the host's own
pace on that stream: 200 µs, or 15 times its median spacing where a loaded host launches slower, never past 2 ms),
it was busy launching (**launch wait**: dispatch and launch overhead, which fusion and CUDA graphs remove); a longer
stretch between two launches is host time outside the launches (making batches, augmenting on the CPU, metrics), which
CUDA graphs do not touch. A step is launch-bound only by the first kind. Busy time is the union of every kernel on
the device, so two streams running at once count once.

The trace is taken under torch.profiler, which records every operator on the host and so slows the host, not the
kernels: on the H200 a ResNet step of 12.3 ms took about 40 ms traced, and the GPU waited 30 ms of it. So the
timeline the report shows is the trace's kernels set against a typical unprofiled step (`at_step`): busy is the
kernels' time per step over that step, and the rest of the step is idle, split as the trace split its idle time.

Step boundaries are marked in the trace (`mark_step`, a zero-length `record_function`), and the timeline covers the
completed steps only: a cell that ends while the trace runs (a validation loop after the last training step) leaves
an unfinished tail, and that tail divided by the completed steps had inflated every figure per step.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, replace
from typing import Any

from jupyter_gpu.probekit.cpu_contention import runqueue_seconds

KERNEL_WAIT_SECONDS = 30e-6  # HTA's consecutive_kernel_delay (30, in its trace's microseconds)
# Two launches closer than this on the host were launched back to back: an eager operator's dispatch and launch take
# a few to tens of µs, more under torch.profiler's host recording (on the H200 a transformer's 860 kernels came
# 62 µs apart in a 53 ms traced step). A longer stretch between two launches is host work outside them: a
# DataLoader's next(), a CPU augmentation, a metric computed on the host take milliseconds.
LAUNCH_SPACING = 200e-6
# A host that shares its CPU launches every kernel slower, not only a few: at 2 cores with two other processes busy
# the fake-CUDA MLP's median spacing went 20 -> 40 µs, and the slowest recurring one (the optimizer's Python between
# backward and step) went 230 µs -> past 400 µs in every step, which the fixed 200 µs called host work (CI, dd97784's
# successor). So the line follows the host's pace: LAUNCH_PACE times the stream's median spacing (11.5x was the
# widest recurring spacing seen unloaded), never under LAUNCH_SPACING and never past HOST_WORK_SPACING, the least a
# batch from a DataLoader or a CPU augmentation takes.
LAUNCH_PACE = 15
HOST_WORK_SPACING = 2e-3
# A launch-bound step: at least this many kernels (fewer, and one big kernel's gap says little), a median kernel
# shorter than a launch's host cost, and the GPU idle most of the step, more of that between back-to-back launches
# than outside them. %%gpuprofile's plan and %speedprobe's verdict both read `GpuTimeline.launch_bound`.
LAUNCH_BOUND_MIN_KERNELS = 20
LAUNCH_BOUND_MEDIAN_KERNEL = 20e-6
LAUNCH_BOUND_BUSY = 0.5  # the TensorBoard profiler's "GPU busy < 50%"
# The name of the zero-length host span that marks a step boundary in a trace.
STEP_MARK = "jupyter_gpu::step_boundary"
# kineto's activity types for the device's work, and what is not work.
_WORK = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
_NOT_WORK = {"gpu_user_annotation", "cuda_sync", "gpu_sync"}
# torch's record_function name for an optimizer's step: `Optimizer.step#{class}.step` (torch/optim/optimizer.py).
OPTIMIZER_SPAN = "Optimizer.step#"


@dataclass(frozen=True)
class GpuEvent:
    start: float
    end: float
    stream: int
    launched: float | None  # when the CPU started the runtime call that queued it; None when not linked
    kind: str = "kernel"     # "kernel", "memcpy" or "memset"


@dataclass(frozen=True)
class KernelTrace:
    """The device's work in a trace, the window it is judged over, and the completed steps in that window (None
    where the trace has no step marks: the caller's own count applies)."""

    events: list[GpuEvent]
    window: tuple[float, float]
    steps: int | None = None


@dataclass(frozen=True)
class GpuTimeline:
    steps: int
    window: float           # seconds the timeline covers
    busy: float             # share of the window with at least one kernel running
    host_wait: float        # seconds per step, summed over streams
    kernel_wait: float
    other_wait: float
    kernels_per_step: float
    median_kernel: float    # seconds
    traced_step: float | None = None  # seconds per step under torch.profiler, once set against an unprofiled step
    launch_wait: float = 0.0  # the part of host_wait between back-to-back launches (per step)
    # The part of outside_launches that recurs before the same launch in every step (None where the steps' launches
    # do not line up). A step's own host work (its batch, an augmentation, a metric) waits there every step; the
    # OS taking the CPU away from a loaded host stalls one launch in one step, somewhere else in the next.
    steady_outside: float | None = None
    # Seconds per step the launching thread was ready but waited for a CPU core (other processes' load; None where
    # the OS does not say). Gaps the OS made are neither launching nor the step's host work: on 2 cores shared three
    # ways the fake-CUDA MLP's host was held off its core 8-16 ms at a time, at the same launches in every step
    # (the scheduler's ticks against a step that repeats exactly), so `steady_outside` alone took them for host work.
    cpu_wait: float | None = None
    # Seconds of the window the waits are measured over: from its start (from the first kernel's, where that kernel
    # was launched before the window began) to the last kernel's end (None: all of it).
    covered: float | None = None

    @property
    def kernel_seconds(self) -> float:
        """Seconds per step with at least one kernel running."""
        return self.busy * self.window / self.steps

    @property
    def outside_launches(self) -> float:
        """Seconds per step the GPU waited while the host did something other than launching."""
        return max(0.0, self.host_wait - self.launch_wait)

    @property
    def step_host_work(self) -> float:
        """Seconds per step the GPU waited for host work the step itself does (outside_launches less the one-off
        stalls, where the steps' launches line up, and less the time the host waited for a CPU core)."""
        # The queued time is taken off the whole of outside_launches, not off the recurring part: the OS holds a
        # loaded host off its core anywhere in the step, mostly outside the few waits that recur.
        unqueued = max(0.0, self.outside_launches - (self.cpu_wait or 0.0))
        return unqueued if self.steady_outside is None else min(unqueued, self.steady_outside)

    @property
    def launch_bound(self) -> bool:
        """Many short kernels and the GPU mostly idle, waiting between launches rather than for host work outside
        them (a step that makes its own batches or augments on the CPU is host-bound, not launch-bound)."""
        return (self.kernels_per_step >= LAUNCH_BOUND_MIN_KERNELS and self.median_kernel < LAUNCH_BOUND_MEDIAN_KERNEL
                and self.busy < LAUNCH_BOUND_BUSY and self.launch_wait + self.kernel_wait > self.step_host_work)

    def at_step(self, step: float) -> GpuTimeline:
        """This timeline as an unprofiled step of `step` seconds sees it: the same kernels, the rest of the step
        idle in the trace's proportions (all of it "other" when the trace had no gap)."""
        if step <= 0:
            return self
        kernels = min(self.kernel_seconds, step)
        idle = step - kernels
        waits = self.host_wait + self.kernel_wait + self.other_wait
        share = (lambda wait: idle * wait / waits) if waits > 0 else (lambda wait: 0.0)
        return replace(self, window=step * self.steps, busy=kernels / step, host_wait=share(self.host_wait),
                       kernel_wait=share(self.kernel_wait),
                       other_wait=share(self.other_wait) if waits > 0 else idle,
                       launch_wait=share(self.launch_wait), traced_step=self.window / self.steps,
                       steady_outside=None if self.steady_outside is None else share(self.steady_outside),
                       cpu_wait=None if self.cpu_wait is None else share(self.cpu_wait),
                       covered=None if self.covered is None else self.covered * step * self.steps / self.window)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "launch_bound": self.launch_bound}


def analyse(events: list[GpuEvent], steps: int, window: tuple[float, float]) -> GpuTimeline | None:
    if not events or steps < 1 or window[1] <= window[0]:
        return None
    ordered = sorted(events, key=lambda e: e.start)
    busy, covered = 0.0, window[0]
    for event in ordered:
        start, end = max(event.start, covered), min(event.end, window[1])
        if end > start:
            busy += end - start
        covered = max(covered, event.end)
    waits = {"host": 0.0, "launch": 0.0, "kernel": 0.0, "other": 0.0}
    steady: float | None = 0.0
    head = _launched_in_window(ordered[0], window)
    for stream in {e.stream for e in events}:
        previous: GpuEvent | None = None
        previous_end = 0.0
        on_stream = [e for e in ordered if e.stream == stream]
        outside = [0.0] * len(on_stream)  # before each launch: the GPU's wait for host work other than launching
        spacing = launch_spacing(on_stream)
        if head and on_stream[0] is ordered[0]:
            # The first step's host work before its first launch (its batch, made on the host) is a wait like every
            # later step's: left out, the waits held two of three steps' batches, and a loaded host's wait for a
            # core while making the first one was in the run queue's reading and in no wait.
            outside[0] = ordered[0].start - window[0]
            waits["host"] += outside[0]
        for index, event in enumerate(on_stream):
            if previous is not None and event.start > previous_end:
                gap = event.start - previous_end
                if event.launched is not None and event.launched > previous_end:
                    waits["host"] += gap
                    if previous.launched is not None and event.launched - previous.launched <= spacing:
                        waits["launch"] += gap
                    else:
                        outside[index] = gap
                elif gap < KERNEL_WAIT_SECONDS:
                    waits["kernel"] += gap
                else:
                    waits["other"] += gap
            previous_end = event.end if previous is None else max(previous_end, event.end)
            previous = event
        steady = _add(steady, _steady_wait(outside, steps))
    length = window[1] - window[0]
    return GpuTimeline(steps=steps, window=length, busy=busy / length, host_wait=waits["host"] / steps,
                       kernel_wait=waits["kernel"] / steps, other_wait=waits["other"] / steps,
                       kernels_per_step=len(events) / steps,
                       median_kernel=statistics.median(e.end - e.start for e in events),
                       launch_wait=waits["launch"] / steps,
                       steady_outside=None if steady is None else steady / steps,
                       covered=min(window[1], max(e.end for e in events))
                       - (window[0] if head else max(window[0], ordered[0].start)))


def _launched_in_window(first: GpuEvent, window: tuple[float, float]) -> bool:
    """Whether the trace's first kernel was launched after the window began and started later: the GPU waited for
    the host from the window's start."""
    return first.launched is not None and first.launched >= window[0] and first.start > window[0]


def launch_spacing(on_stream: list[GpuEvent]) -> float:
    """The longest stretch between two launches on one stream that is still launching back to back, at this host's
    pace (the events in start order)."""
    launched = [e.launched for e in on_stream if e.launched is not None]
    spacings = [b - a for a, b in itertools.pairwise(launched) if b >= a]
    if not spacings:
        return LAUNCH_SPACING
    return min(HOST_WORK_SPACING, max(LAUNCH_SPACING, LAUNCH_PACE * statistics.median(spacings)))


def _steady_wait(outside: list[float], steps: int) -> float | None:
    """The waits before each launch that recur in every step: where each step launched the same number of kernels on
    the stream, the k-th launch's wait is the least it was over the steps (the first step's first launch has no gap
    before it, so it is judged over the others), summed over k and over the steps that have it. None where the
    launches do not line up."""
    if steps < 2 or not outside or len(outside) % steps:
        return None
    per_step = len(outside) // steps
    total = 0.0
    for k in range(per_step):
        seen = [outside[i * per_step + k] for i in range(steps) if i * per_step + k > 0]
        total += min(seen, default=0.0) * len(seen)
    return total


def _add(total: float | None, part: float | None) -> float | None:
    return None if total is None or part is None else total + part


# CUDA builds before this one crash on a trace that follows a CUDA graph capture in the same process, once CUPTI was
# torn down and lazily re-initialised (torch/profiler/profiler.py's FIXME). torch applies its workaround only when
# inductor's global `triton.cudagraphs` is set, not for `torch.compile(mode="reduce-overhead")`, which captures
# graphs through per-call options: %speedprobe's reduce-overhead trial, or the user's own compiled model.
CUPTI_REINIT_SAFE_CUDA = (12, 6)


def keep_cupti_for_graphs(torch: Any) -> bool:
    """Before a trace: on a CUDA build older than 12.6, torch's own workaround (CUPTI neither lazily re-initialised
    nor torn down), whatever inductor's config says, so that no trace follows a graph capture unprotected. Returns
    whether it applied it. Set only where unset: a user's own choice stands."""
    import os

    version = getattr(getattr(torch, "version", None), "cuda", None)
    try:
        parsed = tuple(int(part) for part in str(version).split(".")[:2])
    except ValueError:
        return False
    if version is None or parsed >= CUPTI_REINIT_SAFE_CUDA:
        return False
    os.environ.setdefault("DISABLE_CUPTI_LAZY_REINIT", "1")
    os.environ.setdefault("TEARDOWN_CUPTI", "0")
    return True


def mark_step(torch: Any) -> None:
    """Marks a step boundary in the running trace: a zero-length host span that launches nothing."""
    with torch.profiler.record_function(STEP_MARK):
        pass


def _is_annotation(event: Any) -> bool:
    user = getattr(event, "is_user_annotation", None)
    return bool(user()) if callable(user) else False


def gpu_events(torch: Any, profiler: Any) -> KernelTrace:
    """The device's work in a finished torch.profiler run (kernels, memcpys, memsets; not annotation spans nor sync
    records), each with when the CPU started the runtime call that queued it (linked by correlation id), in seconds
    from the trace's first event (kineto's clock is nanoseconds since the epoch: about 1.8e18, where a float's
    seconds keep only about 0.2 µs, the length of a short kernel's rounding); and the window it is judged over:
    between the first and the last step mark where the trace has two or more (the work launched after the last
    mark is an unfinished step's, left out), else the whole trace."""
    events = profiler.profiler.kineto_results.events()
    if not events:
        return KernelTrace([], (0.0, 0.0))
    origin = min(e.start_ns() for e in events)

    def seconds(ns: int) -> float:
        return (ns - origin) / 1e9

    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    launches = {e.correlation_id(): e.start_ns() for e in events
                if e.device_type() == cpu and e.correlation_id() and e.name().startswith(("cuda", "cu"))}
    marks = sorted(e.start_ns() for e in events if e.device_type() == cpu and e.name() == STEP_MARK)
    found = []
    for event in events:
        if event.device_type() != cuda or _is_annotation(event) or "Sync" in event.name():
            continue
        activity = str(event.activity_type()) if hasattr(event, "activity_type") else "kernel"
        if activity in _NOT_WORK:
            continue
        launched = launches.get(event.correlation_id()) or launches.get(event.linked_correlation_id())
        if len(marks) >= 2 and (launched if launched else event.start_ns()) > marks[-1]:
            continue  # an unfinished step's
        found.append(GpuEvent(start=seconds(event.start_ns()), end=seconds(event.end_ns()),
                              stream=int(event.device_resource_id()),
                              launched=seconds(launched) if launched else None,
                              kind=_WORK.get(activity, "kernel")))
    if len(marks) >= 2:
        end = max([seconds(marks[-1]), *(e.end for e in found)])
        return KernelTrace(found, (seconds(marks[0]), end), steps=len(marks) - 1)
    return KernelTrace(found, (0.0, seconds(max(e.end_ns() for e in events))))


def operator_key(qualified: str) -> str:
    """The name the operator census and the operator table use: aten's operators by their bare name ("mm"), those
    of any other namespace with it ("flash_attn::fwd", "torchvision::nms"), as their kernels are told apart."""
    return qualified.removeprefix("aten::")


def operator_device_seconds(profiler: Any, steps: int, counted: Collection[str]) -> dict[tuple[str, bool], float]:
    """Each counted operator's kernel time per step in a finished torch.profiler run, keyed by its census name and
    whether it ran inside an optimizer's step (torch's `Optimizer.step#...` span). `counted`: the names the census
    counted. torch's device time is inclusive, and the census sees each call once at the outermost operator below
    autograd: `convolution` (whose kernels `cudnn_convolution` and the bias `add_` launch), `_to_copy` (its
    `copy_`), `zeros` (its `fill_`). So each kernel goes to the outermost counted operator above it, and a nested
    call is not counted again under its own name. Only the completed steps between the trace's step marks count."""
    if steps < 1:
        return {}
    events = list(profiler.events())
    marks = sorted(e.time_range.start for e in events if e.name == STEP_MARK)
    last = marks[-1] if len(marks) >= 2 else None
    found: dict[tuple[str, bool], float] = {}

    def walk(event: Any, in_optimizer: bool) -> None:
        if last is not None and event.time_range.start > last:
            return
        if event.is_user_annotation:
            in_optimizer = in_optimizer or event.name.startswith(OPTIMIZER_SPAN)
        else:
            name = operator_key(event.name)
            if name in counted:
                micros = getattr(event, "device_time_total", None)
                if micros is None:  # torch before 2.4 named it for CUDA
                    micros = getattr(event, "cuda_time_total", 0.0)
                key = (name, in_optimizer)
                found[key] = found.get(key, 0.0) + float(micros) / 1e6 / steps
                return
        for child in event.cpu_children:
            walk(child, in_optimizer)

    for event in events:
        if event.cpu_parent is None and getattr(event.device_type, "name", "") == "CPU":
            walk(event, False)
    return found


def trace_kernels(torch: Any, run: Callable[[], Any], steps: int = 1) -> GpuTimeline | None:
    """`run()` called `steps` times under torch.profiler (CPU and CUDA activity): its kernel timeline. CUDA must be
    initialised already; the caller puts back what `run` changed."""
    activity = torch.profiler.ProfilerActivity
    keep_cupti_for_graphs(torch)
    with torch.profiler.profile(activities=[activity.CPU, activity.CUDA]) as traced:
        mark_step(torch)
        # Read at the marks, not around the profiler: its start and the processing of its trace at the end are
        # CPU work outside the steps, and on a loaded host (CI's timing lane) their wait for a core, put on 3
        # steps, came to 12 ms a step against a 5 ms window and hid a 4 ms host-bound batch.
        queued = runqueue_seconds()
        for _ in range(steps):
            run()
            mark_step(torch)
        released = runqueue_seconds()
        torch.cuda.synchronize()
    trace = gpu_events(torch, traced)
    timeline = analyse(trace.events, trace.steps or steps, trace.window)
    return with_cpu_wait(timeline, queued, released)


def with_cpu_wait(timeline: GpuTimeline | None, before: float | None, after: float | None) -> GpuTimeline | None:
    """The timeline with the launching thread's wait for a CPU core over its steps (run-queue seconds read at the
    first and the last step mark), per step, counted for the part of the window the waits cover (`covered`: to the
    last kernel's end, not the host's tail after it). The thread is taken to have queued evenly over the window: the
    reading says how long, not where."""
    if timeline is None or before is None or after is None:
        return timeline
    covered = timeline.window if timeline.covered is None else timeline.covered
    queued = min(max(0.0, after - before), timeline.window) * covered / timeline.window
    return replace(timeline, cpu_wait=queued / timeline.steps)
