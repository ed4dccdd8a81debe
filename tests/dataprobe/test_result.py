"""`DataProbeResult` and its trials: plain data, the median of the windows, the line to paste, `to_dict()` as
JSON."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jupyter_gpu.dataprobe.result import (
    CURRENT,
    LOADER,
    LOOP,
    SWEEP,
    VERIFY,
    DataProbeResult,
    StepAlone,
    Trial,
    WorkerMemory,
)
from jupyter_gpu.dataprobe.settings import LoaderSettings
from jupyter_gpu.models import Finding

CURRENT_SETTINGS = LoaderSettings(0)
FOUR = LoaderSettings(4, 2, persistent_workers=True, pin_memory=True)


def trial(rates: list[float], settings: LoaderSettings = FOUR, **changes: Any) -> Trial:
    fields: dict[str, Any] = dict(settings=settings, stage=SWEEP, mode=LOOP, rates=rates, first_batch_seconds=0.25)
    fields.update(changes)
    return Trial(**fields)


def probe(**changes: Any) -> DataProbeResult:
    current = trial([400.0, 410.0, 420.0], CURRENT_SETTINGS, stage=CURRENT, wait_fraction=0.7)
    best = trial([1500.0, 1400.0, 1600.0], wait_fraction=0.05,
                 worker_memory=WorkerMemory(workers=4, rss_bytes=300 << 20, private_bytes=20 << 20))
    fields: dict[str, Any] = dict(
        loader_name="train_loader", step_name="train_step", device="cuda:0", current=CURRENT_SETTINGS,
        batch_size=64, dataset_len=50_000, cpus=8, loader_alone=trial([900.0], CURRENT_SETTINGS, stage=CURRENT,
                                                                       mode=LOADER),
        step_alone=StepAlone(rates=[2000.0, 2100.0], step_seconds=0.031, device="cuda:0"), together=current,
        verdict="input-bound", wait_fraction=0.7, perfect_loader_speedup=5.0, trials=[current, best,
                                                                                    trial([1480.0], stage=VERIFY)],
        recommended=FOUR.kwargs(), recommended_settings=FOUR, predicted=1500.0, verified=1480.0, best=1500.0,
        speedup=1480.0 / 410.0, pitfalls=[Finding("SHM_TOO_SMALL", "warn", "/dev/shm is 64 MiB")],
        restored=["RNG", "model"], seconds=33.0)
    fields.update(changes)
    return DataProbeResult(**fields)


def test_a_trials_rate_is_the_median_window_and_its_spread_the_extremes() -> None:
    measured = trial([300.0, 1200.0, 500.0, 480.0])
    assert measured.samples_per_second == 490.0
    assert measured.spread == (300.0, 1200.0)


def test_a_trial_without_windows_has_no_rate() -> None:
    failed = trial([], error="worker exited unexpectedly")
    assert failed.samples_per_second is None and failed.spread is None


def test_the_step_alones_rate_is_its_median_window() -> None:
    assert StepAlone([10.0, 30.0, 20.0], step_seconds=0.1, device="cpu").samples_per_second == 20.0
    assert StepAlone([], step_seconds=0.0, device="cpu").samples_per_second is None


def test_the_mode_follows_whether_a_step_was_given() -> None:
    assert probe().mode == LOOP
    assert probe(step_name=None).mode == LOADER


def test_code_is_the_recommendation_under_the_users_loader_name() -> None:
    assert probe().code() == ("train_loader = DataLoader(..., num_workers=4, pin_memory=True, persistent_workers=True)"
                              "  # keep your other arguments")


@pytest.mark.parametrize("changes", [{"recommended_settings": None, "recommended": None},
                                     {"recommended_settings": LoaderSettings(0, 4, True)}])  # == the current one
def test_no_code_when_there_is_nothing_to_change(changes: dict[str, Any]) -> None:
    assert probe(**changes).code() is None
    assert "DataLoader(" not in str(probe(**changes))


def test_summary_and_repr_are_one_short_line() -> None:
    result = probe()
    assert result.summary() == ("dataprobe train_loader: input-bound; recommended 4 workers · prefetch 2 · persistent"
                                " · pinned, 3.61x")
    assert repr(result) == f"<DataProbeResult: {result.summary()}>"
    assert probe(step_name=None, verdict=None, recommended_settings=None, speedup=None).summary() == (
        "dataprobe train_loader")


def test_to_dict_is_json_serialisable_and_round_trips_the_numbers() -> None:
    result = probe()
    data = json.loads(json.dumps(result.to_dict()))
    assert data["verdict"] == "input-bound" and data["wait_fraction"] == 0.7
    assert data["recommended"] == {"num_workers": 4, "pin_memory": True, "prefetch_factor": 2,
                                   "persistent_workers": True}
    assert data["recommended_settings"] == FOUR.to_dict() and data["current"] == CURRENT_SETTINGS.to_dict()
    assert data["code"] == result.code()
    assert [t["samples_per_second"] for t in data["trials"]] == [410.0, 1500.0, 1480.0]
    assert data["trials"][1]["worker_memory"] == {"workers": 4, "rss_bytes": 300 << 20, "private_bytes": 20 << 20}
    assert data["step_alone"]["samples_per_second"] == 2050.0
    assert data["pitfalls"][0]["code"] == "SHM_TOO_SMALL"
    assert data["restored"] == ["RNG", "model"] and data["interrupted"] is False


def test_to_dict_of_a_probe_without_a_step_is_json_too() -> None:
    data = json.loads(json.dumps(probe(step_name=None, step_alone=None, together=None, verdict=None,
                                       wait_fraction=None, perfect_loader_speedup=None).to_dict()))
    assert data["step_alone"] is None and data["together"] is None and data["verdict"] is None


def test_str_and_html_come_from_the_dataprobe_renderer() -> None:
    result = probe()
    assert str(result).startswith("dataprobe train_loader: input-bound: the step waited for data 70% of the loop")
    assert result.code() in str(result)
    assert 'class="jupyter-gpu-dataprobe"' in result._repr_html_()
