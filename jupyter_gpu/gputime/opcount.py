"""Count what a run asks PyTorch to do: operators per device, copies, waits for the GPU, CPU tensor bytes.

A `TorchDispatchMode` sees every ATen operator after autograd, with its real tensors, on the thread that
runs the cell. It declares `ignore_compile_internals`, so `torch.compile` still compiles a function first
called under it (without that, Dynamo skips such a function for good) and compiled regions run as
fused kernels, not counted one by one. Printing a tensor disables dispatch modes, so `Tensor.__repr__` is
wrapped for the duration of the counted run to see print-induced waits.
"""

from __future__ import annotations

import time
import weakref
from collections import Counter
from contextlib import ExitStack
from typing import Any

from jupyter_gpu.gputime.ops import (
    COPY_OPS,
    PRINT_SYNC,
    copy_direction,
    is_accelerator,
    op_device_type,
    sync_reason,
)
from jupyter_gpu.gputime.result import OpCounts
from jupyter_gpu.kernel_torch import context_devices, handler_mode

_CALIBRATION_OPS = 400
# Operators that mark profiler ranges (optimizers emit them every step): bookkeeping, not work.
NOT_WORK_NAMESPACES = frozenset({"profiler"})
_calibrated_cost: float | None = None


class OpCounter:
    """Context manager around one run; `result()` afterwards. Bound to the torch the kernel imported."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self._tensor_type = torch.Tensor
        self._mode = handler_mode(self.record)
        self.ops: Counter[str] = Counter()
        self.by_device: Counter[str] = Counter()
        self.copies: Counter[str] = Counter()
        self.copy_bytes: Counter[str] = Counter()
        self.syncs: Counter[str] = Counter()
        self.blocking_seconds = 0.0
        self.cpu_allocated = 0
        self.cpu_live = 0
        self.cpu_peak = 0
        self._live: dict[int, tuple[weakref.ref, int]] = {}
        self._stack = ExitStack()
        # Per CUDA device, the stream the clock records its events on (the current one when counting began).
        self._timed_streams: dict[int, Any] = {}
        self.side_stream_ops = 0
        self.cuda_devices: set[int] = set()

    def __enter__(self) -> OpCounter:
        self._timed_streams = {index: self._torch.cuda.current_stream(index)
                               for index in context_devices(self._torch)}
        self._stack.enter_context(self._mode)
        tensor_class = self._torch.Tensor
        original_repr = tensor_class.__repr__
        counter = self

        def counting_repr(tensor: Any, *args: Any, **kwargs: Any) -> str:
            device = str(tensor.device)
            if is_accelerator(device):
                counter.syncs[PRINT_SYNC] += 1
                started = time.perf_counter()
                try:
                    return original_repr(tensor, *args, **kwargs)
                finally:
                    counter.blocking_seconds += time.perf_counter() - started
            return original_repr(tensor, *args, **kwargs)

        tensor_class.__repr__ = counting_repr
        self._stack.callback(setattr, tensor_class, "__repr__", original_repr)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stack.close()

    def result(self, overhead_seconds: float | None = None) -> OpCounts:
        held = sum(size for ref, size in self._live.values() if ref() is not None)
        self._live.clear()  # drop the weak references: their callbacks must not outlive the report
        return OpCounts(
            by_device=dict(self.by_device),
            by_name=dict(self.ops),
            copies=dict(self.copies),
            copy_bytes=dict(self.copy_bytes),
            syncs=dict(self.syncs),
            blocking_seconds=self.blocking_seconds,
            cpu_bytes_allocated=self.cpu_allocated,
            cpu_peak_bytes=self.cpu_peak,
            cpu_bytes_held=held,
            overhead_seconds=overhead_seconds,
            cuda_devices=tuple(sorted(self.cuda_devices)),
            side_stream_ops=self.side_stream_ops,
        )

    # Called by the dispatch mode for every operator.
    def record(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if func.namespace in NOT_WORK_NAMESPACES:
            return func(*args, **kwargs)
        name = func.overloadpacket.__name__
        inputs = _devices(self._tensor_type, args, kwargs)
        is_copy = name in COPY_OPS
        started = time.perf_counter()
        out = func(*args, **kwargs)
        elapsed = time.perf_counter() - started
        outputs = _devices(self._tensor_type, _as_tuple(out), {})
        self.ops[name] += 1
        kind = op_device_type(inputs, outputs)
        if kind is not None:
            self.by_device[kind] += 1
            if kind == "cuda":
                self._note_stream(inputs or outputs)
        direction = None
        if is_copy:
            direction = _copy_of(name, inputs, outputs)
            if direction is not None:
                self.copies[direction] += 1
                self.copy_bytes[direction] += sum(int(t.nbytes) for t in _as_tuple(out)
                                                  if isinstance(t, self._tensor_type))
        reason = sync_reason(name, inputs, copy=direction, non_blocking=bool(kwargs.get("non_blocking")))
        if reason is not None:
            self.syncs[reason] += 1
        if direction is not None or reason is not None:
            self.blocking_seconds += elapsed
        self._track_cpu_allocations(func, out)
        return out

    def _note_stream(self, devices: tuple[str, ...]) -> None:
        """Which CUDA device the operator ran on, and whether it was queued on a side stream: CUDA events on the
        timed stream do not see work on another stream that the timed one never waits for."""
        index = next((cuda_index(d) for d in devices if d.startswith("cuda")), None)
        if index is None:
            return
        self.cuda_devices.add(index)
        timed = self._timed_streams.get(index)
        if timed is None:  # a device first used by this run: the clock will time its default stream
            timed = self._timed_streams[index] = self._torch.cuda.default_stream(index)
        if self._torch.cuda.current_stream(index) != timed:
            self.side_stream_ops += 1

    def _track_cpu_allocations(self, func: Any, out: Any) -> None:
        returns = func._schema.returns
        for position, tensor in enumerate(_as_tuple(out)):
            if not isinstance(tensor, self._tensor_type) or tensor.device.type != "cpu":
                continue
            # An output with alias information is a view or the in-place input: no new memory.
            if position < len(returns) and returns[position].alias_info is not None:
                continue
            try:
                size = tensor.untyped_storage().nbytes()
            except (RuntimeError, NotImplementedError, TypeError):
                continue  # sparse and some subclass tensors have no plain storage to measure
            self.cpu_allocated += size
            self.cpu_live += size
            self.cpu_peak = max(self.cpu_peak, self.cpu_live)
            key = id(tensor)
            self._live[key] = (weakref.ref(tensor, self._freed_callback(key, size)), size)

    def _freed_callback(self, key: int, size: int) -> Any:
        def freed(_: Any) -> None:
            self.cpu_live -= size
            self._live.pop(key, None)
        return freed


def counting_overhead_per_op(torch: Any) -> float:
    """Seconds counting adds to one operator, measured once per process on a tiny CPU op."""
    global _calibrated_cost
    if _calibrated_cost is None:
        x = torch.zeros(1)
        bare, counted = [], []
        for _ in range(3):
            started = time.perf_counter()
            for _ in range(_CALIBRATION_OPS):
                torch.add(x, 1)
            bare.append(time.perf_counter() - started)
            with OpCounter(torch):
                started = time.perf_counter()
                for _ in range(_CALIBRATION_OPS):
                    torch.add(x, 1)
                counted.append(time.perf_counter() - started)
        _calibrated_cost = max(min(counted) - min(bare), 0.0) / _CALIBRATION_OPS
    return _calibrated_cost


def cuda_index(device: str) -> int:
    """1 for "cuda:1". A tensor's device always names its index; a bare "cuda" would be device 0."""
    _, _, index = device.partition(":")
    return int(index) if index else 0


def _as_tuple(value: Any) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _devices(tensor_type: type, args: tuple, kwargs: dict) -> tuple[str, ...]:
    found: list[str] = []
    for value in (*args, *kwargs.values()):
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(item, tensor_type):
                found.append(str(item.device))
    return tuple(found)


def _copy_of(name: str, inputs: tuple[str, ...], outputs: tuple[str, ...]) -> str | None:
    if name == "copy_" and len(inputs) >= 2:
        destination, source = inputs[0], inputs[1]
    else:
        source = inputs[0] if inputs else None
        destination = outputs[0] if outputs else None
    if source is None or destination is None:
        return None
    return copy_direction(source, destination)
