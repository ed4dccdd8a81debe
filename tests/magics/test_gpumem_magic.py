"""%gpumem in a real IPython shell: the report, the releases (what they free, what they must not, what they say),
the per-cell watch and its leak flag, and bad input as one sentence."""

from __future__ import annotations

import gc
import weakref

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

from jupyter_gpu.gpumem.result import FreeReport, MemoryHistory, MemoryMap
from jupyter_gpu.gpumem.roots import forget_outputs

MIB = 1024 * 1024


@pytest.fixture
def nb(ip: InteractiveShell) -> InteractiveShell:
    # Earlier tests' displayed values would be in the map too; `ip` drops their variables afterwards.
    forget_outputs(ip.user_ns, ip)
    ip.run_cell("import torch\nfrom torch import nn\ntorch.manual_seed(0);")
    yield ip
    ip.run_line_magic("gpumem", "--watch off -q")
    forget_outputs(ip.user_ns, ip)


def shown(captured) -> str:
    """The text the notebook shows: what was printed and the text of what was displayed."""
    return captured.stdout + "\n".join(output.data.get("text/plain", "") for output in captured.outputs)


def cell(ip: InteractiveShell, code: str) -> None:
    result = ip.run_cell(code, store_history=True)
    assert result.error_in_exec is None, result.error_in_exec


def test_the_report_shows_the_table_the_totals_and_escaped_html(nb: InteractiveShell) -> None:
    cell(nb, "model = nn.Linear(1024, 1024)\nweird = {'<b>x</b>': torch.randn(256, 256)}")
    with capture_output() as captured:
        result = nb.run_line_magic("gpumem", "")
    assert result is None
    text = shown(captured)
    assert text.startswith("gpumem: cpu: ") and "named of" in text
    assert "model.weight" in text and "parameter" in text and "1024×1024" in text
    html = captured.outputs[0].data["text/html"]
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "<b>x</b>" not in html


def test_o_returns_the_map_with_entries_coverage_and_a_dict(nb: InteractiveShell) -> None:
    cell(nb, "a = torch.randn(512, 512)\nb = a[:4]")
    memory = nb.run_line_magic("gpumem", "-o -q")
    assert isinstance(memory, MemoryMap)
    entry = memory.entry("a")
    assert (entry.kind, entry.device, entry.dtype, entry.shape, entry.bytes) == (
        "user variable", "cpu", "float32", (512, 512), 512 * 512 * 4)
    assert set(entry.names) >= {"a", "b"}
    assert memory.coverage["cpu"] is not None and memory.coverage["cpu"] > 0
    data = memory.to_dict()
    assert data["entries"][0]["path"] == memory.entries[0].path and "cpu" in data["coverage"]


def test_top_limits_the_rows_and_sums_the_rest(nb: InteractiveShell) -> None:
    cell(nb, "many = [torch.randn(64 + i, 64) for i in range(30)]")
    with capture_output() as captured:
        nb.run_line_magic("gpumem", "--top 5")
    assert "many[29]" in shown(captured) and "many[0] " not in shown(captured)
    assert "… and 25 more entries" in shown(captured)


def test_free_a_name_also_drops_ipythons_copies_but_names_what_another_variable_keeps(nb: InteractiveShell) -> None:
    cell(nb, "x = torch.randn(1024, 256)")
    cell(nb, "x")  # shown: Out, _N and _ hold it too
    cell(nb, "y = torch.randn(1024, 256)\nalias = y")
    ref_x, ref_y = weakref.ref(nb.user_ns["x"]), weakref.ref(nb.user_ns["y"])
    with capture_output() as captured:
        report = nb.run_line_magic("gpumem", "--free x y -o")
    gc.collect()
    assert isinstance(report, FreeReport)
    assert ref_x() is None  # del x alone would have left it in Out
    assert ref_y() is not None and "alias" in nb.user_ns  # another variable of the user's still needs it
    [still] = report.still_held
    assert still.path == "y" and "alias" in still.held_by
    assert report.freed_bytes("cpu") >= 1024 * 256 * 4
    assert "still held: y" in shown(captured) and "alias" in shown(captured)
    assert "%xdel x, y" in report.next_time


def test_free_outputs_keeps_a_variable_the_user_named_underscore(nb: InteractiveShell) -> None:
    cell(nb, "torch.randn(256, 256)")
    cell(nb, "_ = 'mine'")
    report = nb.run_line_magic("gpumem", "--free outputs -o -q")
    assert nb.user_ns["_"] == "mine"
    assert any(name.startswith("Out[") for name in report.released)


def test_free_model_alone_says_the_optimizer_still_holds_its_parameters(nb: InteractiveShell) -> None:
    cell(nb, "model = nn.Linear(512, 512)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)")
    report = nb.run_line_magic("gpumem", "--free model -o -q")
    assert report.freed_bytes() == 0
    assert {held.path for held in report.still_held} == {"model.weight", "model.bias"}
    assert all(held.held_by[0].startswith("opt.param_groups[0]") for held in report.still_held)
    assert "model" not in nb.user_ns and "opt" in nb.user_ns


def test_free_cache_on_a_kernel_without_cuda_says_there_is_nothing_to_return(nb: InteractiveShell) -> None:
    report = nb.run_line_magic("gpumem", "--free cache -o -q")
    assert report.freed_bytes() == 0 and "no GPU allocator cache" in " ".join(report.notes)


def test_watch_records_each_cell_and_history_flags_the_cell_that_keeps_growing(nb: InteractiveShell) -> None:
    cell(nb, "model = nn.Linear(256, 256)\nlosses = []")
    with capture_output() as captured:
        nb.run_line_magic("gpumem", "--watch")
    assert "watching" in captured.stdout
    cell(nb, "weights = torch.randn(512, 512)")  # grows once
    leaking = "losses.append(model(torch.randn(1024, 256)).sum())"  # keeps each graph: 1 MiB input per run
    cell(nb, leaking)
    cell(nb, "tmp = torch.randn(8)")
    cell(nb, leaking)
    cell(nb, leaking)
    history = nb.run_line_magic("gpumem", "--history -o -q")
    assert isinstance(history, MemoryHistory) and history.watching
    growth = {record.cell: size for record, size in history.growth()}
    assert growth["weights = torch.randn(512, 512)"] >= MIB
    [leak] = history.leaks
    assert leak.cell == leaking and len(leak.runs) == 3 and min(leak.growth) >= MIB
    assert any(path.startswith("graph of losses[") for path, _ in leak.new_entries)
    with capture_output() as captured:
        nb.run_line_magic("gpumem", "--history")
    assert "keeps growing" in shown(captured) and leaking[:30] in shown(captured)
    nb.run_line_magic("gpumem", "--watch off -q")
    cell(nb, "later = torch.randn(4)")
    assert len(nb.run_line_magic("gpumem", "--history -o -q").records) == len(history.records)


def test_a_failure_while_recording_never_breaks_the_users_cell(nb: InteractiveShell, monkeypatch) -> None:
    nb.run_line_magic("gpumem", "--watch -q")
    from jupyter_gpu.gpumem import watch

    def broken(*args, **kwargs):
        raise RuntimeError("walk exploded")
    monkeypatch.setattr(watch, "walk_notebook", broken)
    cell(nb, "fine = 1 + 1")
    assert nb.user_ns["fine"] == 2
    assert "walk exploded" in " ".join(nb.run_line_magic("gpumem", "--history -o -q").notes)


@pytest.mark.parametrize(("line", "message"), [
    ("--device tpu", "unknown device 'tpu'"),
    ("--device cuda", "CUDA is not initialised"),
    ("--top 0", "--top must be at least 1"),
    ("--free outputs --watch", "--free and --watch are separate requests"),
    ("--free nothing_here", "there is no variable 'nothing_here'"),
    ("--free outputs x", "--free outputs goes alone"),
    ("--watch sometimes", "invalid choice"),
])
def test_bad_input_is_one_sentence(ip: InteractiveShell, line: str, message: str) -> None:
    ip.run_cell("import torch")
    with pytest.raises(UsageError, match=message) as raised:
        ip.run_line_magic("gpumem", line)
    assert str(raised.value).startswith("%gpumem") and "\n" not in str(raised.value)
