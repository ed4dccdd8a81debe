"""gpuprofile/line_time.py on its own: a loop whose lines take known times (sleeps), stepped by hand, with one
line's time inside a bucket (a stand-in for a forward), which must stay the bucket's. The loops from public sources
are in test_neighbours_other_time.py."""

from __future__ import annotations

import sys
import time

from jupyter_gpu.gpuprofile.line_time import LineClock, measure_event_costs, other_time_advice
from jupyter_gpu.gpuprofile.timeline import Timeline
from jupyter_gpu.probekit.library_code import library_code_prefixes

LOOP = """
def get_batch():
    time.sleep(0.002)
    return 1

def run(steps, clock, timeline):
    for step in range(steps):
        if step == 1:
            clock.start(sys._getframe())  # as the profile does: at a step boundary, inside the loop
        batch = get_batch()
        timeline.enter("forward")
        time.sleep(0.003)
        timeline.leave()
        print_me = f"step {step}"
        clock_hit = clock.boundary(sys._getframe()) if clock.active else False
        if clock_hit:
            clock.stop()
        timeline.boundary()
"""


def test_a_lines_time_is_its_own_other_time_and_a_bucket_keeps_its_own() -> None:
    namespace = {"time": time, "sys": sys}
    exec(compile(LOOP, "<ipython-input-1-line-time>", "exec"), namespace)
    timeline = Timeline()
    clock = LineClock(timeline, library_code_prefixes(), steps=3)
    try:
        namespace["run"](6, clock, timeline)
    finally:
        clock.stop()
    assert sys.gettrace() is None and clock.steps == 3
    found, taken = clock.lines(lambda file, line: LOOP.splitlines()[line - 1].strip() if file.startswith("<") else "",
                               measure_event_costs(library_code_prefixes()))
    by_source = {line.source: line for line in found}
    batch = by_source["batch = get_batch()"]
    assert 0.0018 <= batch.seconds <= 0.006, batch
    assert batch.inside and batch.inside[0].source == "time.sleep(0.002)" and batch.inside[0].function == "get_batch"
    assert by_source["time.sleep(0.003)"].seconds < 0.0005  # the bucket's, not the line's
    assert found[0] is batch and taken >= 0.0
    command, detail = other_time_advice(found, batch.seconds * 1.1)
    assert "`batch = get_batch()`" in command and "print" not in command + detail, (command, detail)
