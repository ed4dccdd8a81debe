"""One step counted operator by operator: calls, time, FLOPs (torch.utils.flop_counter's formulas) and bytes moved.

A `TorchDispatchMode` sees every aten operator below autograd and autocast, so forward and backward are both
counted, in the dtype each matmul really ran in. It runs for one extra step after the profiled ones (its own
cost would distort them). On CUDA each operator is timed with a pair of events, read once the step is over;
on the CPU an operator has finished when it returns, so the host clock times it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpu.probekit.kernel_trace import operator_key

# Operators that only read metadata or make views: no data moves, nothing to time.
_METADATA = {"size", "stride", "storage_offset", "numel", "dim", "is_contiguous", "sym_size", "sym_stride",
             "sym_numel", "sym_storage_offset", "is_strides_like_format", "is_non_overlapping_and_dense", "layout",
             "device", "_record_function_enter", "_record_function_enter_new", "_record_function_exit"}


@dataclass
class OperatorCount:
    calls: int = 0
    seconds: float = 0.0
    flops: int = 0
    bytes: int = 0
    pending: list[tuple[Any, Any]] = field(default_factory=list)  # CUDA event pairs not read yet


@dataclass
class CensusTotals:
    operators: dict[str, OperatorCount]  # the model's: forward, loss, backward
    flops_by_dtype: dict[str, int]  # FLOPs of the matmul family per input dtype ("torch.bfloat16", ...)
    # FLOPs activation checkpointing (torch.utils.checkpoint, non-reentrant) recomputed in the backward: counted in
    # `flops`, as work the device did, but not the model's own.
    recomputed_flops: int = 0
    # Those that ran inside an optimizer's step, apart: AdamW's foreach kernels move every parameter and its two
    # moments each step, and their memory traffic is cured by a fused optimizer, not by compiling the model.
    optimizer_operators: dict[str, OperatorCount] = field(default_factory=dict)

    @property
    def flops(self) -> int:
        return sum(count.flops for count in (*self.operators.values(), *self.optimizer_operators.values()))

    def names(self) -> set[str]:
        return {*self.operators, *self.optimizer_operators}


def make_census(torch: Any, cuda_timing: bool, counting: Any = lambda: True, in_optimizer: Any = lambda: False) -> Any:
    """A dispatch mode that counts every operator it sees while `counting()` (not while the DataLoader collates a
    batch: that is the input pipeline, not the model), those seen while `in_optimizer()` apart; `totals()` once it
    has exited. Operators are named as the kernel trace names them (`kernel_trace.operator_key`)."""
    from torch._ops import HigherOrderOperator
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import flop_registry

    formulas = dict(flop_registry)
    _add_cpu_attention_formulas(torch, formulas)
    recomputing = _recomputation_test(torch)

    class OperatorCensus(TorchDispatchMode):
        supports_higher_order_operators = True  # run whole and uncounted, as under kernel_torch.handler_mode

        def __init__(self) -> None:
            super().__init__()
            self.counts: dict[str, OperatorCount] = {}
            self.optimizer_counts: dict[str, OperatorCount] = {}
            self.flops_by_dtype: dict[str, int] = {}
            self.recomputed_flops = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            kwargs = kwargs or {}
            if isinstance(func, HigherOrderOperator):
                return func(*args, **kwargs)
            packet = func._overloadpacket
            if packet.__name__ in _METADATA or not counting():
                return func(*args, **kwargs)
            name = operator_key(getattr(packet, "_qualified_op_name", packet.__name__))
            if packet not in formulas:
                # Under torch.inference_mode a composite operator (linear, batch_norm, dropout) reaches the mode
                # whole, where autograd would have decomposed it: priced as `linear`, an eval loop's matmuls had no
                # FLOPs and were called memory-bound. Decomposed here, as torch's FlopCounterMode does.
                with self:
                    decomposed = func.decompose(*args, **kwargs)
                if decomposed is not NotImplemented:
                    return decomposed
            if cuda_timing:
                start = torch.cuda.Event(enable_timing=True)
                start.record()
                out = func(*args, **kwargs)
                end = torch.cuda.Event(enable_timing=True)
                end.record()
                elapsed = None
            else:
                began = time.perf_counter()
                out = func(*args, **kwargs)
                elapsed = time.perf_counter() - began
            counts = self.optimizer_counts if in_optimizer() else self.counts
            count = counts.setdefault(name, OperatorCount())
            count.calls += 1
            if elapsed is None:
                count.pending.append((start, end))
            else:
                count.seconds += elapsed
            formula = formulas.get(packet)
            if formula is not None:
                try:
                    flops = int(formula(*args, **kwargs, out_val=out))
                except Exception:  # a formula that cannot read these arguments: the operator is counted unpriced
                    flops = 0
                count.flops += flops
                if flops and recomputing():
                    self.recomputed_flops += flops
                dtype = _first_tensor_dtype(torch, args)
                if dtype is not None and flops:
                    self.flops_by_dtype[dtype] = self.flops_by_dtype.get(dtype, 0) + flops
            count.bytes += 0 if getattr(func, "is_view", False) else _bytes_moved(torch, args, kwargs, out)
            return out

        def totals(self) -> CensusTotals:
            for count in (*self.counts.values(), *self.optimizer_counts.values()):
                for start, end in count.pending:
                    count.seconds += start.elapsed_time(end) / 1000.0
                count.pending.clear()
            return CensusTotals(self.counts, self.flops_by_dtype, self.recomputed_flops, self.optimizer_counts)

    return OperatorCensus()


def _recomputation_test(torch: Any) -> Any:
    """A function telling whether the operator running now is activation checkpointing's recomputation: its
    non-reentrant form recomputes the forward in the backward under its own saved-tensor hooks
    (`torch.utils.checkpoint._recomputation_hook`), the innermost ones then. Reentrant checkpointing is not told."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    if top is None:
        return lambda: False

    def recomputing() -> bool:
        hooks = top(True)
        return bool(hooks) and getattr(hooks[0], "__qualname__", "").startswith("_recomputation_hook.")
    return recomputing


def _add_cpu_attention_formulas(torch: Any, formulas: dict[Any, Any]) -> None:
    # torch's registry prices the CUDA attention kernels only; on the CPU, scaled_dot_product_attention runs
    # `_scaled_dot_product_flash_attention_for_cpu`, which takes the same leading arguments (query, key, value).
    from torch.utils import flop_counter

    aten = torch.ops.aten
    pairs = (("_scaled_dot_product_flash_attention_for_cpu", "sdpa_flop"),
             ("_scaled_dot_product_flash_attention_for_cpu_backward", "sdpa_backward_flop"))
    for op_name, formula_name in pairs:
        op = getattr(aten, op_name, None)
        formula = getattr(flop_counter, formula_name, None)
        if op is not None and formula is not None and op not in formulas:
            formulas[op] = formula


def _first_tensor_dtype(torch: Any, args: tuple) -> str | None:
    for arg in args:
        if isinstance(arg, torch.Tensor):
            return str(arg.dtype)
    return None


def _bytes_moved(torch: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """Bytes the operator read and wrote: its tensor inputs and outputs, each storage once (an in-place
    operator's output is its input)."""
    inputs = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    for value in (*args, *kwargs.values()):
        if isinstance(value, (list, tuple)):
            inputs.extend(v for v in value if isinstance(v, torch.Tensor))
    outputs = [out] if isinstance(out, torch.Tensor) else [
        o for o in (out if isinstance(out, (list, tuple)) else ()) if isinstance(o, torch.Tensor)]
    seen: set[int] = set()
    try:
        total = 0
        for tensor in (*inputs, *outputs):
            pointer = tensor.untyped_storage().data_ptr()
            if pointer not in seen:
                seen.add(pointer)
                total += tensor.numel() * tensor.element_size()
        return total
    except (RuntimeError, NotImplementedError):
        return 0
