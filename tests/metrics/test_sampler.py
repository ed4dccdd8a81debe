"""The Sampler: its thread really starts and stops, history is bounded, subscribers are isolated."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from threads import sampler_threads, wait_for

from jupyter_gpu.metrics.backends.simulated import SimulatedBackend
from jupyter_gpu.metrics.sample import Sample
from jupyter_gpu.metrics.sampler import THREAD_NAME, Sampler


class CountingBackend:
    """A backend whose reads are counted and can be slowed down, made to raise, or pinned in time."""

    name = "counting"
    simulated = True

    def __init__(self, delay: float = 0.0, timestamp: float | None = None) -> None:
        self.delay = delay
        self.timestamp = timestamp
        self.read_times: list[float] = []
        self.fail = False

    def read(self) -> Sample:
        self.read_times.append(time.monotonic())
        if self.delay:
            time.sleep(self.delay)
        if self.fail:
            raise RuntimeError("backend bug")
        stamp = time.time() if self.timestamp is None else self.timestamp
        return Sample(stamp, self.name, True)

    def close(self) -> None:
        pass




@pytest.fixture(autouse=True)
def no_thread_left_behind():
    yield
    assert sampler_threads() == [], "a test left a sampler thread running"


@pytest.mark.parametrize("interval", [0.0, 0.05, -1.0, float("nan"), float("inf")])
def test_interval_has_a_floor(interval):
    with pytest.raises(ValueError, match=r"finite number of seconds, at least 0\.1"):
        Sampler(CountingBackend(), interval=interval)


def test_history_keeps_at_least_one():
    with pytest.raises(ValueError, match="at least 1 sample"):
        Sampler(CountingBackend(), history=0)
    assert Sampler(CountingBackend(), interval=0.1, history=1).interval == 0.1


def test_start_runs_one_daemon_thread_and_stop_ends_it():
    backend = CountingBackend()
    sampler = Sampler(backend, interval=0.1)
    assert not sampler.running and sampler_threads() == []
    sampler.start()
    sampler.start()  # idempotent
    try:
        (thread,) = sampler_threads()
        assert thread.daemon and sampler.running
        wait_for(lambda: len(backend.read_times) >= 2)
    finally:
        sampler.stop()
    assert not sampler.running and sampler_threads() == []
    reads = len(backend.read_times)
    time.sleep(0.15)
    assert len(backend.read_times) == reads  # nothing reads after stop()
    sampler.stop()  # idempotent


def test_stop_before_start_and_restart():
    sampler = Sampler(CountingBackend(), interval=0.1)
    sampler.stop()
    sampler.start()
    sampler.stop()
    sampler.start()
    assert sampler.running and len(sampler_threads()) == 1
    sampler.stop()


def test_stop_is_immediate_even_with_a_long_interval():
    backend = CountingBackend()
    sampler = Sampler(backend, interval=30.0)
    sampler.start()
    wait_for(lambda: len(backend.read_times) == 1)
    began = time.monotonic()
    sampler.stop()
    assert time.monotonic() - began < 0.5
    assert sampler_threads() == []


def test_context_manager_starts_and_stops():
    with Sampler(SimulatedBackend("h200"), interval=0.1) as sampler:
        assert sampler.running and len(sampler_threads()) == 1
        wait_for(lambda: sampler.latest() is not None)
    assert not sampler.running and sampler_threads() == []
    assert sampler.latest().backend == "simulated:h200"


@pytest.mark.timing
def test_polling_does_not_drift_when_reads_are_slow():
    # A read taking 30 ms must not stretch a 100 ms period to 130 ms: ticks are scheduled from the start.
    backend = CountingBackend(delay=0.03)
    with Sampler(backend, interval=0.1):
        wait_for(lambda: len(backend.read_times) >= 7)
    times = backend.read_times[:7]
    mean_gap = (times[-1] - times[0]) / 6
    assert 0.09 <= mean_gap < 0.115, mean_gap


def test_read_now_records_and_history_is_bounded():
    sampler = Sampler(SimulatedBackend("h200-busy"), interval=0.1, history=3)
    assert sampler.latest() is None and sampler.history() == []
    taken = [sampler.read_now() for _ in range(5)]
    assert all(isinstance(s, Sample) for s in taken)
    assert sampler.history() == taken[-3:]
    assert sampler.latest() is taken[-1]
    assert sampler_threads() == []  # read_now needs no thread


def test_history_since_returns_only_newer_samples():
    sampler = Sampler(CountingBackend(), interval=0.1)
    first, second, third = (sampler.read_now() for _ in range(3))
    assert sampler.history(since=first.timestamp) == [second, third]
    assert sampler.history(since=third.timestamp) == []
    assert sampler.history(since=0.0) == [first, second, third]


def test_timestamps_strictly_increase_even_if_the_clock_does_not():
    sampler = Sampler(CountingBackend(timestamp=1000.0), interval=0.1)
    stamps = [sampler.read_now().timestamp for _ in range(3)]
    assert stamps[0] == 1000.0 and stamps[0] < stamps[1] < stamps[2]
    assert sampler.history(since=stamps[1]) == [sampler.latest()]


def test_subscribers_get_samples_from_the_thread_until_they_unsubscribe():
    sampler = Sampler(SimulatedBackend("h200"), interval=0.1)
    got: list[Sample] = []
    threads: set[str] = set()

    def on_sample(sample: Sample) -> None:
        got.append(sample)
        threads.add(threading.current_thread().name)

    unsubscribe = sampler.subscribe(on_sample)
    with sampler:
        wait_for(lambda: len(got) >= 2)
        unsubscribe()
        unsubscribe()  # idempotent
        count = len(got)
        history_len = len(sampler.history())
        wait_for(lambda: len(sampler.history()) >= history_len + 2)
    assert len(got) in (count, count + 1)  # at most one read already in flight when unsubscribing
    assert all(isinstance(s, Sample) and s.backend == "simulated:h200" for s in got)
    assert threads == {THREAD_NAME}


def test_a_raising_subscriber_is_logged_and_does_not_stop_sampling_or_others(caplog):
    sampler = Sampler(CountingBackend(), interval=0.1)
    good: list[Sample] = []

    def bad(sample: Sample) -> None:
        raise ZeroDivisionError("subscriber bug")

    sampler.subscribe(bad)
    sampler.subscribe(good.append)
    with caplog.at_level(logging.ERROR, logger="jupyter_gpu.metrics.sampler"), sampler:
        wait_for(lambda: len(good) >= 3)
        assert sampler.running
    assert any(r.exc_info and r.exc_info[0] is ZeroDivisionError for r in caplog.records)


def test_the_same_callback_twice_is_two_subscriptions():
    sampler = Sampler(CountingBackend(), interval=0.1)
    got: list[Sample] = []
    first = sampler.subscribe(got.append)
    sampler.subscribe(got.append)
    sampler.read_now()
    first()
    sampler.read_now()
    assert len(got) == 3


def test_stop_from_a_subscriber_does_not_deadlock():
    sampler = Sampler(CountingBackend(), interval=0.1)
    stopped = threading.Event()

    def stop_now(sample: Sample) -> None:
        sampler.stop()
        stopped.set()

    sampler.subscribe(stop_now)
    sampler.start()
    assert stopped.wait(2.0)
    assert not sampler.running
    wait_for(lambda: sampler_threads() == [])


def test_a_backend_bug_becomes_an_error_sample_and_sampling_goes_on(caplog):
    backend = CountingBackend()
    backend.fail = True
    sampler = Sampler(backend, interval=0.1)
    with caplog.at_level(logging.ERROR, logger="jupyter_gpu.metrics.sampler"), sampler:
        wait_for(lambda: len(sampler.history()) >= 2)
        backend.fail = False
        wait_for(lambda: sampler.latest().status == "ok")
    errors = [s for s in sampler.history() if s.status == "error"]
    assert errors and "RuntimeError: backend bug" in errors[0].message
    assert errors[0].backend == "counting" and errors[0].simulated is True
