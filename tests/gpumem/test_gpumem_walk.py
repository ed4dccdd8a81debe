"""The walk names every storage by the path a user would type, counts each once, and survives hostile objects.

Real PyTorch objects on the CPU, walked from plain namespaces (a script's globals); the shell's own holders (Out,
the hidden _, the last error) are in test_gpumem_cases.py and test_gpumem_magic.py.
"""

from __future__ import annotations

import collections
import functools
import gc
import weakref

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from jupyter_gpu.gpumem.runner import map_memory
from jupyter_gpu.gpumem.walk import Limits


def names(memory) -> dict[str, str]:
    """Every name in the map -> the kind of the entry it belongs to."""
    return {name: entry.kind for entry in memory.entries for name in entry.names}


class ConvNet(nn.Module):
    """ResNet-style: a convolution, BatchNorm (running statistics are buffers), a residual add, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8))
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.stem(x)))
        x = torch.relu(x + self.block(x))
        return self.fc(x.mean((2, 3)))


def test_a_trained_cnn_names_parameters_gradients_buffers_and_adam_state_by_path() -> None:
    torch.manual_seed(0)
    model = ConvNet()
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3, 16, 16)).sum().backward()
    opt.step()
    found = names(map_memory({"model": model, "opt": opt}))
    assert found["model.stem.weight"] == "parameter"
    assert found["model.block.0.weight"] == "parameter"
    assert found["model.fc.weight.grad"] == "gradient"
    assert found["model.bn.running_mean"] == "buffer"
    assert found["model.block.1.running_var"] == "buffer"
    assert found["opt.state[model.fc.weight]['exp_avg']"] == "optimizer state"
    assert found["opt.state[model.stem.weight]['exp_avg_sq']"] == "optimizer state"
    # The optimizer's own reference to a parameter is another name of the parameter's entry, not a second entry.
    assert found["opt.param_groups[0]['params'][0]"] == "parameter"
    total = sum(p.untyped_storage().nbytes() for p in model.parameters())
    memory = map_memory({"model": model, "opt": opt})
    assert sum(e.bytes for e in memory.entries if e.kind == "parameter") == total


def test_a_parameter_and_its_gradient_are_named_by_the_model_not_by_a_weight_decay_list() -> None:
    # The usual AdamW set-up builds its parameter groups in lists of the notebook's: `decay[0].grad` is shorter
    # than the model's name for it, and %batchprobe had listed the model's gradients as "decay gradients".
    model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 2))
    decay = [p for name, p in model.named_parameters() if p.dim() > 1]
    no_decay = [p for name, p in model.named_parameters() if p.dim() <= 1]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0}])
    model(torch.randn(4, 8)).sum().backward()
    memory = map_memory({"model": model, "optimizer": optimizer, "decay": decay, "no_decay": no_decay})
    named = [entry for entry in memory.entries if entry.kind in ("parameter", "gradient")]
    assert named and all(entry.path.startswith("model.") for entry in named), [entry.path for entry in named]
    assert any(name.startswith("decay[") for entry in named for name in entry.names)  # still among its names


def test_a_deep_models_parameter_is_named_by_the_model_not_by_the_optimizers_shorter_slot() -> None:
    # "model.net.encoder.layers.0.linear1.weight" is longer than "optimizer.param_groups[0]['params'][6]": the
    # model's name still names it, and the optimizer's slot is the other name.
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 1,
                                    enable_nested_tensor=False)
    model = nn.Sequential()
    model.add_module("net", nn.Module())
    model.net.add_module("encoder", encoder)
    optimizer = torch.optim.AdamW(model.parameters())
    memory = map_memory({"model": model, "optimizer": optimizer})
    parameters = [entry for entry in memory.entries if entry.kind == "parameter"]
    assert parameters and all(entry.path.startswith("model.net.encoder.") for entry in parameters), [
        entry.path for entry in parameters if not entry.path.startswith("model.")]
    assert all(any(name.startswith("optimizer.param_groups[0]") for name in entry.names) for entry in parameters)


def test_batchprobe_credits_a_deep_models_parameters_to_the_model_not_its_optimizer() -> None:
    from jupyter_gpu.batchprobe.holders import memory_holders
    from jupyter_gpu.probekit.training_state import find_training_objects

    model = nn.Sequential()
    model.add_module("backbone", nn.Sequential())
    model.backbone.add_module("feedforward_block", nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64)))
    optimizer = torch.optim.AdamW(model.parameters())  # "model.backbone.feedforward_block.0.weight": the longer name
    namespace = {"model": model, "optimizer": optimizer}
    holders = memory_holders(torch, namespace, find_training_objects(namespace), "cpu")
    size = sum(p.untyped_storage().nbytes() for p in model.parameters())
    assert [(h.name, h.kind, h.bytes) for h in holders] == [("model", "parameters and buffers", size)]


def test_views_of_one_storage_are_one_entry_with_every_name() -> None:
    base = torch.randn(256, 256)
    memory = map_memory({"base": base, "rows": base[:10], "t": base.t(), "kept": {"again": base}})
    [entry] = memory.entries
    assert entry.bytes == 256 * 256 * 4
    assert set(entry.names) == {"base", "rows", "t", "kept['again']"}


def test_tensors_in_containers_objects_closures_partials_slots_and_generators_are_named() -> None:
    class Slotted:
        __slots__ = ("unset", "weights")

    class Trainer:
        pass

    def make_step():
        buffer = torch.randn(64, 64)

        def step() -> torch.Tensor:
            return buffer.sum()
        return step

    def batches():
        batch = torch.randn(32, 32)
        yield batch

    slotted = Slotted()
    slotted.weights = torch.randn(16, 16)
    trainer = Trainer()
    trainer.cache = Trainer()
    trainer.cache.x = torch.randn(8, 8)
    generator = batches()
    next(generator)
    point = collections.namedtuple("Point", "x y")(torch.randn(3), 1)
    namespace = {
        "history": {"val": [torch.randn(5) for _ in range(4)], 3: (torch.randn(6),)},
        "queue": collections.deque([torch.randn(7)]), "trainer": trainer, "step": make_step(),
        "scale": functools.partial(torch.mul, torch.randn(9)), "slotted": slotted, "generator": generator,
        "point": point,
    }
    found = names(map_memory(namespace))
    for path in ("history['val'][3]", "history[3][0]", "queue[0]", "trainer.cache.x", "step.<closure>.buffer",
                 "scale.args[0]", "slotted.weights", "generator.gi_frame.f_locals['batch']", "point.x"):
        assert found.get(path) == "user variable", path


def test_a_kept_loss_names_its_graph_and_leaves_the_parameters_their_own_kind() -> None:
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 10))
    loss = mlp(torch.randn(256, 512)).logsumexp(1).mean()
    memory = map_memory({"mlp": mlp, "loss": loss})
    graph = [entry for entry in memory.entries if entry.path == "graph of loss"]
    # The saved activations: the input (256x512), the hidden layer before and after ReLU (256x2048), the logits.
    assert sum(entry.bytes for entry in graph) >= (256 * 512 + 256 * 2048) * 4
    assert memory.entry("mlp.2.weight").kind == "parameter"  # saved by the graph too, but it is the model's
    loss.backward()  # backward frees the saved tensors: the graph holds nothing any more
    after = map_memory({"mlp": mlp, "loss": loss})
    assert [entry for entry in after.entries if entry.path == "graph of loss"] == []


def test_walking_a_checkpointed_graph_does_not_run_the_forward_again() -> None:
    calls = []
    layer = nn.Linear(64, 64)

    def block(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return torch.relu(layer(x))

    loss = checkpoint(block, torch.randn(8, 64, requires_grad=True), use_reentrant=False).sum()
    assert len(calls) == 1
    map_memory({"loss": loss, "layer": layer})
    assert len(calls) == 1  # unpacking the checkpoint's saved tensors would have recomputed the block


def test_objects_that_raise_or_run_code_on_access_do_not_stop_the_walk() -> None:
    touched = []

    class Proxy:
        def __getattr__(self, name: str):
            touched.append(name)
            raise RuntimeError("remote object is gone")

    class Lazy:
        def __init__(self) -> None:
            self.kept = torch.randn(10, 10)

        @property
        def expensive(self) -> torch.Tensor:
            touched.append("expensive")
            return torch.randn(1000, 1000)

    found = names(map_memory({"proxy": Proxy(), "lazy": Lazy(), "after": torch.randn(4, 4)}))
    assert "lazy.kept" in found and "after" in found
    assert touched == []


def test_a_huge_container_and_deep_nesting_are_cut_and_reported() -> None:
    deep: list = [torch.randn(3)]
    for _ in range(30):
        deep = [deep]
    memory = map_memory({"samples": [*range(50), torch.randn(2)], "deep": deep, "near": torch.randn(5)},
                        limits=Limits(depth=12, items=20))
    found = names(memory)
    assert "near" in found
    notes = " ".join(memory.notes)
    assert "first 20 items" in notes and "samples (51 items)" in notes
    assert "more than 12 steps deep" in notes


def test_the_map_keeps_no_reference_to_what_it_found() -> None:
    value = torch.randn(128, 128)
    ref = weakref.ref(value)
    namespace = {"value": value, "graph": (value * 2).requires_grad_()}
    del value
    memory = map_memory(namespace)
    assert memory.entry("value").bytes == 128 * 128 * 4
    namespace.clear()
    gc.collect()
    assert ref() is None


def test_cpu_tensors_no_path_reaches_are_labelled_not_lost() -> None:
    hidden_holder = [torch.randn(512, 512)]  # noqa: F841 - held here, outside the namespace the map walks
    memory = map_memory({"seen": torch.randn(4)})
    [cpu] = memory.devices
    assert cpu.unreached_bytes >= 512 * 512 * 4
    assert any("outside the notebook's names" in remainder.label for remainder in memory.remainders)


def test_cuda_is_never_touched_when_this_kernel_has_not_started_it(monkeypatch) -> None:
    touched = []
    for name in ("memory_allocated", "memory_reserved", "memory_stats", "mem_get_info", "init", "device_count",
                 "empty_cache", "get_device_properties"):
        monkeypatch.setattr(torch.cuda, name, lambda *args, name=name, **kwargs: touched.append(name))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    memory = map_memory({"x": torch.randn(8)})
    assert touched == []
    assert "CUDA is not initialised" in " ".join(memory.notes)


@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_asking_for_a_gpu_the_kernel_does_not_use_is_one_sentence(device: str) -> None:
    from jupyter_gpu.gpumem.runner import GpuMemError

    with pytest.raises(GpuMemError, match=r"CUDA is not initialised|no memory on cuda:0"):
        map_memory({"x": torch.randn(8)}, device=device)


def test_a_graph_shared_by_two_kept_outputs_is_named_for_both() -> None:
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10))
    out = mlp(torch.randn(128, 256))
    loss = out.logsumexp(1).mean()
    memory = map_memory({"mlp": mlp, "out": out, "loss": loss})
    hidden = [entry for entry in memory.entries if entry.path == "graph of out" and entry.shape == (128, 1024)]
    assert hidden and all("graph of loss" in entry.names for entry in hidden)


def test_a_variable_a_models_hook_closes_over_keeps_its_own_name() -> None:
    def make_hooked():
        net = nn.Sequential(nn.Linear(64, 256), nn.ReLU())
        kept: dict = {}
        net[1].register_forward_hook(lambda module, inputs, output: kept.__setitem__("last", output))
        return net, kept

    net, kept = make_hooked()
    net(torch.randn(32, 64))
    memory = map_memory({"net": net, "kept": kept})  # the model first: its walk reaches `kept` through the hook
    entry = memory.entry("kept['last']")
    assert entry.path == "kept['last']"
    assert any(name.startswith("net.1._forward_hooks[") and name.endswith("].<closure>.kept['last']")
               for name in entry.names)
