"""Where `%%gpuprofile`'s own cost per step goes, on the host: the hook on each module call, each bucket a hook opens
and closes (forward, backward, optimizer step, a read), and the step boundary's bookkeeping.

On the H200 the hooks cost 3.1 ms of a 12.3 ms ResNet step (25%, session 44), against a goal of at most 10%. This
measures the host-side parts that a CPU can measure, each apart, for the three bench models' steps, so what is
left of the 3.1 ms is known to be the GPU-only part (a pair of CUDA events per phase and reading them back), which
only a GPU run can time (`tests/e2e/gpu/test_gpuprofile_gpu.py`, `scripts/gpu-check.sh`).

Per model: its module calls per step (every module's forward, counted by a hook), the cost of one hooked module
call and of one bucket (`instrument.measure_hook_costs`, the same measurement the report's "profiling cost" uses,
with the forward watched at the outermost module as the profiled steps have it, and with every module watched as
the warm-up has it), and their sum for one step.

    .venv/bin/python bench/bench_gpuprofile_hooks.py [--markdown]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models import MLP, EncoderClassifier, ResNet
from tables import print_table

from jupyter_gpu.gpuprofile.instrument import measure_hook_costs
from jupyter_gpu.rendering.units import format_seconds

BUCKETS_PER_STEP = 5  # data, forward, backward, optimizer, one read (`loss.item()`)


def module_calls(model: nn.Module, batch: torch.Tensor) -> int:
    calls = [0]
    handle = nn.modules.module.register_module_forward_hook(lambda *args: calls.__setitem__(0, calls[0] + 1))
    try:
        model(batch)
    finally:
        handle.remove()
    return calls[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    models = {
        "ResNet CNN (batch 32)": (ResNet(), torch.randn(32, 3, 32, 32)),
        "transformer encoder (batch 32)": (EncoderClassifier(), torch.randint(0, 1000, (32, 32))),
        "MLP 512-1024-1024-10 (batch 64)": (MLP((512, 1024, 1024, 10)), torch.randn(64, 512)),
    }
    narrowed = measure_hook_costs(torch, narrowed=True)
    every = measure_hook_costs(torch, narrowed=False)
    rows = []
    for name, (model, batch) in models.items():
        calls = module_calls(model, batch)
        watched = calls * narrowed.module_call + BUCKETS_PER_STEP * narrowed.bucket
        warm = calls * every.module_call + BUCKETS_PER_STEP * every.bucket
        rows.append((name, str(calls), format_seconds(narrowed.module_call), format_seconds(narrowed.bucket),
                     format_seconds(watched), format_seconds(every.module_call), format_seconds(warm)))
    print_table(("step", "module calls", "per call (profiled)", "per bucket", "host cost/step (profiled)",
                 "per call (warm-up)", "host cost/step (warm-up)"), rows, markdown=args.markdown)


if __name__ == "__main__":
    main()
