"""The hooks that watch the user's loop run, and stop it once enough steps were profiled.

What is watched, and how (all of it removed again in `uninstall`, also after an error or Ctrl-C):
- optimizer steps: torch's global optimizer-step pre and post hooks, so every optimizer counts, whatever its name;
- DataLoader batches and the wait for them: `_BaseDataLoaderIter.__next__`, which every DataLoader iterator uses;
- forward: the outermost module call only. During the warm-up, torch's global module forward hooks find which
  modules the loop calls outermost (the model, the loss); after it only those modules' classes are watched, through
  their `__call__` (see `_narrow_module_hooks`);
- backward: `torch.autograd.backward` (which `Tensor.backward` calls) and `torch.autograd.grad`;
- host reads of tensor values (syncs on a GPU): `.item()`, `.tolist()`, `.numpy()`, `.cpu()`, `.to("cpu")`,
  `bool()`/`int()`/`float()`, printing or formatting a tensor, `nonzero`, `masked_select`, boolean-mask
  indexing and `torch.cuda.synchronize()`, each tied to the user's line that made it;
- host→device copies: `.to(...)` and `.cuda()` from a CPU tensor to a device;
- garbage collection: `gc.callbacks`.

Only the kernel's main thread is watched: DataLoader pin-memory threads and progress-bar threads run their own
work. Nothing here initialises CUDA: events are recorded only once `torch.cuda.is_initialized()`.

The cell is stopped by raising `StopProfile` (a BaseException, so a user's `except Exception` cannot swallow it)
at the first step boundary after the last step needed: in the DataLoader's `next()` (nothing of the next step has
started) or, for a loop without a DataLoader, in the next optimizer step's pre-hook (the step never begins).
"""

from __future__ import annotations

import gc
import importlib
import inspect
import linecache
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpu.gpuprofile.lift import LoopScope
from jupyter_gpu.gpuprofile.result import (
    BACKWARD,
    BATCHES,
    COPIES,
    DATA,
    FORWARD,
    GC,
    ONE_RUN,
    OPTIMIZER,
    OPTIMIZER_STEPS,
    SYNC,
)
from jupyter_gpu.gpuprofile.timeline import StepRecord, Timeline
from jupyter_gpu.kernel_torch import cuda_initialized
from jupyter_gpu.probekit.batch_structure import first_dimension
from jupyter_gpu.probekit.cpu_contention import runqueue_seconds
from jupyter_gpu.probekit.kernel_trace import (
    GpuEvent,
    GpuTimeline,
    analyse,
    gpu_events,
    keep_cupti_for_graphs,
    mark_step,
    operator_device_seconds,
    with_cpu_wait,
)
from jupyter_gpu.probekit.library_code import library_code_prefixes
from jupyter_gpu.probekit.training_state import compiled_how, named_values

TIMELINE_STEPS = 3  # steps under torch.profiler for the kernel timeline (CUDA only), after the counted step


class StopProfile(BaseException):
    """Raised at a step boundary once the profile has the steps it needs."""


@dataclass(frozen=True)
class ProfilePlan:
    warmup: int = 5
    steps: int | None = 20           # profiled steps; None with `seconds`
    seconds: float | None = None     # profile for this long instead
    census: bool = True              # one more step, counted operator by operator


@dataclass
class SyncSite:
    file: str
    line: int
    kinds: dict[str, int] = field(default_factory=dict)


class Instruments:
    """Installs the hooks, keeps the timeline, decides the step boundaries and when to stop."""

    def __init__(self, torch: Any, plan: ProfilePlan, on_step: Callable[[str], None] | None = None) -> None:
        self.torch = torch
        self.plan = plan
        self.timeline = Timeline()
        self.records: list[StepRecord] = []
        self.census: Any = None
        self.census_totals: Any = None
        self.mode: str | None = None
        self.lead_optimizer: int | None = None
        self.stepped_optimizers: set[int] = set()  # ids of every optimizer that stepped (a GAN's two)
        self.optimizer_steps = 0
        self._profiled_seconds = 0.0
        self.batches = 0
        self.stop_pending = False
        self.stopped = False
        self.completed_steps = 0
        self.sites: dict[tuple[str, int], SyncSite] = {}
        self.site_functions: dict[tuple[str, int], str] = {}  # the function each read's line is in
        self.anomaly_detection = False  # a backward ran under torch.autograd's anomaly detection
        self.loop_sites: dict[tuple[str, int], int] = {}  # where `next()` on a DataLoader was called from
        self.loop_scopes: dict[tuple[str, int], LoopScope] = {}  # of those inside a function
        # Where the loop called the lead optimizer's step (the user's line), and what a function there could see: a
        # loop with no DataLoader (`xb, yb = get_batch('train')`) is found, and lifted, from there.
        self.step_sites: dict[tuple[str, int], int] = {}
        self.step_scopes: dict[tuple[str, int], LoopScope] = {}
        # The sites whose batch an optimizer step followed (not an evaluation loop's), the sampler of each site, and
        # the batch the last optimizer step trained on.
        self.trained_sites: set[tuple[str, int]] = set()
        self.site_samplers: dict[tuple[str, int], Any] = {}
        self.trained_batch: Any = None
        self._last_site: tuple[str, int] | None = None
        self.samplers: list[Any] = []  # the index sampler of each DataLoader that yielded (names it afterwards)
        self.last_batch: Any = None
        # The last batch of each dataset that yielded, with the dataset (kept alive, so its id stays its own): what a
        # driven step's loaders yield (gpuprofile/drive.py).
        self.dataset_batches: dict[int, tuple[Any, Any]] = {}
        self.batch_size: int | None = None
        self.gpu_events: list[tuple[int, str, Any, Any]] = []  # (step index, bucket, start, end)
        self._on_step = on_step
        self._main = threading.get_ident()
        self._forward_depth = 0
        self.called_modules: dict[int, Any] = {}  # the outermost modules the loop called, by id, in order
        self._global_module_hooks: list[Any] = []
        self.narrowed = False  # the forward is watched through the outermost modules' classes, not global hooks
        self._in_read = 0
        self._undo: list[Callable[[], None]] = []
        self._library = library_code_prefixes(torch)
        self._torch_dir = os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "")
        self._open_gpu: dict[str, Any] = {}
        self.kineto: Any = None
        self.timeline_steps_left = 0
        self.kernel_events: list[GpuEvent] = []
        # (census name, inside an optimizer's step) -> its kernels' seconds per traced step
        self.operator_gpu_seconds: dict[tuple[str, bool], float] = {}
        self.kernel_window: tuple[float, float] = (0.0, 0.0)
        self.kernel_steps = 0
        # This thread's run-queue seconds when the trace started and ended (probekit/cpu_contention): the gaps the OS
        # made in the timeline.
        self.kernel_runqueue: tuple[float | None, float | None] = (None, None)
        self.timeline_error: str | None = None
        # Other host time by line: a few steps traced line by line after the profiled ones (line_time.py).
        self.line_clock: Any = None
        self.line_error: str | None = None

    def _elsewhere(self) -> bool:
        """Not the user's loop running: code torch.compile is tracing (our hooks and wrappers are traced as no-ops
        there: anything more, a thread id read, would break the user's compiled graph and change what is
        measured), or another thread (a DataLoader's pin-memory thread, a logger)."""
        return bool(self.torch.compiler.is_compiling()) or threading.get_ident() != self._main

    # -- installing ------------------------------------------------------------------------------------------
    def install(self) -> None:
        torch = self.torch
        optim = importlib.import_module("torch.optim.optimizer")
        module_hooks = importlib.import_module("torch.nn.modules.module")
        loaders = importlib.import_module("torch.utils.data.dataloader")
        for handle in (optim.register_optimizer_step_pre_hook(self._optimizer_pre),
                       optim.register_optimizer_step_post_hook(self._optimizer_post)):
            self._undo.append(handle.remove)
        self._global_module_hooks = [module_hooks.register_module_forward_pre_hook(self._forward_pre),
                                     module_hooks.register_module_forward_hook(self._forward_post, always_call=True)]
        self._undo.extend(handle.remove for handle in self._global_module_hooks)
        self._wrap(loaders._BaseDataLoaderIter, "__next__", self._next_wrapper)
        scaler = getattr(getattr(torch, "amp", None), "GradScaler", None)
        if scaler is not None:
            self._wrap(scaler, "step", self._scaler_step_wrapper)
        self._wrap(torch.autograd, "backward", lambda original: self._phase_wrapper(original, BACKWARD))
        self._wrap(torch.autograd, "grad", lambda original: self._phase_wrapper(original, BACKWARD))
        tensor = torch.Tensor
        for name, kind in ((".item()", "item"), (".tolist()", "tolist"), (".numpy()", "numpy"),
                           ("bool(tensor)", "__bool__"), ("int(tensor)", "__int__"), ("float(tensor)", "__float__"),
                           ("formatting a tensor", "__format__"), ("printing a tensor", "__repr__"),
                           (".nonzero()", "nonzero")):
            self._wrap(tensor, kind, lambda original, label=name: self._read_wrapper(original, label))
        self._wrap(tensor, "cpu", lambda original: self._read_wrapper(original, ".cpu()"))
        self._wrap(tensor, "__getitem__", self._index_wrapper)
        self._wrap(tensor, "to", self._to_wrapper)
        self._wrap(tensor, "cuda", self._to_wrapper)
        self._wrap(torch, "nonzero", lambda original: self._read_wrapper(original, "torch.nonzero"))
        self._wrap(torch, "masked_select", lambda original: self._read_wrapper(original, "torch.masked_select"))
        self._wrap(torch.cuda, "synchronize",
                   lambda original: self._read_wrapper(original, "torch.cuda.synchronize()", tensor_arg=False))
        gc.callbacks.append(self._gc_callback)
        self._undo.append(lambda: gc.callbacks.remove(self._gc_callback))
        self.timeline = Timeline()

    def uninstall(self) -> None:
        if self.line_clock is not None:
            self.line_clock.stop()
        while self._undo:
            self._undo.pop()()
        if self.census is not None:
            self._end_census()
        if self.kineto is not None:
            self._end_kernel_timeline()

    def _wrap(self, owner: Any, name: str, make: Callable[[Any], Callable[..., Any]]) -> None:
        own = name in vars(owner)
        original = vars(owner)[name] if own else getattr(owner, name)
        setattr(owner, name, make(original))

        def undo() -> None:
            if own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)  # the attribute came from a base class (torch._C.TensorBase)
        self._undo.append(undo)

    # -- step boundaries -------------------------------------------------------------------------------------
    def _boundary(self) -> None:
        self._accept(self.timeline.boundary())

    def _accept(self, record: StepRecord) -> None:
        self.completed_steps += 1  # warm-up, profiled and traced alike: what the cell ran before it was stopped
        if self.line_clock is not None and self.line_clock.active:
            if self.line_clock.boundary(sys._getframe(1)):
                self.line_clock.stop()
                self.stop_pending = True
            return
        if self.census is not None:
            self._end_census()
            if cuda_initialized(self.torch) and self.plan.census:
                self._start_kernel_timeline()
            else:
                self._start_line_clock()
            return
        if self.kineto is not None:
            mark_step(self.torch)
            self.kernel_runqueue = (self.kernel_runqueue[0], runqueue_seconds())
            self.timeline_steps_left -= 1
            if self.timeline_steps_left <= 0:
                self._end_kernel_timeline()
                self._start_line_clock()
            return
        self.records.append(record)
        warmup = self.plan.warmup
        if len(self.records) == max(warmup, 1):
            self._narrow_module_hooks()
        profiled = len(self.records) - warmup
        if self._on_step is not None:
            self._on_step(f"warm-up step {len(self.records)} of {warmup}" if profiled <= 0 else
                          f"profiled step {profiled}" + (f" of {self.plan.steps}" if self.plan.steps else ""))
        if profiled > 0:
            self._profiled_seconds += record.seconds
        if profiled > 0 and self._enough(profiled):
            if self.plan.census:
                self._start_census()
            else:
                self.stop_pending = True

    def _enough(self, profiled: int) -> bool:
        if self.plan.seconds is not None:
            return self._profiled_seconds >= self.plan.seconds  # a running sum: --seconds may profile 10,000 steps
        return profiled >= (self.plan.steps or 0)

    def finish(self) -> None:
        """The cell ended by itself: a cell with no loop is one step; a loop's unfinished last step is dropped."""
        if self.line_clock is not None:
            self.line_clock.stop()
        if self.census is not None:
            self._end_census()
        if self.kineto is not None:
            self._end_kernel_timeline()
        if not self.records and self.mode is None:
            self.mode = ONE_RUN
            self.records.append(self.timeline.boundary())

    def _start_kernel_timeline(self) -> None:
        """A few more steps under torch.profiler (CUDA activity): the kernel timeline. Any failure is reported as
        what was not measured, never as the profile's failure."""
        try:
            activity = self.torch.profiler.ProfilerActivity
            keep_cupti_for_graphs(self.torch)
            self.kineto = self.torch.profiler.profile(activities=[activity.CPU, activity.CUDA])
            self.kineto.__enter__()
            mark_step(self.torch)  # the timeline covers the steps between marks: a cell that ends mid-trace
            # The run queue is read at the marks too (kernel_trace.with_cpu_wait): the profiler's own start and end
            # are not the steps' time.
            self.kernel_runqueue = (runqueue_seconds(), None)
            self.timeline_steps_left = TIMELINE_STEPS
        except Exception as exc:  # a profiler that cannot start here (CUPTI missing): said, not raised
            self.kineto, self.stop_pending = None, True
            self.timeline_error = f"torch.profiler could not start ({type(exc).__name__}: {exc})"

    def kernel_timeline(self) -> GpuTimeline | None:
        """The traced steps' kernel timeline, less the time the OS held the host off its core, or None."""
        return with_cpu_wait(analyse(self.kernel_events, self.kernel_steps, self.kernel_window), *self.kernel_runqueue)

    def _end_kernel_timeline(self) -> None:
        profiler, self.kineto = self.kineto, None
        try:
            profiler.__exit__(None, None, None)
            trace = gpu_events(self.torch, profiler)
            self.kernel_events, self.kernel_window = trace.events, trace.window
            self.kernel_steps = trace.steps if trace.steps is not None else \
                TIMELINE_STEPS - max(self.timeline_steps_left, 0)
            counted = self.census_totals.names() if self.census_totals is not None else set()
            self.operator_gpu_seconds = operator_device_seconds(profiler, self.kernel_steps, counted)
        except Exception as exc:  # a trace torch could not give back: said, not raised
            self.timeline_error = f"the kernel trace could not be read ({type(exc).__name__}: {exc})"

    def _start_line_clock(self) -> None:
        """LINE_STEPS steps traced line by line, the last ones the profile runs: after the census and the kernel
        timeline (which a loop that ends early should still get), outside the dispatch mode and the profiler."""
        from jupyter_gpu.gpuprofile.line_time import LineClock

        clock = LineClock(self.timeline, self._library)
        self.line_error = clock.start(sys._getframe(1))
        if self.line_error is None:
            self.line_clock = clock
        else:
            self.stop_pending = True

    def _start_census(self) -> None:
        from jupyter_gpu.gpuprofile.census import make_census

        self.census = make_census(self.torch, cuda_timing=cuda_initialized(self.torch),
                                  counting=lambda: self.timeline.top() != DATA,
                                  in_optimizer=lambda: self.timeline.inside(OPTIMIZER))
        self.census.__enter__()

    def _end_census(self) -> None:
        census, self.census = self.census, None
        census.__exit__(None, None, None)
        if cuda_initialized(self.torch):
            self.torch.cuda.synchronize()
        self.census_totals = census.totals()

    # -- optimizer -------------------------------------------------------------------------------------------
    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._elsewhere():
            return
        if self.stop_pending and id(optimizer) == self.lead_optimizer:
            self.stopped = True
            raise StopProfile
        if self.lead_optimizer in (None, id(optimizer)) and not self.batches:
            self._note_step_site()
        self._enter_phase(OPTIMIZER)

    def _note_step_site(self) -> None:
        """The user's line that called the optimizer step, for a loop that takes no DataLoader batch."""
        frame = self._user_frame(sys._getframe(2))
        site = (frame.f_code.co_filename, frame.f_lineno)
        if site not in self.step_sites and frame.f_locals is not frame.f_globals:
            self.step_scopes[site] = LoopScope(dict(frame.f_locals), frame.f_globals)
        self.step_sites[site] = self.step_sites.get(site, 0) + 1

    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._elsewhere():
            return
        self._leave_phase(OPTIMIZER)
        self._stepped(optimizer)

    def _scaler_step_wrapper(self, original: Any) -> Callable[..., Any]:
        instruments = self

        def step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            if instruments._elsewhere():
                return original(scaler, optimizer, *args, **kwargs)
            before = instruments.optimizer_steps
            result = original(scaler, optimizer, *args, **kwargs)
            if instruments.optimizer_steps == before:
                # The scaler skipped the optimizer's step (inf or NaN gradients while it finds its scale): still one
                # training step of the loop, not a batch of an evaluation loop nor of gradient accumulation.
                instruments._stepped(optimizer)
            return result
        step.__wrapped__ = original  # type: ignore[attr-defined]
        return step

    def _stepped(self, optimizer: Any) -> None:
        """An optimizer step of the loop ended (or its GradScaler skipped it)."""
        self.optimizer_steps += 1
        self.stepped_optimizers.add(id(optimizer))
        if self._last_site is not None:
            self.trained_sites.add(self._last_site)
            self.trained_batch = self.last_batch
        if self.lead_optimizer is None:
            self.lead_optimizer = id(optimizer)
            self.mode = OPTIMIZER_STEPS
            if self.records:
                # Batches were taken as steps until this first optimizer step (gradient accumulation): together
                # they were one step, the first warm-up step.
                merged = StepRecord()
                for record in (*self.records, self.timeline.boundary()):
                    _add_into(merged, record)
                self.records = []
                self._accept(merged)
                return
        if id(optimizer) == self.lead_optimizer:
            self._boundary()

    # -- DataLoader --------------------------------------------------------------------------------------------
    def _next_wrapper(self, original: Any) -> Callable[..., Any]:
        instruments = self

        def __next__(iterator: Any) -> Any:
            if instruments._elsewhere():
                return original(iterator)
            if instruments.stop_pending:
                instruments.stopped = True
                raise StopProfile
            if instruments.mode in (None, BATCHES) and instruments.lead_optimizer is None and instruments.batches:
                instruments.mode = BATCHES
                instruments._boundary()
                if instruments.stop_pending:
                    instruments.stopped = True
                    raise StopProfile
            # The user's `for` line: through tqdm (a library) and through generators that wrap the loader.
            frame = instruments._user_frame(sys._getframe(1), skip_generators=True)
            site = (frame.f_code.co_filename, frame.f_lineno)
            if site not in instruments.loop_sites and frame.f_locals is not frame.f_globals:
                # A loop inside a function (train_one_epoch): what it sees, so its body can be lifted.
                instruments.loop_scopes[site] = LoopScope(dict(frame.f_locals), frame.f_globals)
            instruments.loop_sites[site] = instruments.loop_sites.get(site, 0) + 1
            instruments.timeline.enter(DATA)
            try:
                batch = original(iterator)
            finally:
                instruments.timeline.leave()
            instruments.batches += 1
            batches = instruments.timeline.current.batches
            batches[site] = batches.get(site, 0) + 1
            by_loader = instruments.timeline.current.loader_batches
            key = (*site, id(getattr(iterator, "_dataset", iterator)))
            by_loader[key] = by_loader.get(key, 0) + 1
            instruments.last_batch = batch
            dataset = getattr(iterator, "_dataset", None)
            instruments.dataset_batches[id(dataset)] = (dataset, batch)
            instruments._last_site = site
            sampler = getattr(iterator, "_index_sampler", None)
            if sampler is not None and not any(seen is sampler for seen in instruments.samplers):
                instruments.samplers.append(sampler)
            if sampler is not None:
                instruments.site_samplers.setdefault(site, sampler)
            if instruments.batch_size is None:
                instruments.batch_size = first_dimension(batch, instruments.torch.Tensor)
            return batch
        return __next__

    # -- forward / backward ------------------------------------------------------------------------------------
    def _forward_pre(self, module: Any, args: Any) -> None:
        if not self._elsewhere():
            self._enter_forward(module)

    def _forward_post(self, module: Any, args: Any, output: Any) -> None:
        if not self._elsewhere():
            self._leave_forward()

    def _enter_forward(self, module: Any) -> None:
        self.timeline.current.module_calls += 1
        if self._forward_depth == 0:
            self.called_modules.setdefault(id(module), module)  # names the models in the plan's torch.compile line
            self._enter_phase(FORWARD)
        self._forward_depth += 1

    def _leave_forward(self) -> None:
        if self._forward_depth == 0:
            return
        self._forward_depth -= 1
        if self._forward_depth == 0:
            self._leave_phase(FORWARD)

    def _narrow_module_hooks(self) -> None:
        """After the warm-up, watch the forward through the classes of the modules the loop called outermost, not
        through global hooks. A global module hook puts every module call of every model on torch's slower call path:
        measured on a 2-core CPU, 5 µs a call and 61 calls in a small ResNet's step, 0.3 ms a step the profile would
        add to the user's; the class's `__call__` costs the same for the 2 calls that matter and nothing for the rest.
        A class attribute, not a hook on the instance: a `copy.deepcopy(model)` in the loop (keeping the best model)
        would copy an instance's hooks, and with them these instruments, into the user's copy for good.

        Left global when something was compiled: a compiled graph that inlined one of these classes' calls could be
        recompiled once its `__call__` changed, and the recompilation would land in the profiled steps."""
        modules = list(self.called_modules.values())
        classes = list(dict.fromkeys(type(module) for module in modules))
        if (not classes or self.torch.nn.Module in classes or any(compiled_how(module) for module in modules)
                or _compiled_anything()):
            return
        for handle in self._global_module_hooks:
            handle.remove()
        self._global_module_hooks = []
        for cls in classes:
            self._wrap(cls, "__call__", self._call_wrapper)
        self.narrowed = True

    def _call_wrapper(self, original: Any) -> Callable[..., Any]:
        instruments = self

        def __call__(module: Any, *args: Any, **kwargs: Any) -> Any:
            if instruments._elsewhere():
                return original(module, *args, **kwargs)
            instruments._enter_forward(module)
            try:
                return original(module, *args, **kwargs)
            finally:
                instruments._leave_forward()
        __call__.__wrapped__ = original  # type: ignore[attr-defined]
        return __call__

    def _phase_wrapper(self, original: Any, bucket: str) -> Callable[..., Any]:
        instruments = self

        def phase(*args: Any, **kwargs: Any) -> Any:
            if instruments._elsewhere():
                return original(*args, **kwargs)
            instruments._enter_phase(bucket)
            if bucket == BACKWARD and instruments.torch.is_anomaly_enabled():
                instruments.anomaly_detection = True
            if bucket == BACKWARD and args and isinstance(args[0], instruments.torch.Tensor) and args[0].numel() == 1:
                instruments.timeline.current.losses.append(args[0].detach().clone())  # the loss, read after the run
            try:
                return original(*args, **kwargs)
            finally:
                instruments._leave_phase(bucket)
        phase.__wrapped__ = original  # type: ignore[attr-defined]
        return phase

    def _enter_phase(self, bucket: str) -> None:
        self.timeline.enter(bucket)
        if cuda_initialized(self.torch) and bucket not in self._open_gpu:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            self._open_gpu[bucket] = event

    def _leave_phase(self, bucket: str) -> None:
        self.timeline.leave()
        start = self._open_gpu.pop(bucket, None)
        if start is not None:
            end = self.torch.cuda.Event(enable_timing=True)
            end.record()
            self.gpu_events.append((len(self.records), bucket, start, end))

    # -- reads of tensor values ----------------------------------------------------------------------------------
    def _read_wrapper(self, original: Any, label: str, tensor_arg: bool = True) -> Callable[..., Any]:
        instruments = self

        def read(*args: Any, **kwargs: Any) -> Any:
            if instruments._elsewhere() or instruments._in_read:
                return original(*args, **kwargs)
            site = instruments._read_site(args[0] if tensor_arg and args else None)
            if site is None:
                return original(*args, **kwargs)
            instruments._in_read += 1
            instruments.timeline.enter(SYNC)
            began = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                instruments._count_read(site, label, time.perf_counter() - began)
                instruments.timeline.leave()
                instruments._in_read -= 1
        read.__wrapped__ = original  # type: ignore[attr-defined]
        return read

    def _index_wrapper(self, original: Any) -> Callable[..., Any]:
        instruments = self
        tensor_type = self.torch.Tensor
        boolean = self.torch.bool

        def __getitem__(tensor: Any, index: Any) -> Any:
            masks = index if isinstance(index, tuple) else (index,)
            if (instruments._in_read or instruments._elsewhere()
                    or not any(isinstance(m, tensor_type) and m.dtype == boolean for m in masks)):
                return original(tensor, index)
            return instruments._read_wrapper(original, "boolean mask")(tensor, index)
        return __getitem__

    def _read_site(self, tensor: Any) -> tuple[str, int] | None:
        """The user's line behind a read, or None for a read torch makes of its own host-side values."""
        caller = sys._getframe(2)
        on_device = tensor is not None and isinstance(tensor, self.torch.Tensor) and tensor.device.type != "cpu"
        if caller.f_code.co_filename.startswith(self._torch_dir) and not on_device:
            return None  # e.g. Adam reading its CPU step counter: no wait on any device
        if self.timeline.top() == DATA:
            # The loader's own work in the main process (a Dataset's `int(torch.randint(...))`): the time is the data
            # wait's, and "keep the value on the device" is no fix for it.
            return None
        frame = self._user_frame(caller)
        site = frame.f_code.co_filename, frame.f_lineno
        self.site_functions.setdefault(site, "" if frame.f_code.co_name == "<module>" else frame.f_code.co_name)
        return site

    def _user_frame(self, start: Any, skip_generators: bool = False) -> Any:
        """The first frame from `start` outwards in the user's code (not a library's); `start` if there is none."""
        frame = start
        while frame is not None:
            code = frame.f_code
            if not code.co_filename.startswith(self._library) and not (
                    skip_generators and code.co_flags & inspect.CO_GENERATOR and frame.f_back is not None):
                return frame
            frame = frame.f_back
        return start

    def _count_read(self, site: tuple[str, int], label: str, seconds: float) -> None:
        record = self.timeline.current
        record.sync_calls[site] = record.sync_calls.get(site, 0) + 1
        record.sync_seconds[site] = record.sync_seconds.get(site, 0.0) + seconds
        entry = self.sites.setdefault(site, SyncSite(*site))
        entry.kinds[label] = entry.kinds.get(label, 0) + 1

    # -- copies ------------------------------------------------------------------------------------------------
    def _to_wrapper(self, original: Any) -> Callable[..., Any]:
        instruments = self

        def to(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            if instruments._elsewhere() or instruments._in_read:
                return original(tensor, *args, **kwargs)
            timeline = instruments.timeline
            timeline.enter(COPIES)
            began = time.perf_counter()
            moved = None
            try:
                moved = original(tensor, *args, **kwargs)
                return moved
            finally:
                source = tensor.device.type
                target = moved.device.type if moved is not None and hasattr(moved, "device") else source
                if source == "cpu" and target != "cpu":
                    record = timeline.current
                    record.copies += 1
                    record.copy_bytes += tensor.numel() * tensor.element_size()
                    non_blocking = kwargs.get("non_blocking", next((a for a in args if isinstance(a, bool)), False))
                    record.blocking_copies += 0 if non_blocking else 1
                    record.pageable_copies += 0 if _is_pinned(tensor) else 1
                    timeline.leave()
                elif source != "cpu" and target == "cpu":
                    site = instruments._read_site(tensor)
                    if site is not None:
                        instruments._count_read(site, ".to('cpu')", time.perf_counter() - began)
                    timeline.leave(SYNC)
                else:
                    timeline.leave(merge=True)
        to.__wrapped__ = original  # type: ignore[attr-defined]
        return to

    # -- garbage collection --------------------------------------------------------------------------------------
    def _gc_callback(self, phase: str, info: dict[str, Any]) -> None:
        if self._elsewhere():
            return
        if phase == "start":
            self.timeline.enter(GC)
        elif self.timeline.top() == GC:
            self.timeline.leave()

    # -- afterwards --------------------------------------------------------------------------------------------
    def sync_source(self, site: tuple[str, int]) -> str:
        return linecache.getline(site[0], site[1]).strip()


@dataclass(frozen=True)
class HookCosts:
    """What the hooks add, in seconds, measured on this machine now."""

    module_call: float  # to one module call inside a model (with global hooks: torch's slower call path too)
    bucket: float       # to one bucket a hook opens and closes (forward, backward, optimizer step, a read): the
                        # wrapper, the timeline's clock, and on CUDA the phase's pair of CUDA events


def measure_hook_costs(torch: Any, narrowed: bool, rounds: int = 30, trials: int = 5) -> HookCosts:
    """Times, bare and under the hooks as the profiled steps had them (`narrowed`: the forward watched through the
    outermost module's class), a module call inside a model and the smallest training step there is: an
    `nn.Identity` forward, `backward`, an SGD step and `.item()`. Measured apart because steps differ in both: a
    small ResNet makes 61 module calls a step and a transformer 23, each with 5 buckets. The step's hooks are
    measured whole because each bucket costs more than its hook function (a wrapper's frame walk, the step
    boundary, the loss kept); an `nn.Identity` timed alone gave a fifth of a ResNet step's measured cost. Bare and
    hooked alternate, `trials` times each, and the fastest of each is compared: measured one after the other, a
    drift of the machine's speed once made the hooked step as fast as the bare one (a 2 µs estimate)."""
    module = torch.nn.Identity()
    weight = torch.nn.Parameter(torch.ones(1))
    optimizer = torch.optim.SGD([weight], lr=0.0)

    def smallest_step() -> None:
        optimizer.zero_grad()
        loss = module(weight).sum()
        loss.backward()
        optimizer.step()
        loss.item()

    def module_call() -> None:
        module(weight)

    def timed(work: Callable[[], Any]) -> float:
        began = time.perf_counter()
        for _ in range(rounds):
            work()
        return (time.perf_counter() - began) / rounds

    smallest_step()  # the first backward and optimizer step pay one-time set-up
    fastest = {"bare call": float("inf"), "bare step": float("inf"), "call": float("inf"), "step": float("inf")}
    buckets = 4
    for _ in range(trials):
        fastest["bare call"] = min(fastest["bare call"], timed(module_call))
        fastest["bare step"] = min(fastest["bare step"], timed(smallest_step))
        scratch = Instruments(torch, ProfilePlan(warmup=10 ** 9, steps=None, seconds=None, census=False))
        scratch.install()
        try:
            if narrowed:
                scratch.called_modules[id(module)] = module
                scratch._narrow_module_hooks()
            fastest["step"] = min(fastest["step"], timed(smallest_step))
            buckets = scratch.records[-1].events if scratch.records else buckets
            scratch._forward_depth = 1  # as if inside a model's forward: counted, no bucket
            fastest["call"] = min(fastest["call"], timed(module_call))
        finally:
            scratch.uninstall()
    return HookCosts(module_call=max(fastest["call"] - fastest["bare call"], 0.0),
                     bucket=max(fastest["step"] - fastest["bare step"], 0.0) / max(buckets, 1))


def _compiled_anything() -> bool:
    """Whether torch.compile holds compiled code in this process (dynamo's record of the code it compiled, which
    `torch._dynamo.reset()` clears); True if that record cannot be read, the safe side."""
    convert_frame = sys.modules.get("torch._dynamo.convert_frame")
    if convert_frame is None:
        return False  # dynamo never loaded: nothing compiled
    try:
        return bool(convert_frame.output_codes.seen)
    except Exception:  # a torch that keeps it otherwise
        return True


def _add_into(total: StepRecord, record: StepRecord) -> None:
    total.seconds += record.seconds
    for key, value in record.buckets.items():
        total.buckets[key] = total.buckets.get(key, 0.0) + value
    for site, calls in record.sync_calls.items():
        total.sync_calls[site] = total.sync_calls.get(site, 0) + calls
    for site, seconds in record.sync_seconds.items():
        total.sync_seconds[site] = total.sync_seconds.get(site, 0.0) + seconds
    total.copies += record.copies
    total.copy_bytes += record.copy_bytes
    total.pageable_copies += record.pageable_copies
    total.blocking_copies += record.blocking_copies
    total.events += record.events
    total.module_calls += record.module_calls
    for site, batches in record.batches.items():
        total.batches[site] = total.batches.get(site, 0) + batches
    for key, batches in record.loader_batches.items():
        total.loader_batches[key] = total.loader_batches.get(key, 0) + batches
    total.losses.extend(record.losses)


def _is_pinned(tensor: Any) -> bool:
    try:
        return bool(tensor.is_pinned())
    except RuntimeError:
        return False


def loaders_seen(namespace: dict[str, Any], samplers: list[Any], loader_type: type) -> list[str]:
    """The notebook's names for the DataLoaders that yielded batches, in the order of `samplers`. An iterator keeps
    no reference to its loader, but it shares the loader's index sampler (`DataLoader._index_sampler`)."""
    named: list[tuple[int, str]] = []
    seen: set[int] = set()
    for name, value in named_values(namespace):  # `train_loader`, or a trainer's `trainer.train_loader`
        # A loader inside a dict (`loaders['train']`) is not named: the probes take a variable or attribute path.
        if isinstance(value, loader_type) and id(value) not in seen and "[" not in name:
            seen.add(id(value))
            try:
                sampler = value._index_sampler
            except AttributeError:
                continue
            position = next((i for i, seen in enumerate(samplers) if seen is sampler), None)
            if position is not None:
                named.append((position, name))
    return [name for _, name in sorted(named, key=lambda pair: pair[0])]
