"""The shared sampler: one thread however many leases, the fastest interval wins, the last lease stops it."""

from __future__ import annotations

import threading
import time

import pytest
from threads import sampler_threads, wait_for

from jupyter_gpu.metrics.backends.base import BACKEND_ENV, BackendSpecError
from jupyter_gpu.metrics.hub import RateLimiter, SamplerHub, close_shared_hubs, shared_hub
from jupyter_gpu.metrics.sample import Sample


class CountingBackend:
    name = "counting"
    simulated = True

    def __init__(self) -> None:
        self.reads: list[float] = []
        self.closed = 0

    def read(self) -> Sample:
        self.reads.append(time.monotonic())
        return Sample(time.time(), self.name, True)

    def close(self) -> None:
        self.closed += 1




@pytest.fixture(autouse=True)
def no_thread_left_behind():
    yield
    close_shared_hubs()
    assert sampler_threads() == [], "a test left a sampler thread running"


@pytest.fixture
def backends() -> list[CountingBackend]:
    return []


@pytest.fixture
def hub(backends: list[CountingBackend]) -> SamplerHub:
    def make() -> CountingBackend:
        backends.append(CountingBackend())
        return backends[-1]

    return SamplerHub(make)


def test_many_leases_share_one_thread_and_the_last_close_stops_it(hub, backends):
    received: list[list[Sample]] = [[] for _ in range(5)]
    leases = [hub.acquire(0.1, got.append) for got in received]
    assert len(sampler_threads()) == 1 and hub.leases == 5 and len(backends) == 1
    wait_for(lambda: all(len(got) >= 2 for got in received))
    for lease in leases[:4]:
        lease.close()
    assert len(sampler_threads()) == 1, "one lease is still open"
    leases[4].close()
    assert sampler_threads() == [] and hub.sampler is None
    assert backends[0].closed == 1, "the backend (NVML) is shut down with the thread"


def test_closed_leases_get_no_more_samples(hub):
    kept: list[Sample] = []
    dropped: list[Sample] = []
    keep = hub.acquire(0.1, kept.append)
    drop = hub.acquire(0.1, dropped.append)
    drop.close()
    count = len(dropped)
    wait_for(lambda: len(kept) >= count + 3)
    assert len(dropped) == count
    keep.close()


def test_the_fastest_open_lease_sets_the_rate_and_closing_it_slows_down(hub, backends):
    slow = hub.acquire(5.0)
    assert hub.sampler.interval == 5.0
    fast = hub.acquire(0.1)
    assert hub.sampler.interval == 0.1
    # The faster rate applies at once, not after the 5 s sleep the thread was in.
    wait_for(lambda: len(backends[0].reads) >= 4, timeout=1.5)
    fast.close()
    assert hub.sampler.interval == 5.0
    reads = len(backends[0].reads)
    time.sleep(0.4)
    assert len(backends[0].reads) <= reads + 1, "back to one read per 5 s"
    slow.close()


def test_a_new_hub_after_the_last_lease_starts_afresh(hub, backends):
    hub.acquire(0.1).close()
    lease = hub.acquire(0.1)
    assert len(backends) == 2 and backends[0].closed == 1 and backends[1].closed == 0
    lease.close()


def test_closing_twice_and_using_a_closed_lease(hub):
    lease = hub.acquire(1.0)
    lease.close()
    lease.close()
    with pytest.raises(RuntimeError, match="closed"):
        _ = lease.sampler


def test_start_false_lets_the_caller_read_first(hub, backends):
    with hub.acquire(1.0, start=False) as lease:
        assert sampler_threads() == []
        first = lease.sampler.read_now()
        assert first.backend == "counting" and len(backends[0].reads) == 1
        hub.start()
        assert len(sampler_threads()) == 1
    assert sampler_threads() == []


def test_bad_interval_is_refused(hub):
    with pytest.raises(ValueError, match=r"at least 0\.1"):
        hub.acquire(0.01)
    assert hub.leases == 0


def test_closing_from_a_subscriber_on_the_sampler_thread_does_not_deadlock(hub):
    leases = []
    done = threading.Event()

    def close_self(sample: Sample) -> None:
        leases[0].close()
        done.set()

    leases.append(hub.acquire(0.1, close_self, start=False))
    hub.start()
    assert done.wait(2.0)
    wait_for(lambda: sampler_threads() == [])


def test_shared_hub_is_one_per_backend_spec():
    env = {BACKEND_ENV: "simulated:h200"}
    assert shared_hub(env) is shared_hub(dict(env))
    assert shared_hub({BACKEND_ENV: "simulated:h200-busy"}) is not shared_hub(env)
    with shared_hub(env).acquire(1.0, start=False) as lease:
        assert lease.sampler.read_now().backend == "simulated:h200"


def test_a_bad_backend_spec_fails_the_lease_with_the_variable_named():
    hub = shared_hub({BACKEND_ENV: "simulated:nonesuch"})
    with pytest.raises(BackendSpecError, match="JUPYTER_GPU_BACKEND"):
        hub.acquire(1.0)
    assert hub.leases == 0


def test_rate_limiter_passes_one_sample_per_interval_on_a_grid():
    limiter = RateLimiter(1.0)
    stamps = [0.0, 0.5, 0.95, 1.5, 2.08, 2.2, 2.93, 3.5, 8.0, 8.5, 9.0]
    passed = [t for t in stamps if limiter.due(Sample(t, "x", True))]
    # 0.95 is within the slack; 2.08 is late but 2.93 is on time for the grid (3.0), not 3.08; after a gap
    # the grid restarts at 8.0.
    assert passed == [0.0, 0.95, 2.08, 2.93, 8.0, 9.0]


def test_rate_limiter_at_the_hub_rate_passes_everything_despite_jitter():
    limiter = RateLimiter(0.1)
    stamps = [0.0, 0.097, 0.205, 0.296, 0.4, 0.503]
    assert all(limiter.due(Sample(t, "x", True)) for t in stamps)
