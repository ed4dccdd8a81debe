"""Every magic of jupyter_gpu once, in a real IPython shell, on the real GPU with a small real model (a step of
scripts/gpu-check.sh).

    python3 scripts/gpu_magics.py --out magics.json [--timeout 60]

Each magic runs as a notebook cell would (`shell.run_cell`), returns its result with -o and prints its text; one
record per magic keeps the headline (the first line of that text), the status, the seconds and the device. The
JSON file is rewritten after every magic, so a run stopped by its time limit still leaves what it measured.

Without a GPU the same cells run on the CPU, so the rehearsal exercises this script, and the file says plainly that
nothing was measured on a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

# The project from the working tree, also when run as `python3 scripts/gpu_magics.py` without PYTHONPATH.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SETUP = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

DEVICE = {device!r}
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 2048), nn.GELU(), nn.Linear(2048, 10)).to(DEVICE)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

def train_step(batch_size):
    x = torch.randn(batch_size, 512, device=DEVICE)
    y = torch.randint(0, 10, (batch_size,), device=DEVICE)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss

def step():
    return train_step(256)

loader = DataLoader(TensorDataset(torch.randn(4096, 512), torch.randint(0, 10, (4096,))), batch_size=256,
                    shuffle=True)

def data_step(batch):
    x, y = (t.to(DEVICE, non_blocking=True) for t in batch)
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()
"""


class TimeLimit:
    """Interrupts a magic that runs past its limit the way Ctrl-C does: every probe keeps what it measured, puts
    the notebook's state back and raises KeyboardInterrupt, which IPython's run_cell catches and records."""

    def __init__(self, seconds: int) -> None:
        self.seconds = seconds
        self.fired = False

    def _fire(self, signum: int, frame: Any) -> None:
        self.fired = True
        raise KeyboardInterrupt(f"gpu_magics.py: over the {self.seconds} s limit")

    def __enter__(self) -> TimeLimit:
        signal.signal(signal.SIGALRM, self._fire)
        signal.alarm(self.seconds)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.alarm(0)


def headline_of(value: Any, joined: int = 1) -> tuple[str, list[str]]:
    """A result's first line of text (or its first `joined` lines) and its first lines, as the notebook's
    plain-text output shows them."""
    if value is None:
        return "(no result)", []
    lines = [line for line in str(value).strip().splitlines() if line.strip()]
    return (" · ".join(" ".join(line.split()) for line in lines[:joined]) if lines else repr(value)), lines[:12]


class Session:
    def __init__(self, out: Path, limit: int) -> None:
        from IPython.core.interactiveshell import InteractiveShell

        self.out = out
        self.limit = limit
        self.shell = InteractiveShell.instance()
        self.report: dict[str, Any] = {"device": None, "gpu": None, "note": None, "magics": []}

    def save(self) -> None:
        partial = self.out.with_suffix(".tmp")
        partial.write_text(json.dumps(self.report, indent=1) + "\n")
        partial.replace(self.out)

    def cell(self, source: str, limit: int | None = None) -> tuple[Any, BaseException | None, bool, float]:
        started = time.perf_counter()
        with TimeLimit(limit or self.limit) as timer:
            outcome = self.shell.run_cell(source, store_history=True)
        return outcome.result, outcome.error_in_exec, timer.fired, time.perf_counter() - started

    def magic(self, name: str, source: str, *, describe: Any = None, limit: int | None = None) -> Any:
        print(f"\n--- {name}: {source.splitlines()[0]}", flush=True)
        value, error, timed_out, seconds = self.cell(source, limit)
        record: dict[str, Any] = {"magic": name, "cell": source, "device": self.report["device"],
                                  "seconds": round(seconds, 2)}
        if timed_out:
            record.update(status="timeout", headline=f"stopped after {limit or self.limit} s")
        elif error is not None:
            record.update(status="error", headline=f"{type(error).__name__}: {error}"[:300])
        else:
            headline, lines = describe(value) if describe else headline_of(value)
            record.update(status="ok", headline=headline, text=lines)  # the shell has shown the text as Out[n]
        print(f"--- {name}: {record['status']} in {record['seconds']} s: {record['headline']}", flush=True)
        self.report["magics"].append(record)
        self.save()
        return value

    def exit_code(self) -> int:
        """0 when every magic run so far was ok, else 1."""
        return 0 if all(magic["status"] == "ok" for magic in self.report["magics"]) else 1


def panel_headline(panel: Any) -> tuple[str, list[str]]:
    if panel is None:
        return "(no panel)", []
    lines = [repr(panel)]
    sample = panel.latest
    if sample is not None:
        for device in sample.devices:
            used = None if device.memory_used is None else f"{device.memory_used / 2**30:.1f} GiB"
            total = None if device.memory_total is None else f"{device.memory_total / 2**30:.1f} GiB"
            lines.append(f"GPU {device.index} {device.name}: {device.utilization_gpu}% busy, {used} of {total}, "
                         f"{device.temperature_c} C, PyTorch reserved {device.torch_reserved}")
        if sample.status != "ok":
            lines.append(f"{sample.status}: {sample.message}")
    return " · ".join(lines[:2]), lines


def run(out: Path, limit: int) -> int:
    session = Session(out, limit)
    shell = session.shell
    shell.run_line_magic("load_ext", "jupyter_gpu")
    shell.run_cell("import torch")
    # First, before anything here touches CUDA: %gpucheck must answer without initialising it.
    session.magic("%gpucheck", "%gpucheck -o -q")
    import torch

    session.report["magics"][-1]["cuda_initialized_after"] = torch.cuda.is_initialized()
    if torch.cuda.is_available():
        session.report.update(device="cuda", gpu=torch.cuda.get_device_name(0))
    else:
        session.report.update(device="cpu", note=(
            f"no GPU: torch.cuda.is_available() is False (torch {torch.__version__}, CUDA build "
            f"{torch.version.cuda}); the magics ran on the CPU to rehearse this script, not as evidence about a GPU"))
        print(session.report["note"], flush=True)
    session.save()
    device = session.report["device"]
    _, error, _, _ = session.cell(SETUP.format(device=device))
    if error is not None:
        session.report["note"] = f"the notebook's setup cell failed: {type(error).__name__}: {error}"
        session.save()
        return 1
    budget = "1GiB" if device == "cuda" else "256MiB"  # %batchprobe needs --max-memory on the CPU
    # %%gputime's first line only names the cell; its second holds the times.
    session.magic("%%gputime", "%%gputime -o -q -n 5 -r 3 -w 2\nstep()", describe=lambda r: headline_of(r, 2))
    session.magic("%batchprobe", f"%batchprobe train_step --max-memory {budget} -o -q")
    session.magic("%dataprobe", "%dataprobe loader --step data_step --workers 0,2 --seconds 20 -o -q", limit=60)
    session.magic("%speedprobe", "%speedprobe step --try amp-bf16,tf32,fused-optimizer --steps 8 -o -q")
    session.magic("%gpumem", "%gpumem -o -q")
    # The training loop as a notebook writes it: the profile's headline, its plan and the GPU timeline's busy share.
    session.magic("%%gpuprofile", "%%gpuprofile -o -q --steps 10 --warmup 3\nfor epoch in range(50):\n"
                  "    for x, y in loader:\n        x, y = x.to(DEVICE), y.to(DEVICE)\n"
                  "        loss = nn.functional.cross_entropy(model(x), y)\n        loss.backward()\n"
                  "        opt.step()\n        opt.zero_grad()\n        seen = loss.item()\n", limit=90)
    # The panel samples in a thread: give it a few readings before its text is taken.
    session.magic("%gpupanel", "panel = %gpupanel -o --interval 0.5\nimport time; time.sleep(2)\npanel",
                  describe=panel_headline)
    shell.run_line_magic("gpupanel", "--close")
    return session.exit_code()


def command_line(argv: list[str] | None, description: str, run: Any) -> int:
    """`--out FILE --timeout S` parsed, then `run(out, timeout)`: this script's and scripts/gpu_trials.py's."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, required=True, help="the JSON record to write")
    parser.add_argument("--timeout", type=int, default=90, help="seconds each magic may take (default 90)")
    options = parser.parse_args(argv)
    os.environ.setdefault("MPLBACKEND", "Agg")
    return run(options.out, options.timeout)


def main(argv: list[str] | None = None) -> int:
    return command_line(argv, __doc__.splitlines()[0], run)


if __name__ == "__main__":
    sys.exit(main())
