"""GpuPanel with real ipywidgets objects (no browser): it follows the sampler, shares one thread, leaves
nothing behind, and says what is wrong.
"""

from __future__ import annotations

import os
import threading
import time

import ipywidgets
import pytest
from threads import sampler_threads, wait_for

from jupyter_gpu.metrics.backends.simulated import SimulatedBackend
from jupyter_gpu.metrics.hub import SamplerHub, close_shared_hubs
from jupyter_gpu.metrics.sample import DeviceSample, GpuProcess, Sample
from jupyter_gpu.metrics.sampler import THREAD_NAME
from jupyter_gpu.widgets.panel import GpuPanel

GIB = 1024**3
FAST = 0.1



def live_widgets() -> int:
    return len(ipywidgets.widgets.widget._instances)



class ScriptedBackend:
    """Returns whatever the test puts in `devices`/`status`; raises when `fail` is set (an NVML bug)."""

    name = "scripted"
    simulated = True

    def __init__(self) -> None:
        self.devices: tuple[DeviceSample, ...] = (gpu(),)
        self.status = "ok"
        self.message: str | None = None
        self.fail = False
        self.reads = 0

    def read(self) -> Sample:
        self.reads += 1
        if self.fail:
            raise RuntimeError("NVML_ERROR_UNKNOWN from a flaky driver")
        return Sample(time.time(), self.name, True, status=self.status, message=self.message, devices=self.devices)

    def close(self) -> None:
        pass


def gpu(index: int = 0, **values) -> DeviceSample:
    base = dict(index=index, name="NVIDIA H200", uuid=f"GPU-{index}", utilization_gpu=40.0, utilization_memory=20.0,
                memory_used=20 * GIB, memory_total=100 * GIB, temperature_c=50.0, power_w=300.0, power_limit_w=700.0,
                sm_clock_mhz=1980.0, processes=())
    base.update(values)
    return DeviceSample(**base)


@pytest.fixture(autouse=True)
def nothing_left_behind():
    before = live_widgets()
    yield
    close_shared_hubs()
    assert sampler_threads() == [], "a sampler thread outlived its panels"
    assert live_widgets() == before, "closed panels left widgets registered in the kernel"


@pytest.fixture
def backend() -> ScriptedBackend:
    return ScriptedBackend()


@pytest.fixture
def hub(backend: ScriptedBackend):
    hub = SamplerHub(lambda: backend)
    yield hub
    hub.close_all()  # a failed test's panels must not fail every later test


def test_bars_labels_and_sparklines_follow_the_sampler(hub, backend):
    panel = GpuPanel(hub, interval=FAST, history=50)
    row = panel.rows[0]
    for utilization, used in [(12.0, 30 * GIB), (87.0, 64 * GIB)]:
        backend.devices = (gpu(utilization_gpu=utilization, memory_used=used),)
        wait_for(lambda u=utilization: row.utilization.value == u)
        wait_for(lambda used=used: row.memory.value == pytest.approx(100 * used / (100 * GIB)))
    assert "87%" in row.utilization_line.value and "64.0 GiB of 100.0 GiB (64%)" in row.memory_line.value
    assert row.utilization_line.value.startswith("<svg") and "<polyline" in row.utilization_line.value
    assert "NVIDIA H200" in row.title.value and "50 °C" in row.title.value and "[simulated]" in row.title.value
    panel.close()


def test_updates_run_on_the_sampler_thread_not_the_kernels(hub, backend):
    panel = GpuPanel(hub, interval=FAST)
    threads: list[str] = []
    panel.rows[0].utilization.observe(lambda change: threads.append(threading.current_thread().name), "value")
    backend.devices = (gpu(utilization_gpu=77.0),)
    wait_for(lambda: threads)
    assert set(threads) == {THREAD_NAME}
    panel.close()


def test_history_stays_bounded(hub, backend):
    panel = GpuPanel(hub, interval=FAST, history=4)
    wait_for(lambda: backend.reads >= 9)
    assert len(panel.history) == 4
    assert panel.rows[0].utilization_line.value.count(",") == 4, "the sparkline draws the kept samples only"
    panel.close()


def test_many_panels_share_one_thread_and_the_last_close_stops_it(hub, backend):
    panels = [GpuPanel(hub, interval=FAST) for _ in range(6)]
    assert len(sampler_threads()) == 1 and hub.leases == 6
    wait_for(lambda: all(len(p.history) >= 2 for p in panels))
    for panel in panels[:-1]:
        panel.close()
    assert len(sampler_threads()) == 1
    seen = len(panels[0].history)
    panels[-1].close_button.click()  # what the user clicks
    assert panels[-1].closed and sampler_threads() == [] and hub.sampler is None
    time.sleep(3 * FAST)
    assert len(panels[0].history) == seen, "a closed panel is no longer fed"


def test_a_slow_panel_on_a_fast_hub_updates_at_its_own_rate(hub, backend):
    slow = GpuPanel(hub, interval=0.5)
    fast = GpuPanel(hub, interval=FAST)
    assert hub.sampler.interval == FAST
    time.sleep(1.3)
    assert len(fast.history) >= 8 and 2 <= len(slow.history) <= 4
    fast.close()
    assert hub.sampler.interval == 0.5
    slow.close()


def test_a_later_panel_starts_with_the_history_already_sampled(hub, backend):
    first = GpuPanel(hub, interval=FAST)
    wait_for(lambda: backend.reads >= 6)
    backend.devices = (gpu(memory_used=95 * GIB),)
    second = GpuPanel(hub, interval=FAST)
    assert len(second.history) >= 6
    # Its first reading is shown at once, alerts included, even right after the prefilled ones.
    assert second.latest is second.first and [a.code for a in second.alerts] == ["MEMORY_NEARLY_FULL"]
    first.close()
    second.close()


def test_this_kernels_memory_and_processes_are_marked(hub, backend):
    me = os.getpid()
    backend.devices = (gpu(memory_used=50 * GIB, processes=(GpuProcess(me, 12 * GIB), GpuProcess(31337, 30 * GIB))),)
    panel = GpuPanel(hub, interval=FAST)
    row = panel.rows[0]
    assert "this kernel 12.0 GiB" in row.memory_line.value
    assert f"<b>pid {me} (this kernel)</b> 12.0 GiB" in row.details.value
    assert "pid 31337 30.0 GiB" in row.details.value
    panel.close()


def test_alerts_colour_the_bars_and_show_their_message(hub, backend):
    me = os.getpid()
    backend.devices = (gpu(utilization_gpu=2.0, memory_used=95 * GIB, processes=(GpuProcess(me, 90 * GIB),)),)
    started = time.time() - 30  # a cell has been running for 30 s
    panel = GpuPanel(hub, interval=FAST, cell_started=lambda: started)
    wait_for(lambda: "GPU_IDLE_DURING_CELL" in [a.code for a in panel.alerts])
    row = panel.rows[0]
    assert row.memory.bar_style == "warning" and row.utilization.bar_style == "warning"
    assert "95% full" in row.details.value and "input pipeline or host-bound: see %gpucheck" in row.details.value
    panel.close()


def test_a_gpu_lost_mid_run_becomes_a_status_and_the_panel_keeps_going(hub, backend):
    backend.devices = (gpu(0), gpu(1))
    panel = GpuPanel(hub, interval=FAST)
    lost = DeviceSample(1, "NVIDIA H200", "GPU-1", status="lost", error="NVML reports GPU 1 is lost: reboot.")
    backend.devices = (gpu(0, utilization_gpu=91.0), lost)
    wait_for(lambda: "lost" in panel.rows[1].details.value)
    assert panel.rows[1].utilization.bar_style == "danger" and panel.rows[1].utilization_line.value == "n/a"
    wait_for(lambda: panel.rows[0].utilization.value == 91.0)  # the other GPU still updates
    assert len(sampler_threads()) == 1
    panel.close()


def test_an_nvml_error_mid_run_is_shown_and_the_panel_recovers(hub, backend):
    panel = GpuPanel(hub, interval=FAST)
    backend.fail = True
    wait_for(lambda: "NVML_ERROR_UNKNOWN" in panel.message.value)
    assert panel.body.children == ()
    backend.fail = False
    backend.devices = (gpu(utilization_gpu=66.0),)
    wait_for(lambda: panel.rows and panel.rows[0].utilization.value == 66.0)
    assert panel.message.value == "" and len(panel.body.children) == 1
    panel.close()


def test_no_gpu_shows_the_reason_and_the_gpucheck_verdict_not_an_empty_box(hub, backend):
    backend.status, backend.devices = "no_driver", ()
    backend.message = "NVML could not start: NVML Shared Library Not Found."
    panel = GpuPanel(hub, interval=FAST, verdict=lambda: "<b>%gpucheck: PyTorch is running on the CPU</b>")
    assert "NVML Shared Library Not Found" in panel.message.value
    wait_for(lambda: "%gpucheck: PyTorch is running on the CPU" in panel.verdict_box.value)
    assert repr(panel) == "GpuPanel(scripted [simulated]: no GPU to watch; the panel shows why and the fix)"
    panel.close()


def test_devices_option_shows_only_those(hub, backend):
    backend.devices = tuple(gpu(i) for i in range(4))
    panel = GpuPanel(hub, interval=FAST, devices=(1, 3))
    assert list(panel.rows) == [1, 3] and len(panel.body.children) == 2
    assert repr(panel) == "GpuPanel(scripted [simulated]: 2 GPUs, every 0.1 s, 60 samples)"
    panel.close()
    assert repr(panel) == "GpuPanel(closed)"


def test_nvml_names_are_escaped(hub, backend):
    backend.devices = (gpu(name="<img src=x onerror=alert(1)>"),)
    panel = GpuPanel(hub, interval=FAST)
    title = panel.rows[0].title.value
    assert "<img" not in title and "&lt;img src=x onerror=alert(1)&gt;" in title
    panel.close()


def test_fields_a_gpu_does_not_report_show_as_na_not_zero(hub, backend):
    backend.devices = (gpu(utilization_gpu=None, temperature_c=None, power_w=None, mig_enabled=True),)
    panel = GpuPanel(hub, interval=FAST)
    row = panel.rows[0]
    assert row.utilization_line.value.endswith("n/a (MIG on: not reported)")
    assert "n/a °C" in row.title.value and "n/a W" in row.title.value
    assert "<polyline" not in row.utilization_line.value, "no line is drawn through values that do not exist"
    panel.close()


def test_simulated_scenario_moves_on_its_own():
    hub = SamplerHub(lambda: SimulatedBackend("h200-busy"))
    panel = GpuPanel(hub, interval=FAST)
    wait_for(lambda: len({s.devices[0].power_w for s in panel.history}) >= 3)
    assert "[simulated]" in panel.heading.value
    panel.close()
