"""`probekit.schedules`: a OneCycleLR the probes step past its end starts over instead of raising (real torch)."""

from __future__ import annotations

import pytest
import torch

from jupyter_gpu.probekit.schedules import restarting_schedules


def one_cycle(total_steps: int = 5) -> torch.optim.lr_scheduler.OneCycleLR:
    weight = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=total_steps)


def test_past_its_end_a_one_cycle_schedule_starts_over_with_the_rates_it_really_takes() -> None:
    scheduler = one_cycle()
    first_cycle = [scheduler.get_last_lr()[0]]  # step 0, set by the constructor
    with restarting_schedules([scheduler, torch.optim.lr_scheduler.StepLR(scheduler.optimizer, 2)]) as restarted:
        for _ in range(5):
            scheduler.optimizer.step()
            scheduler.step()
            first_cycle.append(scheduler.get_last_lr()[0])
        for expected in first_cycle[:5]:  # past total_steps: the same rates from step 0 again, not a ValueError
            scheduler.optimizer.step()
            scheduler.step()
            assert scheduler.get_last_lr()[0] == pytest.approx(expected)
    assert restarted == ["OneCycleLR"]
    assert "step" not in vars(scheduler)  # the class's own step again, which raises past the end as before
    scheduler.step()  # the cycle's last step (5 of 5) ...
    with pytest.raises(ValueError, match="Tried to step"):
        scheduler.step()  # ... and one past it raises, as torch's own does


def test_a_schedule_that_never_reaches_its_end_is_not_named() -> None:
    scheduler = one_cycle(total_steps=100)
    with restarting_schedules([scheduler]) as restarted:
        scheduler.optimizer.step()
        scheduler.step()
    assert restarted == []
