"""What one call of a user's step did, seen from hooks: the batch it trained on (the first dimension of the first
tensor the first model was called with), how many batches that was (the calls of that model per optimizer step:
gradient accumulation's micro-batches), whether it trained at all (an optimizer stepped, or a gradient reached a
parameter), and which of the notebook's models and optimizers it used (a notebook holds others: an earlier
experiment's model, a second loop's optimizer). `%speedprobe` reads it on its baseline's counted step, `%batchprobe`
on each trial.

Probe layer: torch is passed in; nothing here initialises CUDA.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any


class StepCensus:
    """Hooks for the duration of a `with` block: forward pre-hooks on `modules`, post-accumulate-grad hooks on
    `params`, and torch's global optimizer step pre-hook."""

    def __init__(self, torch: Any, modules: list[Any], params: list[Any]) -> None:
        self._torch = torch
        self._modules = modules
        self._params = [param for param in params if param.requires_grad]
        self._stack = ExitStack()
        self._sizing: int | None = None  # id of the module the batch size was read from
        self.batch_size: int | None = None
        self._sizing_calls = 0           # calls of that module
        self.optimizer_steps = 0
        self.gradients = False           # a gradient was accumulated into a parameter
        self.called: set[int] = set()    # ids of the hooked modules the step called
        self.forward_depth = 0           # > 0 while one of the hooked modules runs its forward
        self.stepped: set[int] = set()   # ids of the optimizers that stepped

    @property
    def trained(self) -> bool:
        """An optimizer stepped or a gradient reached a parameter. Reading `.grad` could not tell: an evaluation
        after training finds the last training step's gradients still there; the accumulate hook also fires when
        a GradScaler then skips the step, and under gradient accumulation before the step."""
        return bool(self.optimizer_steps or self.gradients)

    @property
    def batches(self) -> int:
        """Batches per optimizer step: 4 calls of the model and 1 step under gradient accumulation. A step with two
        optimizers or more (a GAN) is 1: its models are called several times per iteration without accumulating
        (the DCGAN tutorial's discriminator 3 times, on the real batch, the fakes, and for the generator's loss),
        and counted as accumulation the probes had doubled its samples/s."""
        if len(self.stepped) > 1:
            return 1
        return max(1, round(self._sizing_calls / max(1, self.optimizer_steps)))

    def __enter__(self) -> StepCensus:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        for module in self._modules:
            self._stack.callback(module.register_forward_pre_hook(self._called, with_kwargs=True).remove)
            self._stack.callback(module.register_forward_hook(self._returned, always_call=True).remove)
        for param in self._params:
            self._stack.callback(param.register_post_accumulate_grad_hook(self._accumulated).remove)
        self._stack.callback(register_optimizer_step_pre_hook(self._stepped).remove)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stack.close()

    def _called(self, module: Any, args: tuple, kwargs: dict) -> None:
        self.called.add(id(module))
        self.forward_depth += 1
        if self._sizing is None:
            for value in (*args, *kwargs.values()):
                if isinstance(value, self._torch.Tensor) and value.dim() >= 1:
                    self.batch_size = int(value.shape[0])
                    self._sizing = id(module)
                    break
        if self._sizing == id(module):
            self._sizing_calls += 1

    def _returned(self, *_: Any) -> None:
        self.forward_depth -= 1

    def _accumulated(self, _param: Any) -> None:
        self.gradients = True

    def _stepped(self, optimizer: Any, *_: Any) -> None:
        self.optimizer_steps += 1
        self.stepped.add(id(optimizer))
