"""`%gpucells`' pure part: which recorded cells are flagged, and how the log reads (text and escaped HTML)."""

from __future__ import annotations

from jupyter_gpu.gpucells.log import build_log
from jupyter_gpu.gpucells.result import IDLE_GPU, MEMORY_GROWS, SLOWEST
from jupyter_gpu.memory_growth import LEAK_BYTES, cell_key

MIB = 1 << 20
T0 = 1_700_000_000.0


def record(count: int, source: str, seconds: float, **gpu: object) -> dict[str, object]:
    started = T0 + 100 * count
    return {"execution_count": count, "started": started, "ended": started + seconds, "cell": source,
            "cell_key": cell_key(source), **gpu}


def codes(log, count):
    return [flag.code for row in log.rows if row.execution_count == count for flag in row.flags]


def test_a_cell_that_held_the_gpu_and_kept_it_idle_is_flagged_with_what_to_run():
    idle = record(1, "train()", 40.0, gpu_busy=3.0, readings=40, reserved_after=2 << 30, gpu_seconds=0.5)
    busy = record(2, "train()", 40.0, gpu_busy=85.0, readings=40, reserved_after=2 << 30, gpu_seconds=39.0)
    log = build_log([idle, busy], cuda_now=True, sampler_running=True)
    assert codes(log, 1)[0] == IDLE_GPU and IDLE_GPU not in codes(log, 2)
    message = log.rows[0].flags[0].message
    assert "3% busy" in message and "40.0 s" in message and "%%gpuprofile" in message


def test_idle_is_not_said_without_enough_readings_a_long_cell_or_a_held_gpu():
    records = [record(1, "a", 40.0, gpu_busy=2.0, readings=2, reserved_after=MIB),   # two readings say little
               record(2, "b", 3.0, gpu_busy=2.0, readings=30, reserved_after=MIB),   # a short cell
               record(3, "c", 40.0, gpu_busy=2.0, readings=40, reserved_after=0),    # holds nothing
               record(4, "d", 40.0, gpu_busy=2.0, readings=40, pid_listed=True)]     # NVML lists the kernel
    log = build_log(records, cuda_now=False, sampler_running=True)
    assert [IDLE_GPU in codes(log, n) for n in (1, 2, 3, 4)] == [False, False, False, True]


def test_memory_that_grew_every_run_of_a_cell_is_flagged_with_the_same_rule_as_gpumem_watch():
    grows = [record(n, "losses.append(loss)", 1.0, left_behind=4 * MIB) for n in (1, 3, 5)]
    once = [record(2, "model = Net().cuda()", 1.0, left_behind=500 * MIB),
            record(4, "model = Net().cuda()", 1.0, left_behind=0)]
    small = [record(n, "step += 1", 0.1, left_behind=LEAK_BYTES - 1) for n in (6, 7)]
    log = build_log(sorted(grows + once + small, key=lambda r: r["execution_count"]), cuda_now=True,
                    sampler_running=False)
    flagged = {row.execution_count for row in log.rows if MEMORY_GROWS in [f.code for f in row.flags]}
    assert flagged == {1, 3, 5}
    message = next(f.message for f in log.rows[0].flags if f.code == MEMORY_GROWS)
    assert "+4.0 MiB, +4.0 MiB, +4.0 MiB" in message and "%gpumem --history" in message


def test_runs_older_than_the_rows_shown_still_count_towards_growth():
    records = [record(n, "cache.append(x)", 0.1, left_behind=2 * MIB) for n in range(1, 4)]
    records += [record(n, f"y{n} = 1", 0.1) for n in range(4, 8)]
    records.append(record(8, "cache.append(x)", 0.1, left_behind=2 * MIB))
    log = build_log(records, 3, cuda_now=True, sampler_running=False)
    assert [row.execution_count for row in log.rows] == [6, 7, 8]
    assert codes(log, 8) == [MEMORY_GROWS] and log.recorded == 8


def test_cells_several_times_the_median_of_a_second_or_more_are_flagged():
    seconds = {1: 0.2, 2: 12.0, 3: 1.5, 4: 30.0, 5: 0.9, 6: 2.0}  # the median: 1.75 s
    log = build_log([record(n, f"c{n}", s) for n, s in seconds.items()], cuda_now=False, sampler_running=False)
    assert {row.execution_count for row in log.rows if SLOWEST in codes(log, row.execution_count)} == {2, 4}
    fast = build_log([record(n, f"c{n}", 0.3) for n in range(5)], cuda_now=False, sampler_running=False)
    assert not fast.flagged and str(fast).splitlines()[0] == "gpucells: the last 5 cells; none flagged"


def test_the_table_shows_each_figure_and_says_what_was_not_measured():
    records = [record(1, "x = 1", 0.01),
               record(2, "model = Net().cuda()", 2.5, cuda_started=True, gpu_seconds=None, peak_allocated=300 * MIB,
                      allocated_after=200 * MIB, left_behind=200 * MIB, reserved_after=320 * MIB),
               record(3, "loss = train_one_epoch(model)", 20.0, gpu_seconds=18.2, gpu_busy=87.0, readings=20,
                      peak_allocated=3 << 30, allocated_after=200 * MIB, left_behind=0, reserved_after=4 << 30)]
    log = build_log(records, cuda_now=True, sampler_running=True)
    text = str(log).splitlines()
    assert text[0] == "gpucells: the last 3 cells; none flagged"  # three cells: too few to call one slowest
    assert text[1].split() == ["In", "[n]", "cell", "wall", "GPU", "time", "GPU", "busy", "peak", "allocated",
                               "left", "behind", "flags"]
    first, started, trained = text[2:5]
    assert first.split()[-4:] == ["–", "–", "–", "–"]  # before CUDA: nothing but the wall time
    assert "CUDA started" in started and "300.0 MiB" in started and "+200.0 MiB" in started
    assert "18.2 s" in trained and "87%" in trained and "3.0 GiB" in trained
    assert not trained.rstrip().endswith("slowest")
    assert not any(line.startswith("note: CUDA is not initialised") for line in text)


def test_without_cuda_or_a_sampler_the_notes_say_why_the_columns_are_empty():
    log = build_log([record(1, "x = 1", 0.01)], cuda_now=False, sampler_running=False)
    notes = [line for line in str(log).splitlines() if line.startswith("note:")]
    assert "never starts CUDA" in notes[0] and notes[1].endswith("nothing does now")
    assert build_log([], cuda_now=False, sampler_running=False).rows == ()
    assert str(build_log([], cuda_now=False, sampler_running=False)).startswith("gpucells: no cell has finished")


def test_a_row_that_could_not_be_recorded_says_so_and_the_html_escapes_the_users_code():
    records = [record(1, "print('<b>&</b>')", 0.1, error="at the end: RuntimeError: boom")]
    log = build_log(records, cuda_now=True, sampler_running=False)
    assert "In [1]: not fully recorded (at the end: RuntimeError: boom); the cell itself ran normally" in str(log)
    html = log._repr_html_()
    assert "&lt;b&gt;&amp;&lt;/b&gt;" in html and "<b>&</b>" not in html
    assert log.to_dict()["rows"][0]["error"] == "at the end: RuntimeError: boom"
