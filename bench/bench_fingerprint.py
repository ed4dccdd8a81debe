"""What does checking "restored ... exactly as before" cost, next to the probe run it checks?

Each probe fingerprints everything it claims to put back and everything the discovery walk reaches before it runs,
and again after its last restore (`probekit.fingerprint`). For each bench model (bench/bench_speedprobe.py's
workloads, built the same way: seed 0, the user's step with its own batch, `{"model", "opt"}` as the notebook),
after three steps so the optimizer has its state:

1. **check**: the whole check as a probe runs it, `reach_of(step, None, ns)` + `Fingerprint.take(claims, reached)`
   + `verify(names)`, median of `--repeats` runs, with the walk's share apart; and the bytes it hashes (parameters,
   gradients, buffers, optimizer state).
2. **%speedprobe**: `probe_speed(step, namespace=ns)` with its defaults (every option that applies, the default
   steps): its wall time, which already includes one check.
3. **%dataprobe** (the CNN only, `--data-seconds`, default 60 as the magic's default budget): the step on a
   TensorDataset loader of the same batches, `run_dataprobe(loader, step, DataProbeRequest(seconds=S))`.

ratio = check / probe run; the goal is under 5%.

Run: `.venv/bin/python bench/bench_fingerprint.py [--markdown] [--workloads cnn,transformer] [--data-seconds 60]`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from bench_speedprobe import user_step, workloads
from tables import print_table

from jupyter_gpu.dataprobe.runner import DataProbeRequest, run_dataprobe
from jupyter_gpu.probekit.fingerprint import GLOBAL_RNG, Fingerprint, reach_of
from jupyter_gpu.speedprobe.runner import probe_speed


def hashed_bytes(namespace: dict[str, Any]) -> int:
    model, opt = namespace["model"], namespace["opt"]
    tensors = [*model.parameters(), *model.buffers(), *(p.grad for p in model.parameters() if p.grad is not None)]
    tensors += [value for state in opt.state.values() for value in state.values() if torch.is_tensor(value)]
    return sum(t.numel() * t.element_size() for t in tensors)


def time_check(step: Any, namespace: dict[str, Any], repeats: int) -> tuple[float, float]:
    """(median seconds of the whole check, median seconds of its discovery walk alone)."""
    wholes, walks = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        reached = reach_of(step, None, namespace)
        walked = time.perf_counter()
        check = Fingerprint.take([("model", namespace["model"]), ("opt", namespace["opt"]), ("RNG", GLOBAL_RNG)],
                                 reached, namespace)
        verdict = check.verify(["model", "opt", "RNG"])
        wholes.append(time.perf_counter() - started)
        walks.append(walked - started)
        assert verdict.restored == ["model", "opt", "RNG"], verdict.not_restored
    return statistics.median(wholes), statistics.median(walks)


def data_loader(step: Any, namespace: dict[str, Any]) -> tuple[Any, Any]:
    """The CNN's batches as a TensorDataset loader, and the step taking a batch."""
    images, labels = torch.randn(2048, 3, 32, 32), torch.randint(0, 10, (2048,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, labels), batch_size=32, shuffle=True)
    model, opt = namespace["model"], namespace["opt"]

    def train_step(batch: Any) -> torch.Tensor:
        x, y = batch
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return loader, train_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="cnn,transformer,recipe-mlp,tiny-mlp")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--data-seconds", type=float, default=60.0)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    device = torch.device("cpu")
    rows = []
    chosen = workloads(device)
    for name in args.workloads.split(","):
        step, namespace = user_step(chosen[name], device)
        for _ in range(3):
            step()
        check, walk = time_check(step, namespace, args.repeats)
        size = hashed_bytes(namespace)
        runs = [("%speedprobe (defaults)", probe_speed(step, namespace=namespace).seconds)]
        if name == "cnn":
            loader, train_step = data_loader(step, namespace)
            namespace["loader"] = loader
            result = run_dataprobe(loader, train_step, DataProbeRequest(seconds=args.data_seconds),
                                   namespace=namespace)
            runs.append((f"%dataprobe ({args.data_seconds:g} s budget)", result.seconds))
        for probe, seconds in runs:
            rows.append((name, probe, f"{size / 2**20:.1f} MiB", f"{check * 1e3:.1f} ms", f"{walk * 1e3:.2f} ms",
                         f"{seconds:.1f} s", f"{check / seconds:.3%}"))
            print("  ".join(rows[-1]), flush=True)
    print()
    print_table(("model", "probe run", "hashed", "check", "of it: walk", "probe wall", "check / run"), rows,
                args.markdown)


if __name__ == "__main__":
    main()
