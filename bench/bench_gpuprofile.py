"""How accurate and how costly is `%%gpuprofile`, and what does `torch.profiler` say about the same steps?

Four training loops, each written as a notebook would write it, run in a real IPython shell on this machine's torch:

- **known costs**: a DataLoader whose batches take 20 ms each to load (a sleep), a model whose forward sleeps 5 ms,
  10 ms of "logging" (a sleep) in the loop body, a forced `gc.collect()` and two `.item()` reads per step. Every cost
  times itself where it happens, which is the truth each bucket is compared with (goal: within 10%).
- **MLP with Adam** (the AMP recipe's MLP, 512-1024-1024-10, batch 64): FLOPs compared with the exact count,
  2 x in x out x batch per linear layer forward, twice that backward, less the first layer's input gradient.
- **ResNet-style CNN with BatchNorm** (bench/models.py, CIFAR-size inputs) and a DataLoader with 2 workers.
- **transformer encoder with AdamW** (bench/models.py), dict batches.

For each loop, in this order: the loop unprofiled for warm-up + N steps, timing each step itself (perf_counter at
each optimizer step); the loop under `%%gpuprofile --steps N --warmup K -o -q`; the loop under
`torch.profiler.profile(activities=[CPU])` for the same steps, then `key_averages().table(...)` built. Reported:
the typical profiled step against the unprofiled median (goal within 10%), the whole `%%gpuprofile` against the sum
of the profiled steps (goal at most 3x), torch.profiler's step against the unprofiled one and the seconds its
table took to build, and what each says first. Then the hooks' cost two ways: what the report says ("profiling
cost", estimated from the hooks' measured cost per bucket and per module call), and the loop run with the hooks
alone and without them, in six back-to-back pairs in alternating order (the median of the pairs' differences),
beside the same pairs with no hooks in either run (A/A: what such a difference reads from noise alone).

Then `--apply`'s reproducibility (goal: its measured speed-up within 10% between two runs): each loop under
`%%gpuprofile --apply` twice, from the same state, with what each run applied and the speed-up it measured (with
the speed-up of each of its two back-to-back pairs).

    .venv/bin/python bench/bench_gpuprofile.py [--steps 20] [--warmup 5] [--no-apply | --apply-only] [--markdown]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import statistics
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tables import print_table

from jupyter_gpu.gpuprofile.result import middle_half
from tests.fixtures.known_cost_loop import LOOP as KNOWN_LOOP
from tests.fixtures.known_cost_loop import SETUP as KNOWN_SETUP
from tests.fixtures.known_cost_loop import SYNC_LINE

COMMON = """
import time, torch, types
from torch import nn
from torch.utils.data import DataLoader, Dataset
truth = types.SimpleNamespace()
step_ends = []
"""

SETUPS = {
    "known costs": KNOWN_SETUP,
    "MLP + Adam": COMMON + """
from models import MLP
torch.manual_seed(0)
model = MLP((512, 1024, 1024, 10))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
class Vectors(Dataset):
    def __len__(self): return 100_000
    def __getitem__(self, i): return torch.full((512,), (i % 97) / 97.0), i % 10
loader = DataLoader(Vectors(), batch_size=64, shuffle=True)
""",
    "ResNet CNN + workers": COMMON + """
from models import ResNet
torch.manual_seed(0)
model = ResNet()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
class Images(Dataset):
    def __len__(self): return 100_000
    def __getitem__(self, i): return torch.full((3, 32, 32), (i % 255) / 255.0), i % 10
loader = DataLoader(Images(), batch_size=32, shuffle=True, num_workers=2, persistent_workers=True)
""",
    "transformer + AdamW": COMMON + """
from models import EncoderClassifier
torch.manual_seed(0)
model = EncoderClassifier()
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
class Tokens(Dataset):
    def __len__(self): return 100_000
    def __getitem__(self, i):
        return {"tokens": torch.arange(32) * (i % 7) % 1000, "label": i % 2}
loader = DataLoader(Tokens(), batch_size=32, shuffle=True)
""",
}

LOOPS = {
    "known costs": KNOWN_LOOP,
    "MLP + Adam": """for epoch in range(100):
    for i, (x, y) in enumerate(loader):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        running = loss.item()
        step_ends.append(time.perf_counter())
""",
    "ResNet CNN + workers": """for epoch in range(100):
    for images, labels in loader:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        opt.step()
        step_ends.append(time.perf_counter())
""",
    "transformer + AdamW": """for epoch in range(100):
    for batch in loader:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(batch["tokens"]), batch["label"])
        loss.backward()
        opt.step()
        step_ends.append(time.perf_counter())
""",
}


def stop_after(loop: str, steps: int) -> str:
    """The loop, stopped after `steps` optimizer steps by the bench (the unprofiled and torch.profiler runs)."""
    lines = []
    for line in loop.splitlines():
        lines.append(line)
        if line.strip() == "step_ends.append(time.perf_counter())":
            indent = line[:len(line) - len(line.lstrip())]
            lines.append(f"{indent}if len(step_ends) >= {steps}:\n{indent}    raise StopIteration")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def profile_hooks(warmup: int) -> Iterator[None]:
    """%%gpuprofile's hooks alone, as its profiled steps have them (narrowed after `warmup` steps), never stopping the
    loop: what the hooks cost, without the warm-up, the counted step or the ceiling around them."""
    import torch

    from jupyter_gpu.gpuprofile.instrument import Instruments, ProfilePlan

    instruments = Instruments(torch, ProfilePlan(warmup=warmup, steps=None, seconds=1e9, census=False))
    instruments.install()
    try:
        yield
    finally:
        instruments.uninstall()


def hooks_cost(ip, name: str, steps: int, warmup: int, pairs: int = 6) -> tuple[float, float]:
    """The hooks' cost per step, measured: the loop's median step with the hooks minus without, in pairs run back to
    back, every other pair in the other order (the median of the pairs' differences); and the same with no hooks in
    either run of a pair, the noise floor such a difference has on this machine."""
    def paired(hooked_run: bool) -> float:
        differences = []
        for pair in range(pairs):
            median = {}
            for second in ((False, True) if pair % 2 == 0 else (True, False)):
                hooks = second and hooked_run
                median[second] = statistics.median(run_plain(ip, name, steps, warmup, profiler=False, hooks=hooks)[0])
            differences.append(median[True] - median[False])
        return statistics.median(differences)
    return paired(True), paired(False)


def run_plain(ip, name: str, steps: int, warmup: int, profiler: bool,
              hooks: bool = False) -> tuple[list[float], float]:
    """Step times of the loop run `warmup + steps` steps unprofiled (or under torch.profiler, or under the profile's
    hooks alone); the seconds torch.profiler's key_averages table took to build (0 without it)."""
    ip.run_cell("step_ends.clear()").raise_error()
    ip.user_ns["USE_PROFILER"] = profiler
    ip.user_ns["HOOKS"] = (lambda: profile_hooks(warmup)) if hooks else contextlib.nullcontext
    code = ("def bench_loop():\n" + textwrap.indent(stop_after(LOOPS[name], warmup + steps + 1), "    ") + """
import contextlib
from torch.profiler import profile, ProfilerActivity
context = profile(activities=[ProfilerActivity.CPU]) if USE_PROFILER else HOOKS()
step_ends.append(time.perf_counter())
with context as prof:
    try:
        bench_loop()
    except StopIteration:
        pass
table_seconds = 0.0
if USE_PROFILER:
    began = time.perf_counter()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=5)
    table_seconds = time.perf_counter() - began
""")
    ip.run_cell(code).raise_error()
    ends = ip.user_ns["step_ends"]
    times = [b - a for a, b in itertools.pairwise(ends)][warmup:]
    return times, float(ip.user_ns["table_seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--no-apply", dest="apply", action="store_false", help="skip --apply's reproducibility")
    parser.add_argument("--apply-only", action="store_true", help="only --apply's reproducibility")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython()
    ip.run_line_magic("load_ext", "jupyter_gpu")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if not args.apply_only:
        profile_tables(ip, args)
    if args.apply:
        print()
        print_table(("loop", "applied (run 1)", "speed-up run 1 (its pairs)", "applied (run 2)",
                     "speed-up run 2 (its pairs)", "difference", "seconds per --apply"),
                    apply_twice(ip, args.steps, args.warmup), args.markdown)


def profile_tables(ip, args: argparse.Namespace) -> None:
    """Accuracy, cost and what each tool says first, for each loop; then the hooks on a host-bound step."""
    rows, accuracy, firsts = [], [], []
    for name, setup in SETUPS.items():
        ip.run_cell(setup).raise_error()
        plain, _ = run_plain(ip, name, args.steps, args.warmup, profiler=False)
        for values in vars(ip.user_ns["truth"]).values():
            values.clear()
        began = time.perf_counter()
        run = ip.run_cell(f"%%gpuprofile -o -q --steps {args.steps} --warmup {args.warmup}\n" + LOOPS[name])
        run.raise_error()
        whole = time.perf_counter() - began
        result = run.result
        truth = {kind: list(values) for kind, values in vars(ip.user_ns["truth"]).items()}
        traced, table_seconds = run_plain(ip, name, args.steps, args.warmup, profiler=True)
        hooks = hooks_cost(ip, name, args.steps, args.warmup)
        plain_median, traced_median = statistics.median(plain), statistics.median(traced)
        rows.append((name, f"{plain_median * 1e3:.1f} ms", f"{result.seconds * 1e3:.1f} ms",
                     f"{result.seconds / plain_median:.2f}", f"{whole / sum(result.step_seconds):.2f}",
                     f"{(result.overhead_seconds or 0) * 1e6:.0f} µs", f"{hooks[0] * 1e6:.0f} µs",
                     f"{hooks[1] * 1e6:.0f} µs",
                     f"{traced_median * 1e3:.1f} ms",
                     f"{traced_median / plain_median:.2f}", f"{table_seconds:.2f} s",
                     f"{result.flops / 1e9:.3f}" if result.flops else "-"))
        if name == "known costs":
            # profiled steps: warm-up + 1 (the first batch is fetched before the first step's boundary) onwards
            # As the test compares: the typical step's own steps; profiled step j holds batch warmup + j's loading
            # and forward, and iteration warmup + j - 1's logging and collection (tests/gpuprofile/...known_costs).
            middle = middle_half(result.step_seconds)
            for kind in ("data", "forward", "other", "gc"):
                shift = 0 if kind in ("data", "forward") else -1
                known = statistics.mean(truth[kind][args.warmup + j + shift] for j in middle)
                measured = result.bucket(kind).seconds
                accuracy.append((kind, f"{known * 1e3:.2f} ms", f"{measured * 1e3:.2f} ms",
                                 f"{measured / known - 1:+.1%}"))
            [sync] = result.syncs
            found = f"{sync.per_step:g} per step (line {sync.line})"
            accuracy.append(("syncs", f"2 per step (line {SYNC_LINE})", found, ""))
        if name == "MLP + Adam":
            exact = 0
            batch = 64
            for index, (a, b) in enumerate([(512, 1024), (1024, 1024), (1024, 10)]):
                exact += 2 * a * b * batch * (2 if index == 0 else 3)
            accuracy.append(("FLOPs (MLP)", f"{exact:,}", f"{result.flops:,}", "exact" if exact == result.flops
                             else f"{result.flops / exact - 1:+.2%}"))
        firsts.append((name, result.plan[0].cause if result.plan else "-",
                       ip.user_ns["table"].splitlines()[3].split()[0] if "table" in ip.user_ns else "-"))
    print()
    print_table(("loop", "unprofiled step", "%%gpuprofile step", "ratio", "whole/steps", "hooks' cost (report)",
                 "hooks' cost (A/B)", "same, no hooks (A/A)",
                 "torch.profiler step", "ratio", "its table", "GFLOP/step"), rows, args.markdown)
    print()
    print_table(("known cost", "truth", "%%gpuprofile", "error"), accuracy, args.markdown)
    print()
    print_table(("loop", "%%gpuprofile: fix first", "torch.profiler: top self-CPU row"), firsts, args.markdown)
    print()
    print_table(("host-bound step (batch 2)", "step", "hooks, global", "hooks, narrowed (as profiled)",
                 "report's estimate"), host_bound_hooks(), args.markdown)


def _training_step(nn, model, inputs, targets, optimizer):
    def step() -> None:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        loss.item()
    return step


def host_bound_hooks(rounds: int = 30) -> list[tuple[str, ...]]:
    """The hooks' cost where it shows most: a step with almost no compute (batch 2, one CPU thread), as a GPU's
    host-bound step is, timed in-process with no DataLoader, so the noise is small. Rounds of bare, hooked, bare
    (10 steps each), the hooked median against the mean of the two bare ones around it; the median over the rounds.
    With the module hooks kept global for the whole run, and narrowed after the warm-up as `%%gpuprofile` does."""
    import torch
    from models import MLP, EncoderClassifier, ResNet
    from torch import nn

    from jupyter_gpu.gpuprofile.assemble import _overhead
    from jupyter_gpu.gpuprofile.instrument import Instruments, ProfilePlan

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cases = {"ResNet CNN": (ResNet(), torch.randn(2, 3, 8, 8), torch.randint(0, 10, (2,))),
             "transformer": (EncoderClassifier(), torch.randint(0, 1000, (2, 32)), torch.randint(0, 2, (2,))),
             "MLP": (MLP((32, 64, 64, 10)), torch.randn(2, 32), torch.randint(0, 10, (2,)))}
    rows = []
    try:
        for name, (model, inputs, targets) in cases.items():
            step = _training_step(nn, model, inputs, targets, torch.optim.SGD(model.parameters(), lr=0.01))

            def timed() -> float:
                began = time.perf_counter()
                for _ in range(10):
                    step()  # noqa: B023 - called in this iteration only
                return (time.perf_counter() - began) / 10

            for _ in range(10):
                step()
            figures = []
            for narrowed in (False, True):
                differences, records = [], []
                for _ in range(rounds):
                    before = timed()
                    instruments = Instruments(torch, ProfilePlan(warmup=2 if narrowed else 10 ** 9, steps=None,
                                                                 seconds=1e9, census=False))
                    instruments.install()
                    for _ in range(3):
                        step()
                    hooked = timed()
                    records = instruments.records[-5:]
                    instruments.uninstall()
                    differences.append(hooked - (before + timed()) / 2)
                figures.append((statistics.median(differences), _overhead(torch, records, narrowed) or 0.0))
            bare = timed()
            rows.append((name, f"{bare * 1e3:.2f} ms", f"{figures[0][0] * 1e6:.0f} µs",
                         f"{figures[1][0] * 1e6:.0f} µs", f"{figures[1][1] * 1e6:.0f} µs"))
    finally:
        torch.set_num_threads(threads)
    return rows


def apply_twice(ip, steps: int, warmup: int) -> list[tuple[str, ...]]:
    """Each loop under `%%gpuprofile --apply` twice (the state is put back after each, so both start from the same
    weights and batches): what each applied and the speed-up it measured."""
    rows = []
    for name, setup in SETUPS.items():
        ip.run_cell(setup).raise_error()
        runs = []
        for _ in range(2):
            began = time.perf_counter()
            run = ip.run_cell(f"%%gpuprofile -o -q --apply --steps {steps} --warmup {warmup}\n" + LOOPS[name])
            run.raise_error()
            runs.append((run.result.applied, time.perf_counter() - began))
        (first, seconds_1), (second, seconds_2) = runs
        speedups = [fixes.speedup for fixes in (first, second)]
        difference = (f"{abs(speedups[0] / speedups[1] - 1):.1%}" if all(speedups) else "-")
        shown = [f"{fixes.speedup:.2f}x ({', '.join(f'{pair:.2f}' for pair in fixes.pair_speedups)})"
                 if fixes.speedup else "-" for fixes in (first, second)]
        rows.append((name, "; ".join(first.applied) or "nothing", shown[0], "; ".join(second.applied) or "nothing",
                     shown[1], difference, f"{seconds_1:.0f} s, {seconds_2:.0f} s"))
    return rows


if __name__ == "__main__":
    main()
