"""`%batchprobe --estimate`: fake-tensor peak predictions against real CPU runs, with real torch and no mocks."""

from __future__ import annotations

import copy
import json
import resource
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from jupyter_gpu.batchprobe.budget import TensorBudget  # noqa: E402
from jupyter_gpu.batchprobe.estimate import EstimateError, MemoryEstimate, estimate_peaks  # noqa: E402
from jupyter_gpu.probekit.storages import live_tensor_bytes  # noqa: E402

GiB = 1 << 30
MiB = 1 << 20


def mlp() -> Any:
    return nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


def cnn() -> Any:
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


def make_step(model: Any, optimizer: Any, shape: tuple[int, ...]) -> Callable[[int], Any]:
    def step(batch_size: int) -> Any:
        x = torch.randn(batch_size, *shape)
        y = torch.randint(0, 10, (batch_size,))
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss
    return step


def setup(kind: str) -> tuple[Any, Any, Callable[[int], Any], dict[str, Any]]:
    torch.manual_seed(0)
    model = mlp() if kind == "mlp" else cnn()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    step = make_step(model, optimizer, (256,) if kind == "mlp" else (3, 32, 32))
    return model, optimizer, step, {"model": model, "opt": optimizer, "step": step}


def state_bytes(model: Any, optimizer: Any) -> int:
    """What exists before a step: parameters, buffers, gradients and optimizer state, each storage once."""
    storages: dict[int, int] = {}
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    tensors += [v for entry in optimizer.state.values() for v in entry.values() if isinstance(v, torch.Tensor)]
    for tensor in tensors:
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
    return sum(storages.values())


def real_peak(kind: str, batch_size: int) -> int:
    """The same two steps run for real on a fresh copy, counted by TensorBudget, relative to the model state."""
    model, optimizer, step, _ = setup(kind)
    before = state_bytes(model, optimizer)
    budget = TensorBudget(torch, "cpu", limit_bytes=1 << 50)
    with budget.trial():
        for _ in range(2):
            step(batch_size)
    budget.close()
    # The baseline is every CPU tensor in the process; the model's own state is part of it.
    return budget.peak().bytes - budget.baseline + before


# The MLP's peak is in Adam's step below about 600 samples and in backward above: both regimes are compared.
@pytest.mark.parametrize(("kind", "sizes"), [("mlp", [16, 256, 2048]), ("cnn", [16, 64, 256])])
def test_predicted_peaks_match_the_real_cpu_run(kind: str, sizes: list[int]) -> None:
    _, _, step, namespace = setup(kind)
    estimate = estimate_peaks(step, sizes, namespace=namespace, memory_sizes=[])
    predicted = dict(estimate.points)
    for size in sizes:
        real = real_peak(kind, size)
        print(f"{kind} bs {size}: estimate {predicted[size]} B, real {real} B, "
              f"ratio {predicted[size] / real:.4f}")
        assert predicted[size] == pytest.approx(real, rel=0.10)
    print(f"{kind}: {estimate.seconds_per_evaluation * 1000:.0f} ms per fake evaluation")


def test_fits_agree_with_the_line_and_the_next_size_does_not_fit() -> None:
    _, _, step, namespace = setup("mlp")
    # From 1024 up the peak is in backward and grows 17 KiB per sample; below about 600 it is Adam's step.
    probe = estimate_peaks(step, [], namespace=namespace, memory_sizes=[], start=1024)
    reserve, margin = 1 * GiB, 0.1
    # Memory sizes whose budgets end near batch 3000 and 20000 on the line.
    memory_sizes = [int(reserve + (probe.intercept + probe.per_sample * n) / (1 - margin)) for n in (3000, 20000)]
    estimate = estimate_peaks(step, [], namespace=namespace, memory_sizes=memory_sizes, margin=margin,
                              start=1024, reserve_bytes=reserve)
    peaks = dict(estimate.points)
    for memory, fit in estimate.fits.items():
        budget = estimate.budget_for(memory)
        on_line = (budget - estimate.intercept) / estimate.per_sample
        assert abs(fit - on_line) <= 2 + 0.002 * fit  # the line is through the two largest points, not fit's
        assert peaks[fit] <= budget < peaks[fit + 1]  # both evaluated with fake tensors, not extrapolated
    assert estimate.fits[memory_sizes[0]] < estimate.fits[memory_sizes[1]]
    print(f"fits {estimate.fits} after {len(estimate.points)} fake evaluations")


def test_tiny_memory_fits_nothing_and_the_cap_is_reported() -> None:
    _, _, step, namespace = setup("mlp")
    estimate = estimate_peaks(step, [], namespace=namespace, memory_sizes=[GiB // 2, 80 * GiB], maximum=512)
    assert estimate.fits == {GiB // 2: 0, 80 * GiB: 512}
    assert any("--max cap" in note for note in estimate.notes)


def test_amp_runs_the_fake_step_under_autocast_and_lowers_the_activation_memory() -> None:
    _, _, step, namespace = setup("cnn")
    seen: list[bool] = []

    def recording_step(batch_size: int) -> Any:
        seen.append(torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16)
        return step(batch_size)

    namespace["step"] = recording_step
    plain = dict(estimate_peaks(recording_step, [256], namespace=namespace, memory_sizes=[2 * GiB]).points)
    assert not any(seen)
    seen.clear()
    bf16 = dict(estimate_peaks(recording_step, [256], namespace=namespace, memory_sizes=[2 * GiB], amp="bf16").points)
    assert seen and all(seen)
    assert bf16[256] < plain[256]  # the convolutions' activations are kept in bfloat16


def snapshot_of(model: Any, optimizer: Any) -> dict[str, Any]:
    return {
        "params": [(id(p), p.detach().clone()) for p in model.parameters()],
        "buffers": [(id(b), b.clone()) for b in model.buffers()],
        "grads": [(id(p.grad), p.grad.clone()) if p.grad is not None else None for p in model.parameters()],
        "groups": (id(optimizer.param_groups), [id(g["params"]) for g in optimizer.param_groups],
                   [[id(p) for p in g["params"]] for g in optimizer.param_groups]),
        "state": (id(optimizer.state), {id(p): {k: v.clone() for k, v in entry.items()}
                                        for p, entry in optimizer.state.items()}),
    }


def assert_same(before: dict[str, Any], model: Any, optimizer: Any) -> None:
    after = snapshot_of(model, optimizer)
    assert [i for i, _ in before["params"]] == [i for i, _ in after["params"]]
    for (_, old), (_, new) in zip(before["params"] + before["buffers"], after["params"] + after["buffers"],
                                  strict=True):
        assert old.dtype == new.dtype
        assert torch.equal(old.reshape(-1).view(torch.uint8), new.reshape(-1).view(torch.uint8))  # bitwise
    assert [g if g is None else g[0] for g in before["grads"]] == [g if g is None else g[0] for g in after["grads"]]
    for old, new in zip(before["grads"], after["grads"], strict=True):
        assert old is None or torch.equal(old[1], new[1])
    assert before["groups"] == after["groups"]
    assert before["state"][0] == after["state"][0]
    assert before["state"][1].keys() == after["state"][1].keys()
    for key, entry in before["state"][1].items():
        assert all(torch.equal(value, after["state"][1][key][name]) for name, value in entry.items())
    tensors = [*model.parameters(), *model.buffers(), *(p.grad for p in model.parameters() if p.grad is not None)]
    assert not any(type(t).__name__ == "FakeTensor" for t in tensors)


@pytest.mark.parametrize("trained", [False, True])
def test_model_and_optimizer_are_untouched(trained: bool) -> None:
    model, optimizer, step, namespace = setup("cnn")
    if trained:  # gradients and Adam moments exist, and BatchNorm has statistics
        x = torch.randn(8, 3, 32, 32)
        nn.functional.cross_entropy(model(x), torch.randint(0, 10, (8,))).backward()
        optimizer.step()
    before = snapshot_of(model, optimizer)
    rng = torch.get_rng_state()
    estimate_peaks(step, [8], namespace=namespace, memory_sizes=[4 * GiB])
    assert_same(before, model, optimizer)
    assert (len(optimizer.state) > 0) is trained
    assert torch.equal(rng, torch.get_rng_state())


def test_the_fake_run_allocates_no_real_memory() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: list[int] = []

    def step(batch_size: int) -> None:
        x = torch.randn(batch_size, 3, 128, 128)
        nn.functional.cross_entropy(model(x), torch.zeros(batch_size, dtype=torch.long)).backward()
        seen.append(live_tensor_bytes(torch, "cpu"))  # real tensors only: fakes are skipped
        optimizer.step()
        optimizer.zero_grad()

    before = live_tensor_bytes(torch, "cpu")
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    estimate = estimate_peaks(step, [4096], namespace={"model": model, "opt": optimizer}, memory_sizes=[])
    rss_growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
    predicted = dict(estimate.points)[4096]
    print(f"bs 4096 predicted {predicted / GiB:.1f} GiB; real tensor bytes during the fake run grew by at most "
          f"{(max(seen) - before) / MiB:.2f} MiB; max RSS grew {rss_growth / MiB:.0f} MiB")
    assert predicted > 20 * GiB  # two 64-channel 128x128 activations per sample, kept for backward
    assert max(seen) - before < 16 * MiB  # the host copies of the snapshot (a small model) and nothing else
    assert rss_growth < 1 * GiB


def run_child(body: str) -> subprocess.CompletedProcess[str]:
    """Runs in a subprocess: if the guard ever failed, the abort kills the child, not pytest."""
    script = textwrap.dedent("""
        import torch, torch.nn as nn
        from jupyter_gpu.batchprobe.estimate import EstimateError, estimate_peaks
        model = nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    """) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)


CUDA_CHILD = """
    def step(bs):
        {body}
    try:
        estimate_peaks(step, [4], namespace={{"model": model, "opt": opt}}, memory_sizes=[])
    except EstimateError as error:
        assert type(model.weight).__name__ != "FakeTensor"
        print("refused:", error)
    else:
        print("no error")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the guard is for PyTorch without usable CUDA")
@pytest.mark.parametrize("body", [
    # a leaf CUDA tensor with autograd: its backward is what aborts a CPU-only build
    'x = torch.empty(bs, 4, device="cuda", requires_grad=True); (x @ model.weight.to("cuda")).sum().backward()',
    # the batch moved to CUDA; the model stays on CPU
    'model(torch.zeros(bs, 4).to("cuda")).sum().backward()',
    # a step that swallows the refusal and carries on to backward: the refusal is sticky
    'try:\n            torch.ones(bs, 4, device="cuda", requires_grad=True)\n        except Exception:\n'
    '            pass\n        model(torch.zeros(bs, 4)).sum().backward()',
])
def test_cuda_tensors_are_refused_before_backward_in_a_child(body: str) -> None:
    child = run_child(CUDA_CHILD.format(body=body))
    assert child.returncode == 0, child.stderr[-2000:]
    assert "refused: --estimate cannot use cuda tensors" in child.stdout, child.stdout + child.stderr[-2000:]


def test_a_step_that_reads_values_is_refused_and_leaves_the_model_alone() -> None:
    model, optimizer, _, _ = setup("mlp")
    losses: list[float] = []

    def step(batch_size: int) -> None:
        loss = nn.functional.cross_entropy(model(torch.randn(batch_size, 256)), torch.zeros(batch_size).long())
        loss.backward()
        losses.append(loss.item())  # a real value: a fake tensor has none
        optimizer.step()

    before = snapshot_of(model, optimizer)
    with pytest.raises(EstimateError, match="reads tensor values") as caught:
        estimate_peaks(step, [], namespace={"model": model, "opt": optimizer}, memory_sizes=[])
    assert "--max-memory" in str(caught.value)
    assert type(caught.value.__cause__).__name__ == "DataDependentOutputException"
    assert_same(before, model, optimizer)


def test_boolean_mask_indexing_is_refused() -> None:
    model, optimizer, _, _ = setup("mlp")

    def step(batch_size: int) -> None:
        out = model(torch.randn(batch_size, 256))
        out[out > 0].sum().backward()

    with pytest.raises(EstimateError, match="depends on values"):
        estimate_peaks(step, [], namespace={"model": model, "opt": optimizer}, memory_sizes=[])


def test_a_meta_model_is_refused() -> None:
    with torch.device("meta"):
        model = mlp()
    optimizer = torch.optim.Adam(model.parameters())
    step = make_step(model, optimizer, (256,))
    with pytest.raises(EstimateError, match="meta"):
        estimate_peaks(step, [64], namespace={"model": model, "opt": optimizer}, memory_sizes=[])
    assert all(p.is_meta for p in model.parameters()) and not optimizer.state


def test_rendering_and_serialising() -> None:
    _, _, step, namespace = setup("mlp")
    estimate = estimate_peaks(step, [], namespace=namespace, memory_sizes=[24 * GiB, 80 * GiB])
    assert isinstance(estimate, MemoryEstimate)
    text = str(estimate)
    assert text.startswith("batchprobe --estimate") and "24.0 GiB" in text and "reserve" in text
    html = estimate._repr_html_()
    assert "<table>" in html and "<script" not in html
    data = json.loads(json.dumps(estimate.to_dict()))
    assert data["device"] == "cpu" and data["reserve_bytes"] == GiB
    assert copy.deepcopy(estimate.points) == [tuple(point) for point in data["points"]]
    assert estimate.seconds_per_evaluation < 10


# -- where a value is read, named in a real IPython shell ------------------------------------------------

DATALOADER_CELL = """\
import torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)

def step(batch_size):
    ds = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    for xb, yb in DataLoader(ds, batch_size=batch_size):
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
        opt.zero_grad()
"""

ITEM_CELL = """\
import torch, torch.nn as nn
model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
losses = []

def step(batch_size):
    loss = nn.functional.cross_entropy(model(torch.randn(batch_size, 8)), torch.zeros(batch_size).long())
    loss.backward()
    losses.append(loss.item())
    opt.step()
"""


@pytest.fixture
def ip(shell: Any) -> Iterator[Any]:
    names = set(shell.user_ns)
    shell.run_line_magic("load_ext", "jupyter_gpu")
    yield shell
    shell.run_line_magic("unload_ext", "jupyter_gpu")
    for name in set(shell.user_ns) - names:
        del shell.user_ns[name]


def define_in_a_cell(ip: Any, cell: str, line: str) -> str:
    """Runs the cell; the place the message must name: "Cell In[N], line L" of `line`, as tracebacks do."""
    count = ip.execution_count
    result = ip.run_cell(cell, store_history=True)
    assert result.success, result.error_in_exec
    number = cell.split("\n").index(line) + 1
    return f"Cell In[{count}], line {number}, in step: `{line.strip()}`"


def test_a_dataloader_step_is_refused_naming_the_line_that_iterates_the_loader(ip: Any) -> None:
    from IPython.core.error import UsageError

    place = define_in_a_cell(ip, DATALOADER_CELL, "    for xb, yb in DataLoader(ds, batch_size=batch_size):")
    before = ip.user_ns["model"].weight.detach().clone()
    with pytest.raises(UsageError) as caught:
        ip.run_line_magic("batchprobe", "step --estimate --for 1GiB")
    message = str(caught.value)
    print(message)
    assert "--estimate cannot run this step with fake tensors: it reads tensor values" in message
    assert "DataLoader iteration" in message
    assert place in message
    assert "Run the real probe with --max-memory instead." in message
    assert torch.equal(ip.user_ns["model"].weight, before)


def test_an_item_call_is_refused_naming_its_line_and_item(ip: Any) -> None:
    place = define_in_a_cell(ip, ITEM_CELL, "    losses.append(loss.item())")
    with pytest.raises(EstimateError) as caught:
        estimate_peaks(ip.user_ns["step"], [], namespace=ip.user_ns, memory_sizes=[])
    message = str(caught.value)
    print(message)
    assert place in message
    assert ".item()" in message and "DataLoader" not in message
    assert message.count(". ") <= 1  # one or two sentences
