"""The server's long chart history: an hour of two figures per GPU in fixed rings, sent as min/mean/max buckets."""

from __future__ import annotations

import gc

import pytest

from jupyter_gpu.metrics.sample import DeviceSample, Sample
from jupyter_gpu.server.series import MAX_POINTS, SeriesStore

GIB = 2**30


def reading(t: float, utilization: float | None, used_gib: float, *, mig: bool = False, lost: bool = False) -> Sample:
    devices = (DeviceSample(0, "H200", "GPU-0", utilization_gpu=utilization, memory_used=int(used_gib * GIB),
                            memory_total=100 * GIB, status="lost" if lost else "ok"),
               DeviceSample(1, "A100", "GPU-1", utilization_gpu=None if mig else 50.0, memory_used=0,
                            memory_total=80 * GIB))
    return Sample(t, "nvml", False, devices=devices)


def test_each_bucket_has_the_min_mean_and_max_of_its_readings():
    store = SeriesStore(100)
    for t, util in enumerate([10, 30, 20, 90, 70, 80]):
        store.add(reading(1000.0 + t, util, used_gib=t))
    series = store.downsample(window=6.0, points=2, now=1005.0)  # buckets [999, 1002) and [1002, 1005]
    gpu0 = series["devices"][0]
    assert series["t"] == [999.0, 1002.0] and series["readings"] == 6
    assert gpu0["utilization"] == {"min": [10.0, 20.0], "mean": [20.0, 65.0], "max": [30.0, 90.0]}
    assert gpu0["memory"]["max"] == [1.0, 5.0]  # % of the 100 GiB total
    assert series["devices"][1]["utilization"]["mean"] == [50.0, 50.0]


def test_a_figure_the_gpu_did_not_report_is_a_gap_never_a_zero():
    store = SeriesStore(10)
    store.add(reading(1.0, None, 1, mig=True))
    store.add(reading(2.0, 40, 1, lost=True, mig=True))
    series = store.downsample(window=2.0, points=2, now=2.5)
    assert series["devices"][1]["utilization"]["mean"] == [None, None]  # a MIG board
    assert series["devices"][0]["utilization"]["mean"] == [None, None]  # first unreported, then lost
    assert series["devices"][0]["memory"]["mean"] == [1.0, None]


def test_an_empty_bucket_is_none_and_readings_outside_the_window_are_left_out():
    store = SeriesStore(10)
    for t in (0.0, 1.0, 9.0):
        store.add(reading(t, 50, 1))
    series = store.downsample(window=4.0, points=4, now=9.0)
    assert series["readings"] == 1
    assert series["devices"][0]["utilization"]["mean"] == [None, None, None, 50.0]


def test_memory_is_fixed_the_oldest_readings_go_first_and_no_object_is_kept_per_reading():
    store = SeriesStore(60)
    for t in range(30):
        store.add(reading(float(t), 10, 1))
    gc.collect()
    tracked = len(gc.get_objects())
    for t in range(30, 5000):
        store.add(reading(float(t), t % 100, 1))
    gc.collect()
    assert len(gc.get_objects()) - tracked < 50  # nothing per reading for the collector to walk
    assert store.span() == 59.0  # the last 60 readings, 4940-4999
    series = store.downsample(window=3600.0, points=MAX_POINTS + 500, now=4999.0)
    assert series["points"] == MAX_POINTS and series["readings"] == 60


def test_a_snapshot_keeps_the_readings_of_its_time_while_the_store_goes_on():
    store = SeriesStore(4)
    for t in range(3):
        store.add(reading(1000.0 + t, 10.0, used_gib=1))
    snapshot = store.copy()
    for t in range(3, 8):  # past the capacity: the store's oldest slots are overwritten
        store.add(reading(1000.0 + t, 90.0, used_gib=1))
    old = snapshot.downsample(window=3.0, points=3, now=1002.0)
    assert old["readings"] == 3 and old["devices"][0]["utilization"]["max"] == [None, 10.0, 10.0]
    assert snapshot.span() == 2.0
    assert store.downsample(window=3.0, points=3, now=1007.0)["devices"][0]["utilization"]["min"] == [90.0] * 3


def test_a_store_must_keep_something():
    with pytest.raises(ValueError, match="at least 1 reading"):
        SeriesStore(0)
