"""%gpupanel in a real IPython shell: options, one thread for many panels, close and unload leave nothing."""

from __future__ import annotations

import time

import ipywidgets
import pytest
from IPython.core.error import UsageError
from threads import sampler_threads

pytestmark = pytest.mark.usefixtures("simulated")


@pytest.fixture
def simulated(monkeypatch):
    monkeypatch.setenv("JUPYTER_GPU_BACKEND", "simulated:h200-busy")



def panel_magics(ip):
    return ip.magics_manager.registry["GpuPanelMagics"]


def our_callbacks(ip) -> list[str]:
    """The cell hooks jupyter_gpu registered (the panels' and %gpucheck's cell recorder)."""
    return [getattr(c, "__qualname__", repr(c)) for event in ("pre_run_cell", "post_run_cell")
            for c in ip.events.callbacks[event] if getattr(c, "__module__", "").startswith("jupyter_gpu")]


def test_gpupanel_displays_a_live_panel_with_stable_text(ip, capsys):
    panel = ip.run_line_magic("gpupanel", "--interval 0.2 --history 30 -o")
    assert "GpuPanel(simulated:h200-busy [simulated]: 1 GPU, every 0.2 s, 30 samples)" in capsys.readouterr().out
    bundle = panel._repr_mimebundle_()
    assert bundle["text/plain"] == repr(panel) and "application/vnd.jupyter.widget-view+json" in bundle
    assert panel.rows[0].utilization.value >= 95 and len(sampler_threads()) == 1


def test_many_panels_one_thread_and_close_leaves_no_thread_or_callback(ip):
    before = ip.magics_manager.registry["GpuPanelMagics"]
    assert before is not None
    panels = [ip.run_line_magic("gpupanel", "--interval 0.1 -o") for _ in range(4)]
    assert len(sampler_threads()) == 1
    assert all(p.history for p in panels)
    ip.run_line_magic("gpupanel", "--close")
    assert all(p.closed for p in panels) and sampler_threads() == []
    assert panel_magics(ip).panels == []


def test_unload_stops_every_panel_thread_and_cell_hook(ip):
    hooks = our_callbacks(ip)
    panels = [ip.run_line_magic("gpupanel", "-o") for _ in range(3)]
    widgets_open = len(ipywidgets.widgets.widget._instances)
    assert widgets_open > 0 and len(sampler_threads()) == 1
    ip.run_line_magic("unload_ext", "jupyter_gpu")
    try:
        assert all(p.closed for p in panels) and sampler_threads() == []
        assert len(hooks) == 2, hooks  # pre and post of the one cell recorder %gpupanel and %gpucheck share
        assert our_callbacks(ip) == [], "the pre/post_run_cell hooks are unregistered"
        assert len(ipywidgets.widgets.widget._instances) == 0
    finally:
        ip.run_line_magic("load_ext", "jupyter_gpu")  # the fixture unloads again


def test_rerunning_a_cell_replaces_its_panel(ip):
    ip.run_cell("panel_a = %gpupanel -o", cell_id="cell-1")
    first = ip.user_ns["panel_a"]
    ip.run_cell("panel_b = %gpupanel -o", cell_id="cell-1")
    assert first.closed and not ip.user_ns["panel_b"].closed
    ip.run_cell("panel_c = %gpupanel -o", cell_id="cell-2")
    assert len(panel_magics(ip).panels) == 2


def test_the_panel_knows_when_a_cell_is_running(ip):
    # The "GPU idle while a cell runs" alert needs this; its rule is tested in tests/metrics/test_alerts.py.
    panel = ip.run_line_magic("gpupanel", "-o")
    ip.user_ns["panel"] = panel
    ip.run_cell("during = panel._cell_started()")
    assert ip.user_ns["during"] is not None and time.time() - ip.user_ns["during"] < 5
    assert panel._cell_started() is None


@pytest.mark.parametrize(("line", "message"), [
    ("--interval 0.01", "--interval must be a number of seconds, at least 0.1"),
    ("--interval soon", "--interval needs a number of seconds"),
    ("--history 1", "--history must be at least 2"),
    ("--devices 1-x", "--devices takes GPU indices like 0,2 or 0-3"),
    ("--devices 3", "there is no GPU 3 here; NVML lists GPUs 0"),
    ("extra", "Unrecognized arguments: extra"),
])
def test_bad_input_is_one_sentence(ip, line, message):
    with pytest.raises(UsageError, match=message):
        ip.run_line_magic("gpupanel", line)
    assert sampler_threads() == [], "a refused panel leaves no thread"


def test_unknown_backend_is_a_usage_error(ip, monkeypatch):
    monkeypatch.setenv("JUPYTER_GPU_BACKEND", "simulated:nonesuch")
    before = len(ipywidgets.widgets.widget._instances)
    with pytest.raises(UsageError, match=r"Unknown simulated scenario 'nonesuch'.*JUPYTER_GPU_BACKEND"):
        ip.run_line_magic("gpupanel", "")
    assert len(ipywidgets.widgets.widget._instances) == before, "the refused panel's widgets are closed"


def test_gputime_shares_the_panels_thread_and_gives_the_rate_back(ip):
    panel = ip.run_line_magic("gpupanel", "-o")
    hub = panel._lease.hub
    ip.user_ns.update(hub=hub, seen=[])
    ip.run_cell_magic("gputime", "-q", "import threading, time\n"
                      "time.sleep(0.4)\n"
                      "seen.append((sum(t.name == 'jupyter-gpu-sampler' for t in threading.enumerate()),"
                      " hub.sampler.interval))")
    assert ip.user_ns["seen"] == [(1, 0.1)], "%%gputime leased the panel's thread at its own faster rate"
    assert hub.sampler.interval == 1.0 and hub.leases == 1 and not panel.closed
