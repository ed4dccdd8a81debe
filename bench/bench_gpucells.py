"""What `%gpucells`' recording costs per cell, against a notebook that records nothing and one that wraps every cell
in `%%time` (what users do to get a per-cell log today).

A real IPython shell (`IPython.testing.globalipapp.start_ipython()`), cells run with `ip.run_cell(...)` as a kernel
runs them. Three ways, each over the same N cells (default 2,000) in R rounds (default 5, rotated order, one untimed
warm-up round), the median per cell reported:

1. **none**: the extension not loaded;
2. **ours**: `%load_ext jupyter_gpu`, which records every cell (the activity recorder's two hooks and the cell meter);
3. **%%time**: the extension not loaded, each cell run as `%%time\\n<cell>`, its printout captured.

The cells are `x = i * 2` (nothing to measure but the hooks), run before anything initialises CUDA. Where
`torch.cuda.is_available()`, the three run again with CUDA initialised and each cell launching one small kernel
(`y = a @ a` on a 256 x 256 tensor), where the recorder also resets the peak statistics, records two events and
waits for the second: that is the cost the docs must state. Then each CUDA call the cell meter makes is timed on its
own, so a cost that looks high says where it goes. Without a GPU that half says so and is left out.

    .venv/bin/python bench/bench_gpucells.py [--cells 2000] [--rounds 5] [--markdown]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import time

from tables import print_table


def run_cells(ip, cells: list[str]) -> float:
    with contextlib.redirect_stdout(io.StringIO()):
        began = time.perf_counter()
        for cell in cells:
            ip.run_cell(cell)
        return time.perf_counter() - began


def measure(ip, body: str, count: int, rounds: int) -> dict[str, float]:
    plain = [body.format(i=i) for i in range(count)]
    timed = ["%%time\n" + cell for cell in plain]

    def way(name: str) -> float:
        if name == "ours":
            ip.run_line_magic("load_ext", "jupyter_gpu")
        try:
            return run_cells(ip, timed if name == "%%time" else plain) / count
        finally:
            if name == "ours":
                ip.run_line_magic("unload_ext", "jupyter_gpu")

    names = ["none", "ours", "%%time"]
    for name in names:  # warm-up: imports, the first cell's one-time costs
        way(name)
    seen: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(rounds):
        for name in names[round_ % 3:] + names[:round_ % 3]:
            seen[name].append(way(name))
    return {name: statistics.median(values) for name, values in seen.items()}


def meter_calls(torch, repeats: int = 500) -> list[tuple[str, float]]:
    """The median seconds of each CUDA call `probekit.cell_meter` makes per cell, and of the whole open and close."""
    from jupyter_gpu.kernel_torch import context_devices, torch_uuid
    from jupyter_gpu.probekit.cell_meter import close_cell, open_cell

    def waited() -> None:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(0))
        event.synchronize()

    calls = {
        "open_cell() + close_cell(), the whole meter": lambda: close_cell(open_cell()),
        "torch.cuda.Event(enable_timing=True).record(stream)":
            lambda: torch.cuda.Event(enable_timing=True).record(torch.cuda.current_stream(0)),
        "record an event and wait for it": waited,
        "torch.cuda.reset_peak_memory_stats(0)": lambda: torch.cuda.reset_peak_memory_stats(0),
        "torch.cuda.memory_allocated(0)": lambda: torch.cuda.memory_allocated(0),
        "torch.cuda.max_memory_allocated(0)": lambda: torch.cuda.max_memory_allocated(0),
        "torch.cuda.memory_reserved(0)": lambda: torch.cuda.memory_reserved(0),
        "context_devices(torch)": lambda: context_devices(torch),
        "torch_uuid(torch, 0)": lambda: torch_uuid(torch, 0),
    }
    measured = []
    for name, call in calls.items():
        call()
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            call()
            times.append(time.perf_counter() - began)
        measured.append((name, statistics.median(times)))
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython()
    import torch

    rows = []
    cases = [("CPU cells, CUDA not initialised", "x = {i} * 2")]
    if torch.cuda.is_available():
        cases.append(("CUDA initialised, one small kernel per cell", "y = a @ a"))
    for label, body in cases:
        if "CUDA initialised" in label:  # only now: the first row's cells must run before CUDA starts
            ip.run_cell("import torch\na = torch.randn(256, 256, device='cuda')\ntorch.cuda.synchronize()")
        assert torch.cuda.is_initialized() == ("CUDA initialised" in label), label
        result = measure(ip, body, args.cells, args.rounds)
        base = result["none"]
        rows.append([label, f"{base * 1e6:.0f} µs", f"{result['ours'] * 1e6:.0f} µs",
                     f"{(result['ours'] - base) * 1e6:.0f} µs", f"{result['%%time'] * 1e6:.0f} µs",
                     f"{(result['%%time'] - base) * 1e6:.0f} µs",
                     f"{(result['ours'] - base) / max(result['%%time'] - base, 1e-12):.2f}"])
    print_table(["cells", "none", "ours", "ours' cost", "%%time", "%%time's cost", "ours / %%time (cost)"], rows,
                args.markdown)
    if not torch.cuda.is_available():
        print("\nNo CUDA GPU here (torch.cuda.is_available() is False): the CUDA-initialised half was not run.")
    else:
        print("\nThe cell meter's CUDA calls, each timed alone (median of 500 calls):")
        print_table(["call", "per call"], [[name, f"{seconds * 1e6:.1f} µs"] for name, seconds in meter_calls(torch)],
                    args.markdown)
    print(f"\n{args.cells} cells x {args.rounds} rounds per way, the median per cell; torch {torch.__version__}")


if __name__ == "__main__":
    main()
