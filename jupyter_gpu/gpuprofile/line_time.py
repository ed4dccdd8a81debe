"""Other host time by line: where the host time outside every named bucket (waiting for data, copies, forward,
backward, the optimizer step, syncs, collection) went, line by line of the loop and of the user's functions it calls.

`LINE_STEPS` more steps, the last the profile runs (after the counted step and, on CUDA, the kernel timeline), run
with Python's line events (`sys.settrace` on 3.11) in the user's own frames only: the timeline's clock is read at each
line of the user's code, and the other seconds it charges between two reads go to the line that ran, and to the lines
of the user's frames around it (so the loop's `X, Y = get_batch('train')` holds its function's time). Time inside a
bucket stays the bucket's, so a line's time is its own other time; no line events run inside a bucket (a model's
`forward`) or in library code (torch's `clip_grad_norm_` is timed as the user's line that called it). Each line's
figure is the interquartile mean over the traced steps, as the typical step's is.

What tracing costs, and how it is taken out: Python calls the trace function at every new frame (library frames too:
torch's `clip_grad_norm_` makes 177 Python calls on a 12-tensor model) and at every line of the user's frames; both are
counted where they happen, and their cost measured here (`measure_event_costs`: about 1.5 µs a line and 1.2 µs a
frame on a loaded 2-core CPU) is subtracted. Traced library code also runs slower bytecode (`clip_grad_norm_`: 640 µs
traced, 220 µs bare, its events taken out); that excess over the profiled steps' other time is subtracted by each
line's share of the frames, so a sleep keeps its time. The traced steps are not among the profiled ones: the
profile's figures carry none of it.
"""

from __future__ import annotations

import functools
import re
import sys
import time
from collections.abc import Callable
from typing import Any

from jupyter_gpu.gpuprofile.result import OtherLine, typical
from jupyter_gpu.rendering.units import format_seconds

# Traced steps after the profiled ones. Each line's figure is their interquartile mean, as the typical step's is: on a
# loaded 2-core machine one of three traced steps once woke from clipping's 1 ms sleep 4.7 ms late.
LINE_STEPS = 5
SHOWN_LINES = 3       # the plan names at most this many lines, each holding a tenth of the other time or more
INSIDE_LINES = 2      # and within each, the costliest lines of the user's functions it called
MIN_SHOWN_SECONDS = 20e-6

Place = tuple[int, str, int, str]  # (id of the frame, file, line, function)
Location = tuple[Place, ...]       # the user's frames, outermost first, each at its current line
Key = tuple[str, int, str]         # a line of code: (file, line, function)


# What a location spent: [seconds, line events in the user's frames, new frames the trace function saw]. A list,
# not a dataclass: a dataclass's generated __init__ is Python code the trace function would see.
SECONDS, LINES, CALLS = 0, 1, 2


class LineClock:
    """Charges the timeline's other time to the line of the user's code that ran, during `LINE_STEPS` steps."""

    def __init__(self, timeline: Any, library: tuple[str, ...], steps: int = LINE_STEPS) -> None:
        self.timeline = timeline
        self.library = library
        self.steps_wanted = steps
        self.active = False
        self.location: Location | None = None
        self._step: dict[Location, list[float]] = {}
        self.spent: list[dict[Location, list[float]]] = []  # each traced step's
        self._chains: dict[int, Location] = {}   # id(frame) -> the user frames around it, for frames being traced
        self._held: list[Any] = []                # frames traced since the start: kept alive, so no id is reused
        self._stacks: list[list[int]] = []        # the user frames at each step boundary, outermost first
        self.walls: list[float] = []              # the clock at each boundary: the traced steps' own length

    # -- on and off -------------------------------------------------------------------------------------------
    def start(self, frame: Any) -> str | None:
        """Trace from here (a step boundary, `frame` inside the hook that found it); the reason where it cannot."""
        if sys.gettrace() is not None:
            return "a trace function was already set (a debugger or coverage), and two cannot run at once"
        users = self._user_frames(frame)
        chain: Location = ()
        for user in users:
            self._chains[id(user)] = chain
            user.f_trace = self._local(chain)
            user.f_trace_lines = True
            self._held.append(user)
            chain = (*chain, _place(user))
        self._stacks.append([id(user) for user in users])
        self.walls.append(time.perf_counter())
        self.location = chain
        self.active = True
        self.timeline.other_sink = self._charge
        sys.settrace(self._global)
        return None

    def boundary(self, frame: Any) -> bool:
        """A step ended: its lines count. True once enough steps were traced."""
        self.timeline.mark()
        self.walls.append(time.perf_counter())
        location, self.location = self.location, None  # this bookkeeping is the profile's, no line's
        self.spent.append(self._step)
        self._step = {}
        self._stacks.append([id(user) for user in self._user_frames(frame)])
        self.timeline.mark()
        self.location = location
        return self.steps >= self.steps_wanted

    @property
    def steps(self) -> int:
        return len(self.spent)

    def stop(self) -> None:
        if not self.active:
            return
        sys.settrace(None)
        self.active = False
        self.timeline.other_sink = None
        for frame in self._held:
            frame.f_trace = None
        self._held.clear()
        self._chains.clear()
        self._step = {}  # an unfinished step does not count

    # -- the trace functions -------------------------------------------------------------------------------------
    def _charge(self, seconds: float) -> None:
        if self.location is not None:
            self._spent_here()[SECONDS] += seconds

    def _spent_here(self) -> list[float]:
        spent = self._step.get(self.location)  # type: ignore[arg-type]
        if spent is None:
            spent = self._step[self.location] = [0.0, 0, 0]  # type: ignore[index]
        return spent

    def _global(self, frame: Any, event: str, arg: Any) -> Callable[..., Any] | None:
        if self.location is not None:
            self._spent_here()[CALLS] += 1
        # Inside a bucket (a model's forward, a Dataset's __getitem__) the time is the bucket's: no line events.
        if self.timeline.depth or not self._users(frame.f_code.co_filename):
            return None
        chain = self._outer(frame.f_back)
        self._chains[id(frame)] = chain
        self._held.append(frame)
        return self._local(chain)

    def _local(self, chain: Location) -> Callable[..., Any]:
        timeline = self.timeline

        def local(frame: Any, event: str, arg: Any) -> Callable[..., Any] | None:
            if not self.active:
                return None
            if event == "line":
                timeline.mark()  # what ran since the last line is the previous line's
                self.location = (*chain, _place(frame))
                self._spent_here()[LINES] += 1
            elif event == "return":
                timeline.mark()
                if chain:
                    self.location = chain  # back in the caller's line, which goes on after the call
            return local
        return local

    def _outer(self, frame: Any) -> Location:
        """The user frames around a new frame: those of the nearest traced user frame, and that frame."""
        while frame is not None:
            chain = self._chains.get(id(frame))
            if chain is not None:
                return (*chain, _place(frame))
            frame = frame.f_back
        return ()

    def _users(self, filename: str) -> bool:
        """Whether code in `filename` is the user's. Not "<string>": the code dataclasses and namedtuples generate
        (`__init__`, `__repr__`), which a library's objects run as much as the user's; its time is its caller's."""
        return not filename.startswith(self.library) and filename != "<string>"

    def _user_frames(self, frame: Any) -> list[Any]:
        found = []
        while frame is not None:
            if self._users(frame.f_code.co_filename):
                found.append(frame)
            frame = frame.f_back
        return found[::-1]

    # -- afterwards -----------------------------------------------------------------------------------------------
    def loop_frame(self) -> int | None:
        """The innermost user frame alive at every traced step's boundary: the loop's (a `train_step()` it calls
        each step is a new frame each time; the cell and a `train()` around the loop are outer)."""
        if len(self._stacks) < 2:
            return None
        common = set.intersection(*(set(stack) for stack in self._stacks[1:]))
        inner = [frame_id for frame_id in self._stacks[0] if frame_id in common]
        return inner[-1] if inner else None

    def lines(self, sources: Callable[[str, int], str], costs: tuple[float, float], other: float | None = None
              ) -> tuple[list[OtherLine], float]:
        """The loop's lines by their other time per step (each with the costliest lines of the user's functions
        it called), the costliest first; and the tracing cost per step taken out of them.

        `costs`: seconds per line event and per new frame, taken out where they happened. Traced, Python also runs
        library code's bytecode on its slower path (torch's `clip_grad_norm_` took 640 µs traced, 220 µs bare, its
        177 frames' events taken out); where the lines then add up to more than `other` (the profiled steps' typical
        other time), that excess is taken out of them by their share of the new frames, a sleep keeping its time."""
        loop = self.loop_frame()
        if loop is None or not self.steps:
            return [], 0.0
        line_cost, call_cost = costs
        # Per traced step: each loop line's seconds, and those of the user's lines inside what it called.
        tops: dict[Key, list[float]] = {}
        inner: dict[Key, dict[Key, list[float]]] = {}
        calls: dict[Key | tuple[Key, Key], list[float]] = {}
        taken = 0.0
        for index, step in enumerate(self.spent):
            for location, spent in step.items():
                at = next((i for i, place in enumerate(location) if place[0] == loop), None)
                if at is None:
                    continue  # outside the loop: the steps' boundaries, before the first line
                seconds = max(spent[SECONDS] - spent[LINES] * line_cost - spent[CALLS] * call_cost, 0.0)
                taken += spent[SECONDS] - seconds
                top = location[at][1:]
                tops.setdefault(top, [0.0] * self.steps)[index] += seconds
                calls.setdefault(top, [0.0] * self.steps)[index] += spent[CALLS]
                if len(location) > at + 1:
                    key = location[at + 1][1:]
                    inner.setdefault(top, {}).setdefault(key, [0.0] * self.steps)[index] += seconds
                    calls.setdefault((top, key), [0.0] * self.steps)[index] += spent[CALLS]
        typical_calls = {key: typical(per_step) for key, per_step in calls.items()}
        traced = sum(typical(per_step) for per_step in tops.values())
        frames = sum(typical_calls[key] for key in tops)
        slower = (traced - other) / frames if other is not None and frames and traced > other else 0.0
        taken += slower * frames * self.steps

        def own(key: Key | tuple[Key, Key], per_step: list[float]) -> float:
            return max(typical(per_step) - slower * typical_calls.get(key, 0.0), 0.0)

        def line(key: Key, seconds: float, inside: tuple[OtherLine, ...] = ()) -> OtherLine:
            file, number, function = key
            return OtherLine(file=file, line=number, source=sources(file, number), seconds=seconds, inside=inside,
                             function="" if function == "<module>" else function)

        found = []
        for key, per_step in tops.items():
            seconds = own(key, per_step)
            below = sorted(((k, own((key, k), v)) for k, v in inner.get(key, {}).items()), key=lambda pair: -pair[1])
            # Each figure is its own interquartile mean: a part's may exceed its line's, which it cannot really.
            found.append(line(key, seconds, tuple(line(k, min(s, seconds)) for k, s in below[:INSIDE_LINES]
                                                  if s > 0.1 * seconds)))
        found.sort(key=lambda found_line: -found_line.seconds)
        return found, taken / self.steps


@functools.lru_cache(maxsize=4)
def measure_event_costs(library: tuple[str, ...], rounds: int = 300, trials: int = 15) -> tuple[float, float]:
    """Seconds one line event of the user's code and one new frame of library code cost under `LineClock` with
    these `library` prefixes, measured here: a loop of plain lines, and calls of a small standard-library
    function, each bare and traced, the fastest of `trials` short runs (a loaded 2-core machine gave 0.8-3.5 µs a
    frame from five runs of 2,000; once per process, about 45 ms)."""
    import posixpath

    from jupyter_gpu.gpuprofile.timeline import Timeline

    namespace: dict[str, Any] = {"normcase": posixpath.normcase}
    exec(compile("def lines(n):\n    for _ in range(n):\n        a = 1\n        b = a\n"
                 "def calls(n):\n    for _ in range(n):\n        normcase('a')\n",
                 "<line-time calibration>", "exec"), namespace)
    lines, calls = namespace["lines"], namespace["calls"]

    def timed(work: Callable[[int], None], traced: bool) -> float:
        clock = LineClock(Timeline(), library)
        began = time.perf_counter()
        if traced and clock.start(sys._getframe()) is not None:
            return 0.0
        try:
            work(rounds)
        finally:
            clock.stop()
        return time.perf_counter() - began

    best = {key: float("inf") for key in ("lines", "lines traced", "calls", "calls traced")}
    for _ in range(trials):
        for name, work in (("lines", lines), ("calls", calls)):
            best[name] = min(best[name], timed(work, False))
            best[f"{name} traced"] = min(best[f"{name} traced"], timed(work, True))
    line_events = 3 * rounds  # the `for` line and the two in its body, each round
    line_cost = max(best["lines traced"] - best["lines"], 0.0) / line_events
    call_seconds = best["calls traced"] - best["calls"] - 2 * rounds * line_cost
    return line_cost, max(call_seconds, 0.0) / rounds


def _place(frame: Any) -> Place:
    code = frame.f_code
    return (id(frame), code.co_filename, frame.f_lineno, code.co_name)


def other_time_by_line(clock: LineClock | None, refused: str | None, other: float | None, step: float | None,
                       sources: Callable[[str, int], str], expected: bool = True
                       ) -> tuple[list[OtherLine], list[str], list[str]]:
    """The loop's lines by other host time, with the notes and the "not measured" lines that go with them.
    `other` and `step`: the profiled steps' typical other time and step; `expected`: the profile had a loop whose
    lines could have been traced (a cell with no loop has none)."""
    if refused is not None:
        return [], [], [f"Other host time by line: {refused}."]
    if clock is None or not clock.steps:
        # The traced steps come last, after the counted one: a loop that ends (or a cell stopped) first has none.
        ended = f"Other host time by line: the loop ended before the {LINE_STEPS} more steps it is traced on."
        return [], [], [ended] if expected else []
    costs = measure_event_costs(clock.library)
    found, taken = clock.lines(sources, costs, other)
    if not found:
        return [], [], []
    traced = typical([b - a for a, b in zip(clock.walls, clock.walls[1:], strict=False)])
    against = f" against the typical {format_seconds(step)}" if step else ""
    note = (f"Other host time by line: from {clock.steps} more steps traced line by line in your own code, after the "
            f"profiled ones (whose figures carry none of it): {format_seconds(traced)} a step{against}. The tracing's "
            f"cost ({format_seconds(costs[0])} a line, {format_seconds(costs[1])} a new frame, and library code's "
            f"slower bytecode while traced) is taken out of the lines: {format_seconds(taken)} per step.")
    return found, [note], []


# A line that logs: advice to log less often fits it, and only it.
_LOGGING = re.compile(r"\bprint\(|\blog(ger|ging)?\.|\bwandb\.|\bwriter\.add_|\btqdm\b|\.set_postfix|\.set_description"
                      r"|\blog_metrics\(|\.log\(")


def other_time_advice(lines: list[OtherLine], other: float) -> tuple[str, str]:
    """The plan's command and detail for other host time: the lines that took it, with their time per step, the
    costliest first (those holding a tenth of it or more); a guess only where no line was timed."""
    shown = [line for line in lines if line.seconds >= max(0.1 * other, MIN_SHOWN_SECONDS)][:SHOWN_LINES]
    if not shown:
        return ("look at the loop's own lines between the phases (making batches, clipping, metrics, logging)",
                "host time outside forward, backward and the optimizer step; not timed by line (see Not measured)")
    top = shown[0]
    if _LOGGING.search(top.source):
        command = (f"at {top.where}, log every N steps, not every step: `{top.source}` takes "
                   f"{format_seconds(top.seconds)} per step")
    else:
        command = (f"edit {top.where} first: `{top.source}` takes {format_seconds(top.seconds)} per step outside "
                   "forward, backward and the optimizer step")
    parts = []
    for line in shown:
        inside = "".join(f", {inner.where} `{inner.source}`: {format_seconds(inner.seconds)}" for inner in line.inside)
        parts.append(f"{line.where} `{line.source}`: {format_seconds(line.seconds)}"
                     + (f" (in it{inside})" if inside else ""))
    # The lines not named, summed: not `other` less the named ones, which differ by the noise between the profiled
    # steps and the traced ones.
    rest = sum(line.seconds for line in lines if line not in shown)
    tail = f"; the loop's other lines {format_seconds(rest)}" if rest >= MIN_SHOWN_SECONDS else ""
    return command, "by line, per step: " + "; ".join(parts) + tail
