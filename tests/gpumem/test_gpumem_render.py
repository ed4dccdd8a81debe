"""What a user reads after `%gpumem`: the memory map (grouped rows, largest first, the rest summed, the remainders
with their advice), a release (what was given back, what is still held and by whom), and the per-cell history
(growth, leaks), in text and escaped HTML.

The results are plain data, so they are built here by hand; no torch.
"""

from __future__ import annotations

import pytest

from jupyter_gpu.gpumem.render import render_html, render_text
from jupyter_gpu.gpumem.result import (
    CellRecord,
    DeviceLevel,
    DeviceTotals,
    FreeReport,
    Leak,
    MemoryEntry,
    MemoryHistory,
    MemoryMap,
    Remainder,
    StillHeld,
)
from jupyter_gpu.rendering.kit import COLOUR

MIB = 1 << 20
GIB = 1 << 30
HOSTILE_PATH = "d['<script>alert(1)</script>']"
HOSTILE_CELL = "x = '<script>alert(2)</script>'"


def entry(path: str, size: int, *, kind: str = "user variable", device: str = "cuda:0", shape: tuple[int, ...] = (4,),
          names: tuple[str, ...] = (), more_names: int = 0) -> MemoryEntry:
    return MemoryEntry(path, kind, device, "float32", shape, size, (path, *names), more_names)


def cuda(named: int, total: int | None = 2 * GIB, **changes: int) -> DeviceTotals:
    return DeviceTotals("cuda:0", named, total, "allocated", **changes)


def memory_map(*entries: MemoryEntry, top: int = 20, **changes: object) -> MemoryMap:
    devices = changes.pop("devices", (cuda(sum(e.bytes for e in entries)),))
    return MemoryMap(entries=entries, devices=devices, top=top, **changes)


def table_row(text: str, name: str) -> str:
    """The one table line that starts with `name` (table lines are indented by two spaces)."""
    rows = [line for line in text.splitlines() if line.startswith(f"  {name} ")]
    assert len(rows) == 1, text
    return rows[0]


def record(count: int, cell: str, allocated: int, new: tuple[tuple[str, int], ...] = ()) -> CellRecord:
    return CellRecord(count, cell, f"key-{cell}", (("cuda:0", allocated),), (("cuda:0", allocated),), new)


# -- the memory map -----------------------------------------------------------------------------------------------

def test_the_verdict_line_is_each_devices_headline() -> None:
    result = memory_map(entry("w", GIB), devices=(cuda(GIB, 2 * GIB), DeviceTotals("cpu", 4 * MIB, None, "live")))
    first = render_text(result).splitlines()[0]
    assert first == "gpumem: cuda:0: 1.0 GiB named of 2.0 GiB allocated (50%); cpu: 4.0 MiB named (live unknown)"


def test_storages_with_the_same_path_become_one_row_with_their_count_and_summed_bytes() -> None:
    graph = [entry("graph of loss", 2 * MIB, kind="autograd graph") for _ in range(14)]
    text = render_text(memory_map(*graph, entry("graph of loss", MIB, kind="autograd graph", device="cpu")))
    row = table_row(text, "graph of loss  autograd graph  cuda:0")
    assert "14 tensors" in row and "28.0 MiB" in row
    # The same path on another device is another row, not summed in.
    assert "1.0 MiB" in table_row(text, "graph of loss  autograd graph  cpu")


def test_rows_are_ordered_by_bytes_largest_first_with_the_shape_written_out() -> None:
    text = render_text(memory_map(entry("small", MIB), entry("big", 64 * MIB, shape=(256, 1024)),
                                  *[entry("grouped", 30 * MIB) for _ in range(3)]))
    names = [line.split()[0] for line in text.splitlines()[2:5]]
    assert names == ["grouped", "big", "small"]
    assert "256×1024" in table_row(text, "big")


def test_top_cuts_the_table_and_the_last_line_sums_what_was_left_out() -> None:
    entries = [entry(f"t{index}", (10 - index) * MIB) for index in range(6)]
    text = render_text(memory_map(*entries, top=2))
    assert "t0" in text and "t1" in text and "t2 " not in text
    assert "… and 4 more entries, 26.0 MiB" in text.splitlines()  # 8 + 7 + 6 + 5 MiB


def test_the_other_names_of_a_storage_are_shown_shortened_with_the_count_of_the_rest() -> None:
    names = tuple(f"optimizer.state[{index}]['exp_avg_sq_long_name']" for index in range(3))
    text = render_text(memory_map(entry("model.fc.weight", MIB, kind="parameter", names=("w", *names), more_names=5)))
    row = table_row(text, "model.fc.weight")
    also = row.split("1.0 MiB", 1)[1].strip()
    assert also.startswith("w, optimizer.state[0]")
    assert also.endswith("… +5 more")
    assert len(also) <= 60 + len(" +5 more")


def test_remainders_and_their_advice_sit_under_their_own_device() -> None:
    result = memory_map(
        entry("w", GIB), entry("c", MIB, device="cpu"),
        devices=(cuda(GIB, GIB, reserved_bytes=3 * GIB), DeviceTotals("cpu", MIB, 9 * MIB, "live CPU storages")),
        remainders=(Remainder("cuda:0", "the allocator's cache", 2 * GIB, "%gpumem --free cache"),
                    Remainder("cpu", "not reachable from Python", 8 * MIB)))
    lines = render_text(result).splitlines()
    cuda_at = lines.index("cuda:0: 1.0 GiB named of 1.0 GiB allocated (100%)")
    cpu_at = lines.index("cpu: 1.0 MiB named of 9.0 MiB live CPU storages (11%)")
    assert lines[cuda_at + 1:cpu_at] == ["  + 2.0 GiB the allocator's cache", "    → %gpumem --free cache"]
    assert lines[cpu_at + 1] == "  + 8.0 MiB not reachable from Python"


def test_a_device_whose_total_is_unknown_still_renders_its_entries_notes_and_footer() -> None:
    result = memory_map(entry("x", 3 * MIB, device="cpu"), devices=(DeviceTotals("cpu", 3 * MIB, None, "live"),),
                        notes=("the walk stopped at depth 6",), objects_visited=12345, seconds=0.012)
    lines = render_text(result).splitlines()
    assert "3.0 MiB" in table_row("\n".join(lines), "x")
    assert "note: the walk stopped at depth 6" in lines
    assert lines[-1] == "walked 12,345 objects in 12.0 ms"


def test_an_empty_map_says_there_are_no_tensors_and_keeps_its_notes() -> None:
    lines = render_text(MemoryMap(entries=(), devices=(), notes=("CUDA is not initialised",))).splitlines()
    assert lines[0] == "gpumem: no tensors in this notebook"
    assert lines[1] == "note: CUDA is not initialised"
    assert not any(line.startswith("  name") for line in lines)  # no empty table


# -- a release ----------------------------------------------------------------------------------------------------

def test_a_release_says_what_it_gave_back_on_each_device_that_changed() -> None:
    result = FreeReport("outputs", before=(DeviceLevel("cuda:0", 3 * GIB), DeviceLevel("cpu", 8 * MIB)),
                        after=(DeviceLevel("cuda:0", GIB), DeviceLevel("cpu", 8 * MIB)), released=("Out[3]", "_3"))
    lines = render_text(result).splitlines()
    assert lines[0] == "gpumem --free outputs: gave back 2.0 GiB on cuda:0"
    assert "-2.0 GiB" in table_row("\n".join(lines), "cuda:0")
    assert "released: Out[3], _3" in lines


def test_a_release_shows_what_stays_who_holds_it_and_what_to_type_next_time() -> None:
    result = FreeReport("x", before=(DeviceLevel("cuda:0", 2 * GIB, 3 * GIB),),
                        after=(DeviceLevel("cuda:0", GIB, 3 * GIB),), released=("x",),
                        still_held=(StillHeld("Out[4]", GIB, ("y", "opt.param_groups[0]['params'][0]")),),
                        next_time=("end the line with ;",), notes=("the traceback was already cleared",))
    text = render_text(result)
    lines = text.splitlines()
    assert lines[0] == "gpumem --free x: gave back 1.0 GiB on cuda:0; 1 still held (see below)"
    assert "still held: Out[4] (1.0 GiB) by y, opt.param_groups[0]['params'][0]" in lines
    assert "next time: end the line with ;" in lines
    assert "note: the traceback was already cleared" in lines
    assert lines[1].split()[-2:] == ["reserved", "after"]  # reserved columns when the device has them


def test_a_release_that_changed_nothing_says_so() -> None:
    level = (DeviceLevel("cuda:0", GIB),)
    result = FreeReport("traceback", before=level, after=level)
    assert render_text(result).splitlines()[0] == "gpumem --free traceback: nothing was given back"
    assert "reserved" not in render_text(result)


def test_emptying_the_cache_reports_the_reserved_memory_it_returned() -> None:
    result = FreeReport("cache", before=(DeviceLevel("cuda:0", GIB, 4 * GIB),),
                        after=(DeviceLevel("cuda:0", GIB, GIB),))
    assert render_text(result).splitlines()[0] == "gpumem --free cache: gave back 3.0 GiB of reserved memory on cuda:0"


# -- the history --------------------------------------------------------------------------------------------------

def test_the_history_shows_each_cells_growth_with_its_sign() -> None:
    result = MemoryHistory((record(1, "model = Net().cuda()", 100 * MIB),
                            record(2, "x = torch.randn(1024, 1024)", 112 * MIB, (("x", 4 * MIB), ("y", MIB),
                                                                                ("z", MIB), ("w", MIB))),
                            record(3, "del y", 109 * MIB), record(4, "print(x.shape)", 109 * MIB)), watching=True)
    text = render_text(result)
    assert text.splitlines()[0] == "gpumem history: 4 cells recorded — watching"
    assert table_row(text, "In [1]").rstrip().endswith("100.0 MiB")  # no previous cell: no change shown
    assert "+12.0 MiB  x (4.0 MiB), y (1.0 MiB), z (1.0 MiB) +1 more" in table_row(text, "In [2]")
    assert "-3.0 MiB" in table_row(text, "In [3]")
    assert table_row(text, "In [4]").rstrip().endswith("0 B")


def test_a_cell_that_grows_every_run_gets_a_leak_paragraph_and_a_hint() -> None:
    leak = Leak("losses.append(loss)", "k", runs=(3, 5, 7), growth=(4 * MIB, 4 * MIB, 5 * MIB),
                new_entries=(("losses[2]", 4 * MIB), ("graph of losses[2]", MIB)))
    result = MemoryHistory((record(3, "losses.append(loss)", 4 * MIB), record(5, "losses.append(loss)", 8 * MIB)),
                           leaks=(leak,))
    lines = render_text(result).splitlines()
    assert lines[0] == "gpumem history: 2 cells recorded; 1 cell keeps growing"
    assert ("leak? cell `losses.append(loss)` grew every time it ran: +4.0 MiB, +4.0 MiB, +5.0 MiB "
            "(runs In [3], In [5], In [7]); its last run added: losses[2] (4.0 MiB), graph of losses[2] (1.0 MiB)"
            ) in lines
    assert "  keep only what you need (`losses.append(loss.item())`, not the tensor)" in lines


def test_a_long_cell_line_is_shortened_in_the_table() -> None:
    cell = "for step in range(1000): loss = model(batch).sum(); loss.backward()"
    row = table_row(render_text(MemoryHistory((record(1, cell, MIB),))), "In [1]")
    assert "for step in range(1000): loss = model(b…" in row and "backward" not in row


def test_an_empty_history_says_how_to_start_recording() -> None:
    assert render_text(MemoryHistory(())) == ("gpumem history: nothing recorded yet; %gpumem --watch records memory "
                                             "after every cell")


# -- HTML, repr, dispatch -----------------------------------------------------------------------------------------

def test_html_escapes_hostile_paths_cells_holders_and_notes() -> None:
    hostile_map = memory_map(entry(HOSTILE_PATH, MIB, names=(HOSTILE_PATH + "[0]",)), notes=(HOSTILE_CELL,),
                             remainders=(Remainder("cuda:0", "cache", 2 * MIB, HOSTILE_CELL),))
    release = FreeReport(HOSTILE_PATH, before=(DeviceLevel("cuda:0", GIB),), after=(DeviceLevel("cuda:0", GIB),),
                         still_held=(StillHeld(HOSTILE_PATH, MIB, (HOSTILE_CELL,)),), next_time=(HOSTILE_CELL,))
    history = MemoryHistory((record(1, HOSTILE_CELL, MIB, ((HOSTILE_PATH, MIB),)),),
                            leaks=(Leak(HOSTILE_CELL, "k", (1, 2), (MIB, MIB), ((HOSTILE_PATH, MIB),)),))
    for result in (hostile_map, release, history):
        html = render_html(result)
        assert "<script>" not in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "&lt;script&gt;alert(2)" in html


def test_html_marks_the_leak_warning_and_keeps_the_map_compact() -> None:
    leak = Leak("losses.append(loss)", "k", (3, 5), (MIB, MIB))
    html = render_html(MemoryHistory((record(3, "losses.append(loss)", MIB),), leaks=(leak,)))
    warning = html.split("leak? cell", 1)[0].rsplit("<div", 1)[1]
    assert COLOUR["warn"] in warning
    map_html = render_html(memory_map(*[entry("g", MIB) for _ in range(3)], entry("h", MIB)))
    assert map_html.count("<tr>") == 3  # headings, the grouped row, the single row
    assert "3 tensors" in map_html


@pytest.mark.parametrize("result", [
    memory_map(entry("w", GIB)),
    FreeReport("outputs", before=(DeviceLevel("cuda:0", 2 * GIB),), after=(DeviceLevel("cuda:0", GIB),)),
    MemoryHistory((record(1, "x = 1", MIB),)),
], ids=["map", "free", "history"])
def test_each_result_prints_through_this_renderer_and_reprs_as_one_short_line(result: object) -> None:
    assert str(result) == render_text(result)
    assert result._repr_html_() == render_html(result)
    text = repr(result)
    assert "\n" not in text and len(text) < 120 and text.startswith(f"<{type(result).__name__}: gpumem")


def test_render_refuses_what_it_does_not_know() -> None:
    with pytest.raises(TypeError, match="gpumem cannot render a str"):
        render_text("not a result")
