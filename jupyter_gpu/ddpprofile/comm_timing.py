"""In one rank: when each DDP bucket's gradients were ready, when its all-reduce finished, and when each backward
returned, step by step; what the step's DDP was set to; and which collective the rank is in right now (for naming a
hang).

How, with what torch.distributed gives (nothing NCCL-private):
- A communication hook sees every bucket as its gradients become ready (`GradBucket`: index, buffer, parameters)
  and returns the future DDP waits on. The rank wraps the hook the DDP runs, the default all-reduce or the user's
  own (`register_comm_hook` is wrapped, so a user's hook is timed too), stamps the bucket ready on entry and done
  in the future's callback. DDP takes one hook, registered before its first backward: where the user registered
  none, the default hook is registered at the DDP's first forward.
- `torch.autograd.backward` (what `loss.backward()` calls) is timed: DDP's reducer waits for every bucket's future
  before the backward returns, so the time from the last bucket's ready to the backward's return is the
  communication the step waited for after its backward compute (exposed); the rest of each bucket's all-reduce ran
  under the backward (overlapped).
- Steps are counted by the optimizer's step post-hook, as `%%gpuprofile` counts them.

Host clocks time gloo's CPU all-reduce, whose future completes when the data is reduced. NCCL's future completes
when the collective is queued on its stream, so on GPUs the bucket's end is read from CUDA events recorded in the
callback (on the stream the result is used on), synchronised once at the end.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpu.rendering.units import format_bytes

HASHED_BATCHES = 3
DDP_SETTINGS = ("bucket_cap_mb", "find_unused_parameters", "gradient_as_bucket_view", "static_graph",
                "broadcast_buffers")


@dataclass
class BucketTime:
    step: int
    index: int
    nbytes: int
    ready: float          # perf_counter seconds
    done: float | None = None
    start_event: Any = None
    end_event: Any = None
    kind: str = "all_reduce"  # DDP's buckets; "reduce_scatter" and "all_gather" for FSDP's collectives


# FSDP has no communication hook: its collectives are timed where it calls them, by name on torch.distributed
# (FSDP2's _fsdp_collectives looks them up at each call; FSDP1 calls the *_tensor forms). Reduce-scatters run in the
# backward as DDP's all-reduces do, and FSDP2's final backward callback waits for them, so they are read the same
# way (overlapped, exposed); all-gathers run before each forward and backward, and are shown as their time.
FSDP_COLLECTIVES = {"reduce_scatter_single": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
                    "all_gather_single": "all_gather", "all_gather_into_tensor": "all_gather"}


@dataclass
class BackwardTime:
    step: int
    start: float
    end: float


@dataclass
class InFlight:
    """What the rank is doing now: read by the status thread that names a hang."""

    step: int = 0
    collective: str | None = None
    since: float = 0.0


@dataclass
class CommRecords:
    buckets: list[BucketTime] = field(default_factory=list)
    gathers: list[BucketTime] = field(default_factory=list)  # FSDP's all-gathers
    backwards: list[BackwardTime] = field(default_factory=list)
    step_ends: list[float] = field(default_factory=list)  # perf_counter at each optimizer step's end
    settings: list[dict[str, Any]] = field(default_factory=list)  # each DDP's settings, as built
    parameters: list[dict[str, Any]] = field(default_factory=list)  # each DDP: parameter count, gradient bytes
    logging: list[dict[str, Any]] = field(default_factory=list)   # each DDP's own _get_ddp_logging_data()
    # A fingerprint of the first batches the DDP was called on: equal on every rank means every rank trained on the
    # same samples (no DistributedSampler).
    input_hashes: list[str] = field(default_factory=list)
    loaders: list[dict[str, Any]] = field(default_factory=list)  # each DataLoader's workers, sampler, dataset size
    batch_norms: int = 0       # BatchNorm layers in the DDP's module, not SyncBatchNorm
    sync_batch_norms: int = 0


class CommTimer:
    """`install()` before the training code runs, `uninstall()` after; `records` and `now` meanwhile."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.records = CommRecords()
        self.now = InFlight()
        self._lock = threading.Lock()
        self._ddps: list[Any] = []
        self._undo: list[Any] = []

    # -- installing --------------------------------------------------------------------------------------------

    def install(self) -> None:
        torch = self.torch
        from torch.nn.parallel import DistributedDataParallel as DDP

        timer = self
        original_forward = DDP.forward
        original_register = DDP.register_comm_hook
        original_backward = torch.autograd.backward

        def forward(ddp: Any, *args: Any, **kwargs: Any) -> Any:
            if not getattr(ddp, "_jupyter_gpu_timed", False):
                timer._adopt(ddp, original_register)
            if len(timer.records.input_hashes) < HASHED_BATCHES:
                timer.records.input_hashes.append(_fingerprint(timer.torch, args, kwargs))
            timer._in("forward")
            try:
                return original_forward(ddp, *args, **kwargs)
            finally:
                timer._out()

        def register_comm_hook(ddp: Any, state: object, hook: Any) -> None:
            ddp._jupyter_gpu_user_hook = True
            original_register(ddp, state, timer._timed(hook))

        def backward(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            timer._in("backward (its all-reduce included)")
            try:
                return original_backward(*args, **kwargs)
            finally:
                timer._out()
                timer.records.backwards.append(BackwardTime(timer.now.step, start, time.perf_counter()))

        from torch.utils.data import DataLoader

        original_loader_init = DataLoader.__init__

        def loader_init(loader: Any, *args: Any, **kwargs: Any) -> None:
            original_loader_init(loader, *args, **kwargs)
            timer.records.loaders.append(_loader_facts(loader))

        DDP.forward = forward
        DDP.register_comm_hook = register_comm_hook
        DataLoader.__init__ = loader_init
        torch.autograd.backward = backward
        from torch.optim.optimizer import register_optimizer_step_post_hook

        handle = register_optimizer_step_post_hook(self._stepped)
        dist = torch.distributed
        for name, kind in FSDP_COLLECTIVES.items():
            original = getattr(dist, name, None)
            if original is not None:
                setattr(dist, name, self._timed_collective(original, kind))
                self._undo.append(lambda name=name, original=original: setattr(dist, name, original))
        self._undo += [lambda: setattr(DDP, "forward", original_forward),
                      lambda: setattr(DDP, "register_comm_hook", original_register),
                      lambda: setattr(torch.autograd, "backward", original_backward),
                      lambda: setattr(DataLoader, "__init__", original_loader_init), handle.remove]

    def uninstall(self) -> None:
        for undo in reversed(self._undo):
            undo() if callable(undo) else None
        self._undo = []
        self.records.logging = [_logging_data(ddp) for ddp in self._ddps]
        self._read_events()

    # -- what each piece records -------------------------------------------------------------------------------

    def _adopt(self, ddp: Any, register: Any) -> None:
        """A DDP seen for the first time: its settings, its parameters, every iteration's own stats, and our timed
        default hook where the user registered none."""
        ddp._jupyter_gpu_timed = True
        self._ddps.append(ddp)
        self.records.settings.append(_settings(ddp))
        norms = self.torch.nn.modules.batchnorm
        for module in ddp.module.modules():
            if isinstance(module, norms.SyncBatchNorm):
                self.records.sync_batch_norms += 1
            elif isinstance(module, norms._BatchNorm):
                self.records.batch_norms += 1
        grads = [p for p in ddp.module.parameters() if p.requires_grad]
        self.records.parameters.append({"count": len(grads),
                                        "bytes": sum(p.numel() * p.element_size() for p in grads)})
        # DDP's own averages over every iteration, not 1 in 100; a prototype API, absent or changed in some torch
        # versions, and only a cross-check.
        with contextlib.suppress(Exception):
            ddp._set_ddp_runtime_logging_sample_rate(1)
        if not getattr(ddp, "_jupyter_gpu_user_hook", False) and not getattr(ddp, "_comm_hooks", []):
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            register(ddp, ddp.process_group, self._timed(allreduce_hook))

    def _timed(self, hook: Any) -> Any:
        timer = self

        # No annotations: DDP checks a hook's `bucket` and return annotations, and this module's are strings.
        def timed_hook(state, bucket):  # type: ignore[no-untyped-def]
            buffer = bucket.buffer()
            record = BucketTime(step=timer.now.step, index=bucket.index(),
                                nbytes=buffer.numel() * buffer.element_size(), ready=time.perf_counter())
            on_gpu = buffer.is_cuda
            if on_gpu:
                record.start_event = timer.torch.cuda.Event(enable_timing=True)
                record.start_event.record()
            timer._in(f"all_reduce (DDP bucket {record.index}, {format_bytes(record.nbytes)})")
            future = hook(state, bucket)

            def done(finished: Any) -> Any:
                record.done = time.perf_counter()
                if on_gpu:
                    record.end_event = timer.torch.cuda.Event(enable_timing=True)
                    record.end_event.record()
                return finished.value()

            with timer._lock:
                timer.records.buckets.append(record)
            return future.then(done)

        timed_hook.__qualname__ = getattr(hook, "__qualname__", "hook")  # what DDP's logger names
        timed_hook.__name__ = getattr(hook, "__name__", "hook")
        return timed_hook

    def _timed_collective(self, collective: Any, kind: str) -> Any:
        timer = self

        def timed(output: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
            tensor = input if kind == "reduce_scatter" else output
            record = BucketTime(step=timer.now.step, index=len(timer.records.buckets), kind=kind,
                                nbytes=tensor.numel() * tensor.element_size(), ready=time.perf_counter())
            timer._in(f"{kind} (FSDP, {format_bytes(record.nbytes)})")
            try:
                work = collective(output, input, *args, **kwargs)
            finally:
                timer._out()
            if work is None:  # synchronous: done as it returned
                record.done = time.perf_counter()
            else:
                work.get_future().then(lambda finished: setattr(record, "done", time.perf_counter()))
            with timer._lock:
                (timer.records.gathers if kind == "all_gather" else timer.records.buckets).append(record)
            return work

        return timed

    def _stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.records.step_ends.append(time.perf_counter())
        self.now.step += 1

    def _in(self, what: str) -> None:
        self.now.collective, self.now.since = what, time.time()

    def _out(self) -> None:
        self.now.collective = None

    def _read_events(self) -> None:
        """CUDA buckets: the all-reduce's device time, from its events (one synchronize, after training)."""
        timed = [b for b in self.records.buckets if b.start_event is not None and b.end_event is not None]
        if not timed:
            return
        self.torch.cuda.synchronize()
        for record in timed:
            record.done = record.ready + record.start_event.elapsed_time(record.end_event) / 1e3
            record.start_event = record.end_event = None


def _loader_facts(loader: Any) -> dict[str, Any]:
    """What says whether a DataLoader splits its dataset between the ranks: its sampler (DistributedSampler, or any
    sampler that knows the ranks: `num_replicas`), through a batch sampler too, and the dataset's size."""
    sampler = getattr(loader, "sampler", None)
    batch_sampler = getattr(loader, "batch_sampler", None)
    inner = getattr(batch_sampler, "sampler", None)
    shards = any(hasattr(s, "num_replicas") for s in (sampler, batch_sampler, inner) if s is not None)
    try:
        size = len(loader.dataset)
    except Exception:  # an IterableDataset: it shards itself, or not, in its own code
        size = None
    try:
        batches = len(loader)
    except Exception:  # an IterableDataset without a length
        batches = None
    return {"sampler": type(sampler).__name__, "shards": shards, "dataset_size": size,
            "iterable": size is None, "batches": batches, "num_workers": int(getattr(loader, "num_workers", 0) or 0)}


def _fingerprint(torch: Any, args: Any, kwargs: Any) -> str:
    """The first tensor of a forward's inputs, hashed from its bytes on the host (only the first HASHED_BATCHES
    batches: a GPU batch is copied back for it)."""
    import hashlib

    tensors = [value for value in (*args, *kwargs.values()) if isinstance(value, torch.Tensor)]
    if not tensors and args and isinstance(args[0], dict):  # a dict batch
        tensors = [value for value in args[0].values() if isinstance(value, torch.Tensor)]
    if not tensors:
        return ""
    first = tensors[0].detach().cpu().contiguous()
    return hashlib.blake2b(first.view(-1).view(torch.uint8).numpy().tobytes(), digest_size=12).hexdigest()


def _settings(ddp: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name in DDP_SETTINGS:
        value = getattr(ddp, name, None)
        if name == "bucket_cap_mb" and value is None:
            value = getattr(ddp, "bucket_bytes_cap", None)
            value = value / 1024 / 1024 if value else None
        found[name] = value if isinstance(value, bool | int | float) or value is None else str(value)
    found["device_ids"] = [str(d) for d in (getattr(ddp, "device_ids", None) or [])]
    return found


def _logging_data(ddp: Any) -> dict[str, Any]:
    try:
        data = ddp._get_ddp_logging_data()
    except Exception:  # a prototype API
        return {}
    return {key: value for key, value in data.items() if isinstance(value, int | float | str)}
