"""Ready steps for a loop the source lifter refuses: the user's own loop, run as written, one optimizer step a call.

Where the loop body cannot be lifted (batches from several loaders through `zip`, a `return` in its function, a
name it cannot see), the profile still ran the cell and stopped it between two steps; a driven step does the same,
once per call:
- each call runs the profiled code again from its start (the cell, or the `%gpuprofile train_epoch(...)` line),
  in the notebook's namespace;
- every DataLoader it iterates yields, instead of loading, a batch the profile saw from it (the data step's own
  `batch` for the loader %dataprobe measures), so a call costs the iteration, not the loader's start-up, and every
  call computes on the same data, as %speedprobe's comparison of configurations needs;
- the first optimizer to step is the step's: once it has stepped, the run is stopped at the loop's next batch (or,
  for a loop without a DataLoader, at its next module call), and at the latest when that optimizer steps again.
  The rest of the iteration (the other optimizers of a GAN or a domain-adaptation loop, the scheduler, logging) is
  part of the step, as in the loop. Modules the stop interrupts half-way through switching to eval() are put back
  in the train/eval mode they had;
- it returns the loss: the tensor the loop last called backward on before the stop.

No threads (autocast and the CUDA stream are per thread: a probe's `torch.autocast` around the step reaches the
loop's operators only on the caller's thread) and no generator rewriting: the stop is an exception raised from the
hooks, as the profile's own stop is. The steps close over the cell's code, so the probes find, put back and check
everything the loop touches through it, as for a lifted step.
"""

from __future__ import annotations

import contextlib
import types
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from jupyter_gpu.gpuprofile.lift import _FACTORY
from jupyter_gpu.gpuprofile.result import ReadyStep

# A loop that asks for this many batches without its optimizer stepping is not stepping on them.
MOST_BATCHES = 10_000


class DrivenStop(BaseException):
    """Raised inside the user's loop once its step is done (a BaseException: a loop's `except Exception` lets it
    through, as it does the profile's StopProfile)."""


@dataclass
class Driver:
    """What a driven step needs: the batches the profile saw (by dataset, whose identity outlives a loader the loop
    remakes), the loader whose batch the data step is given, whether the loop has DataLoaders at all, and the
    models whose train/eval mode a stop must leave as it was (weakly: the step keeps no model alive the notebook
    deleted)."""

    batches: dict[int, tuple[Any, Any]]
    fed: Any = None
    models: list[Any] = field(default_factory=list)

    def train_step(self, cell: Sequence[types.FunctionType]) -> Any:
        """One optimizer step of the loop, on the batches the profile saw; returns its loss."""
        return self._drive(cell, None)

    def data_step(self, cell: Sequence[types.FunctionType], batch: Any) -> Any:
        """One optimizer step of the loop, the measured loader yielding `batch`; returns its loss."""
        return self._drive(cell, (batch,))

    def _drive(self, cell: Sequence[types.FunctionType], given: tuple[Any] | None) -> Any:
        import torch

        run = _Run(self, given, torch)
        models = [model for model in (ref() for ref in self.models) if model is not None]
        modes = [(module, module.training) for model in models for module in model.modules()]
        try:
            with run.installed():
                for part in cell:
                    exec(part.__code__, part.__globals__)  # the cell, as the profile ran it
        except DrivenStop:
            for module, training in modes:
                module.training = training
        if run.lead is None:
            raise RuntimeError("the loop ended before its optimizer stepped: there is no step to drive")
        return run.loss


class _Run:
    """One driven call: its hooks, the batches it hands out, and where it stops."""

    def __init__(self, driver: Driver, given: tuple[Any] | None, torch: Any) -> None:
        self.driver, self.given, self.torch = driver, given, torch
        self.lead: int | None = None
        self.loss: Any = None
        self.batches = 0
        self._forward_stop: Any = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        torch = self.torch
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
        from torch.utils.data import DataLoader
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        run = self
        original_iter, original_next = DataLoader.__iter__, _BaseDataLoaderIter.__next__
        original_backward = torch.autograd.backward

        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(tensors, torch.Tensor):
                run.loss = tensors.detach()
            return original_backward(tensors, *args, **kwargs)

        def fed_iter(loader: Any) -> Any:
            return _Fed(run, getattr(loader, "dataset", None), loader)

        def fed_next(iterator: Any) -> Any:  # an iterator made before the call (`train_iter = iter(loader)`)
            return run.next_batch(getattr(iterator, "_dataset", None), None)

        handles = [register_optimizer_step_pre_hook(self._before_step),
                   register_optimizer_step_post_hook(self._after_step)]
        DataLoader.__iter__, _BaseDataLoaderIter.__next__ = fed_iter, fed_next
        torch.autograd.backward = backward
        try:
            yield
        finally:
            DataLoader.__iter__, _BaseDataLoaderIter.__next__ = original_iter, original_next
            torch.autograd.backward = original_backward
            for handle in handles:
                handle.remove()
            if self._forward_stop is not None:
                self._forward_stop.remove()

    def next_batch(self, dataset: Any, loader: Any) -> Any:
        if self.lead is not None:
            raise DrivenStop
        self.batches += 1
        if self.batches > MOST_BATCHES:
            raise RuntimeError(f"the loop took {MOST_BATCHES} batches without its optimizer stepping")
        fed = self.driver.fed
        if self.given is not None and fed is not None and (loader is fed or dataset is getattr(fed, "dataset", fed)):
            return self.given[0]
        kept = self.driver.batches.get(id(dataset))
        if kept is None:
            raise RuntimeError("the loop iterates a DataLoader the profile saw no batch of")
        return kept[1]

    def _before_step(self, optimizer: Any, *_: Any) -> None:
        if self.lead is not None and id(optimizer) == self.lead:
            raise DrivenStop  # the step's optimizer again: the next step has begun

    def _after_step(self, optimizer: Any, *_: Any) -> None:
        if self.lead is None:
            self.lead = id(optimizer)
            if not self.driver.batches:
                # No DataLoader to stop at: the loop's next module call begins its next step.
                self._forward_stop = self.torch.nn.modules.module.register_module_forward_pre_hook(self._stop)

    def _stop(self, *_: Any) -> None:
        raise DrivenStop


class _Fed:
    """What `iter(loader)` gives inside a driven call: the batches the profile saw, then the stop."""

    def __init__(self, run: _Run, dataset: Any, loader: Any) -> None:
        self.run, self.dataset, self.loader = run, dataset, loader

    def __iter__(self) -> _Fed:
        return self

    def __next__(self) -> Any:
        return self.run.next_batch(self.dataset, self.loader)

    def __len__(self) -> int:
        return len(self.loader)


DRIVER, CELL = "_driver", "_cell"


def _code(name: str, parameters: str, call: str, what: str) -> str:
    return (f"def {_FACTORY}({DRIVER}, {CELL}):\n"
            f"    def {name}({parameters}):\n"
            f"        \"\"\"{what} (driven by %%gpuprofile: the loop could not be lifted).\"\"\"\n"
            f"        return {DRIVER}.{call}\n"
            f"    {name}.calls = 0\n"
            f"    return {name}\n")


def driven_steps(reason: str, loader: str | None, data_step: str, train_step: str) -> list[ReadyStep]:
    """The ready steps of a driven loop: its code (a factory `define` calls with the driver and the cell) and the
    commands; `reason` says why the loop was not lifted."""
    train = ReadyStep("%speedprobe", train_step, f"%speedprobe {train_step}",
                      _code(train_step, "", f"train_step({CELL})",
                            "One optimizer step of your loop, as written, on the batches the profile saw; returns "
                            "its loss"), reason)
    sized = ReadyStep("%batchprobe", None, "%batchprobe sized_step",
                      "def sized_step(batch_size):\n    # one training step on a batch of batch_size samples\n"
                      "    ...\n", f"{reason}; a driven step runs your loop on the batches it saw, and cannot resize "
                      "them")
    if loader is None:
        return [train, sized]
    data = ReadyStep("%dataprobe", data_step, f"%dataprobe {loader} --step {data_step}",
                     _code(data_step, "batch", f"data_step({CELL}, batch)",
                           f"One optimizer step of your loop, as written, {loader} yielding `batch`; returns its "
                           "loss"), reason)
    return [data, train, sized]


def driven(refused: Any, cell: list[Any], namespace: dict[str, Any], loaders: list[str],
           batches: dict[int, tuple[Any, Any]], models: list[Any]) -> Any:
    """The driven ready steps for a loop the source lifter refused (`refused`: lift's Lifted, its templates with
    the reason), as a lift.Lifted that `lift.define` defines."""
    from jupyter_gpu.gpuprofile import lift
    from jupyter_gpu.probekit.training_state import value_at

    reason = next((step.reason for step in refused.steps if step.reason), None) or "the loop could not be lifted"
    loader = loaders[0] if loaders and batches else None
    fed = None
    if loader is not None:
        try:
            fed = value_at(namespace, loader)
        except (KeyError, AttributeError, IndexError, TypeError):
            loader = None
    driver = Driver(dict(batches), fed, [weakref.ref(model) for model in models])
    steps = driven_steps(reason, loader, lift.DATA_STEP, lift.TRAIN_STEP)
    names = [step.name for step in steps if step.name]
    where = "its DataLoaders yielding the batches the profile saw" if batches else "making its own batches"
    note = (f"The ready steps are driven, not lifted ({reason}). {' and '.join(names)} run your own loop as written, "
            f"from the start of the profiled code, {where}, and stop it once its optimizer has stepped: one "
            "optimizer step a call, with everything the loop does in that iteration, returning the loss it last "
            "called backward on.")
    return lift.Lifted(steps, names, {DRIVER: driver, CELL: list(cell)}, notes=[note])
