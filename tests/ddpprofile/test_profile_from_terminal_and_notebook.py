"""`jupyter-gpu profile -- torchrun ...` from a terminal (one node, and two "nodes" on localhost through torchrun's
rendezvous), and `%%gpuprofile --nproc N` on a notebook cell, in a real IPython shell: real processes, gloo, CPU."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from ddp_runs import none_left, own_script
from lab_server import free_port

CLI = [sys.executable, "-m", "jupyter_gpu"]


def profile_command(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "profile", *args], capture_output=True, text=True, timeout=timeout)


def test_a_torchrun_script_is_profiled_from_a_terminal_with_the_report_on_stdout(tmp_path) -> None:
    script = own_script("mlp_ddp.py", tmp_path)
    saved = tmp_path / "profile.json"
    done = profile_command("--steps", "4", "--warmup", "1", "--json", str(saved), "--", "torchrun",
                           "--nproc-per-node", "2", str(script), "--width", "64", "--samples", "256")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("Distributed profile: 2 ranks (gloo, cpu)")
    assert "Each rank ran 1 warm-up and 4 profiled optimizer steps" in done.stdout
    assert "epoch 0 step 0 loss" in done.stderr and "epoch 0 step 0" not in done.stdout  # the script's own output
    data = json.loads(saved.read_text())
    assert data["ok"] and [r["rank"] for r in data["ranks"]] == [0, 1] and data["ranks"][0]["steps"] == 4
    assert not none_left(str(script))


def test_two_nodes_through_torchruns_rendezvous_report_every_rank_on_rank_0s_node(tmp_path) -> None:
    script = own_script("mlp_ddp.py", tmp_path)
    endpoint = f"127.0.0.1:{free_port()}"
    command = [*CLI, "profile", "--steps", "3", "--warmup", "1", "--", "torchrun", "--nnodes", "2",
               "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "t",
               str(script), "--width", "64", "--samples", "256"]
    nodes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        outputs = [node.communicate(timeout=240) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    assert [node.returncode for node in nodes] == [0, 0], [err[-2000:] for _, err in outputs]
    full = [out for out, _ in outputs if out.startswith("Distributed profile: 2 ranks")]
    assert len(full) == 1, outputs
    other = next(out for out, _ in outputs if out not in full)
    assert other.startswith("Distributed profile: rank 1 of 2 (this machine's)")
    assert "This machine ran rank 1 of 2" in other and "node of rank 0" in other
    assert not none_left(str(script))


@pytest.mark.parametrize("argv", [[], ["--", "python", "train.py"]])
def test_a_command_it_cannot_run_is_a_usage_error(argv: list[str]) -> None:
    done = profile_command(*argv, timeout=60)
    assert done.returncode == 2 and "torchrun" in done.stderr and not done.stdout


CELL = textwrap.dedent("""
    import torch, torch.nn as nn, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    def train(epochs=2):
        dist.init_process_group("gloo")
        model = DDP(nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 4)))
        data = TensorDataset(torch.randn(1024, 32), torch.randint(0, 4, (1024,)))
        loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data))
        opt = torch.optim.AdamW(model.parameters())
        for epoch in range(epochs):
            for step, (x, y) in enumerate(loader):
                loss = nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if FAIL_AT is not None and dist.get_rank() == 1 and step == FAIL_AT:
                    raise ValueError("a bad batch on rank 1")
            print("rank", dist.get_rank(), "epoch", epoch, "loss", round(loss.item(), 3))

    train()
""")


def test_a_notebook_cell_runs_in_two_processes_and_every_rank_is_profiled(ip, capsys) -> None:
    profile = ip.run_cell_magic("gpuprofile", "--nproc 2 --steps 4 --warmup 1 -o -q", "FAIL_AT = None\n" + CELL)
    assert profile is not None and profile.ok, profile.failure if profile is not None else None
    assert [r.rank for r in profile.ranks] == [0, 1] and all(r.steps == 4 for r in profile.ranks)
    assert profile.command == "this cell in 2 processes"
    assert profile.backend == "gloo" and profile.ranks[0].buckets_per_step >= 1


def test_a_rank_that_raises_in_a_notebook_cell_is_reported_and_the_shell_goes_on(ip) -> None:
    profile = ip.run_cell_magic("gpuprofile", "--nproc 2 --steps 20 --warmup 1 -o -q", "FAIL_AT = 3\n" + CELL)
    assert profile is not None and not profile.ok
    assert "Rank 1 raised ValueError: a bad batch on rank 1" in profile.failure
    assert ip.run_cell("after = 1 + 1").success and ip.user_ns["after"] == 2
    assert not none_left("jupyter-gpu-cell-")


def test_the_run_options_need_nproc_and_the_single_process_ones_are_refused_with_it(ip) -> None:
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="--scaling is for a run in several processes; add --nproc N"):
        ip.run_cell_magic("gpuprofile", "--scaling", "pass")
    with pytest.raises(UsageError, match="--keep is not available with --nproc"):
        ip.run_cell_magic("gpuprofile", "--nproc 2 --keep", "pass")
