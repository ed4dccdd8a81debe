"""Learning-rate schedules with an end, restarted while a probe calls the user's step more times than they have.

A probe calls a step many times (`%speedprobe` up to 2,000 calls a configuration, `%dataprobe` for seconds,
`%batchprobe` per trial), each configuration from the same snapshot. torch's OneCycleLR raises ValueError ("Tried to
step 85 times. The specified number of total steps is 84") one step past `total_steps`, so a step that calls
`scheduler.step()` failed every probe of a loop with a short OneCycleLR. While the probe runs, such a schedule
starts over instead (its learning rate stays one the schedule really takes); the snapshot puts the user's state back
afterwards. The other schedulers of torch.optim.lr_scheduler run on past their end without raising.

Probe layer: torch objects are passed in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def restarting_schedules(schedulers: list[Any]) -> Iterator[list[str]]:
    """For the duration, each scheduler with a `total_steps` (OneCycleLR) starts its schedule over instead of
    raising past its end; yields a list that names, once the block ends, the schedules that did restart."""
    restarted: list[str] = []
    patched = [scheduler for scheduler in schedulers if isinstance(getattr(scheduler, "total_steps", None), int)]
    for scheduler in patched:
        _restart_at_the_end(scheduler, restarted)
    try:
        yield restarted
    finally:
        for scheduler in patched:
            vars(scheduler).pop("step", None)  # the class's own step again


def _restart_at_the_end(scheduler: Any, restarted: list[str]) -> None:
    step = scheduler.step  # the bound method of the class

    def step_or_restart(*args: Any, **kwargs: Any) -> Any:
        if scheduler.last_epoch + 1 > scheduler.total_steps:
            scheduler.last_epoch = -1  # the next step computes the schedule's first learning rate
            name = type(scheduler).__name__
            if name not in restarted:
                restarted.append(name)
        return step(*args, **kwargs)

    scheduler.step = step_or_restart


def restarted_note(name: str) -> str:
    return (f"your {name} reached its total_steps during the probe (it calls the step more times than the schedule "
            "has) and started over there instead of raising; its state is put back")
