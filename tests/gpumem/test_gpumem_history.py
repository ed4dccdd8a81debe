"""Which cell made memory grow, and which cell leaks: the pure rules over %gpumem --watch's records."""

from __future__ import annotations

from jupyter_gpu.gpumem.history import LEAK_BYTES, cell_key, cell_label, find_leaks, new_entries
from jupyter_gpu.gpumem.result import CellRecord

MIB = 1024 * 1024


def records(*cells: tuple[str, int]) -> list[CellRecord]:
    """A baseline, then one record per (cell source, bytes allocated after it)."""
    made = [CellRecord(0, "(watching started)", cell_key(""), (("cpu", 10 * MIB),), ())]
    for count, (source, allocated) in enumerate(cells, start=1):
        made.append(CellRecord(count, cell_label(source), cell_key(source), (("cpu", allocated),), (),
                               new_entries=((f"losses[{count}]", MIB),)))
    return made


def test_a_cell_that_grows_every_time_it_runs_is_a_leak_naming_what_its_last_run_added() -> None:
    leaking = "losses.append(model(x).sum())"
    [leak] = find_leaks(records((leaking, 12 * MIB), ("x = 1", 12 * MIB), (leaking, 14 * MIB), (leaking, 16 * MIB)))
    assert leak.cell == leaking and leak.runs == (1, 3, 4) and leak.growth == (2 * MIB, 2 * MIB, 2 * MIB)
    assert leak.new_entries == (("losses[4]", MIB),)


def test_a_cell_that_grows_once_or_runs_once_is_not_a_leak() -> None:
    assert find_leaks(records(("model = Net()", 50 * MIB), ("model = Net()", 50 * MIB))) == []
    assert find_leaks(records(("big = torch.randn(10**7)", 50 * MIB))) == []


def test_growth_below_the_threshold_is_not_a_leak() -> None:
    small = LEAK_BYTES // 2
    assert find_leaks(records(("step += 1", 10 * MIB + small), ("step += 1", 10 * MIB + 2 * small))) == []


def test_an_edited_cell_is_a_new_cell() -> None:
    assert cell_key("a = 1\n") == cell_key("  a = 1")
    assert cell_key("a = 1") != cell_key("a = 2")
    assert find_leaks(records(("keep.append(t)", 12 * MIB), ("keep.append(t) ", 14 * MIB))) != []
    assert find_leaks(records(("keep.append(t)", 12 * MIB), ("keep.append(t2)", 14 * MIB))) == []


def test_the_label_is_the_first_line_shortened() -> None:
    assert cell_label("\n\n  for x in loader:\n    step(x)") == "for x in loader:"
    assert cell_label("y" * 100).endswith("…") and len(cell_label("y" * 100)) == 60


def test_new_entries_are_the_largest_storages_that_were_not_there_before() -> None:
    before = {("cpu", 1): ("model.weight", 4 * MIB)}
    after = {**before, ("cpu", 2): ("a", MIB), ("cpu", 3): ("b", 3 * MIB), ("cpu", 4): ("c", 2 * MIB),
             ("cpu", 5): ("d", 10)}
    assert new_entries(before, after) == (("b", 3 * MIB), ("c", 2 * MIB), ("a", MIB))
