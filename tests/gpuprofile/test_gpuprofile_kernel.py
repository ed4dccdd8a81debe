"""Ctrl-C during `%%gpuprofile` in a real ipykernel: the partial profile is shown, the model and optimizer are back,
the DataLoader's worker processes are gone, and the kernel goes on."""

from __future__ import annotations

from jupyter_client.manager import start_new_kernel
from kernel_messages import error_names, printed, run, run_interrupted, shown, text_of

SETUP = """
%load_ext jupyter_gpu
import multiprocessing, time, torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self): return 10_000
    def __getitem__(self, i):
        time.sleep(0.02)  # a known cost: the loop is inside a step when Ctrl-C comes
        return torch.zeros(8), i % 4

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
loader = DataLoader(Slow(), batch_size=4, num_workers=2)
before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
"""
LOOP = """%%gpuprofile --steps 500
for epoch in range(10):
    for x, y in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
"""
CHECK = """
print("unchanged", all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items()))
print("adam state", len(opt.state))
deadline = time.time() + 10
while multiprocessing.active_children() and time.time() < deadline:
    time.sleep(0.1)
print("workers", len(multiprocessing.active_children()))
print("hooks", torch.Tensor.item.__qualname__, torch.autograd.backward.__module__)
"""


def test_ctrl_c_shows_the_partial_profile_puts_everything_back_and_stops_the_workers() -> None:
    manager, client = start_new_kernel(kernel_name="python3")
    try:
        run(client, SETUP)
        seen = run_interrupted(manager, client, LOOP, when=lambda message: "profiled step" in text_of(message))
        profiles = shown(seen, "gpuprofile:")
        assert profiles and "(interrupted)" in profiles[-1] and "Interrupted after" in profiles[-1]
        assert error_names(seen) == ["KeyboardInterrupt"]  # "Run all" stops here
        assert_all_put_back(run(client, CHECK))
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def assert_all_put_back(seen: list[dict]) -> None:
    output = printed(seen)
    assert "unchanged True" in output and "adam state 0" in output, output
    assert "workers 0" in output, output
    assert "hooks TensorBase.item torch.autograd" in output, output


APPLY = """%%gpuprofile --steps 3 --warmup 1 --apply
for epoch in range(10):
    for x, y in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
"""


def test_ctrl_c_during_apply_stops_it_shows_the_profile_puts_everything_back_and_stops_the_workers() -> None:
    # Ctrl-C while --apply's %speedprobe measures: the cell stops there (it went on to %dataprobe and four runs of
    # the loop, and ended without an error, so "Run all" went on too).
    manager, client = start_new_kernel(kernel_name="python3")
    try:
        run(client, SETUP)
        seen = run_interrupted(manager, client, APPLY,
                               when=lambda message: "speedprobe profile_train_step" in text_of(message))
        profiles = shown(seen, "gpuprofile:")
        assert profiles and "interrupted (Ctrl-C) during %speedprobe: nothing applied" in profiles[-1], profiles
        assert "measured with: %dataprobe" not in profiles[-1]  # it did not go on to the next probe
        assert error_names(seen) == ["KeyboardInterrupt"]
        assert_all_put_back(run(client, CHECK))
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
