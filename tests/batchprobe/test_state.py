"""Snapshot and restore of real training objects on CPU torch: every trial, finished or failed half-way, is undone
bitwise (DESIGN rule), and the objects a trial created are freed.

Each test first checks that the trial really changed the piece it is about, so a restore that skipped that piece
would fail the test.
"""

from __future__ import annotations

import functools
import gc
import random
import subprocess
import sys
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from jupyter_gpu.probekit.training_state import StateSnapshot, TrainingObjects, find_training_objects

Print = Any  # what _fingerprint records for one piece: ids, bytes and plain values, compared with ==


class Net(nn.Module):
    """Linear + BatchNorm1d + Dropout: parameters, running statistics, num_batches_tracked and an RNG consumer."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.5))
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class TiedNet(nn.Module):
    """A language-model-like net whose decoder shares the embedding's weight."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 6)
        self.hidden = nn.Linear(6, 6)
        self.decoder = nn.Linear(6, 10, bias=False)
        self.decoder.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.decoder(torch.tanh(self.hidden(self.embed(tokens))))


class Trainer:
    """A user's trainer object whose bound method is the step."""

    def __init__(self) -> None:
        self.model = Net()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def step(self, batch_size: int) -> None:
        _train_step(self.model, self.optimizer, batch_size)


# -- helpers ------------------------------------------------------------------------------------------------


def _bits(tensor: torch.Tensor) -> tuple[torch.dtype, tuple[int, ...], bytes]:
    """The exact bytes: NaN-safe and sign-of-zero-safe, unlike torch.equal."""
    host = tensor.detach().cpu()
    if host.is_sparse:
        host = host.coalesce().to_dense()
    raw = host.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return host.dtype, tuple(host.shape), raw


class _Same:
    """Equal only to the same object; holding it keeps the object alive, so its id cannot go to a new object."""

    def __init__(self, obj: object) -> None:
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.obj is self.obj

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<{type(self.obj).__name__} at {id(self.obj):#x}>"


def _tensor_print(tensor: torch.Tensor | None) -> Print:
    return None if tensor is None else (_Same(tensor), _bits(tensor))


def _value_print(value: object) -> Print:
    if isinstance(value, torch.Tensor):
        return _tensor_print(value)
    if isinstance(value, list | tuple):
        return [_value_print(item) for item in value]
    if isinstance(value, dict):
        return {key: _value_print(item) for key, item in value.items()}
    return value


def _fingerprint(
    modules: list[nn.Module],
    optimizers: list[torch.optim.Optimizer] = (),  # type: ignore[assignment]
    schedulers: list[Any] = (),  # type: ignore[assignment]
    scalers: list[torch.amp.GradScaler] = (),  # type: ignore[assignment]
) -> dict[str, Print]:
    """Everything the DESIGN rule protects, by piece: tensors by identity and bytes, the rest by value."""
    pieces: dict[str, Print] = {}
    for index, module in enumerate(modules):
        named = list(module.named_parameters(remove_duplicate=False))
        pieces[f"module{index}.params"] = [(name, _tensor_print(param)) for name, param in named]
        pieces[f"module{index}.requires_grad"] = [(name, param.requires_grad) for name, param in named]
        pieces[f"module{index}.buffers"] = [
            (name, _tensor_print(buffer)) for name, buffer in module.named_buffers(remove_duplicate=False)
        ]
        pieces[f"module{index}.grads"] = [(name, _tensor_print(param.grad)) for name, param in named]
        pieces[f"module{index}.training"] = [(name, sub.training) for name, sub in module.named_modules()]
        pieces[f"module{index}.submodules"] = [(name, _Same(sub)) for name, sub in module.named_modules()]
    for index, optimizer in enumerate(optimizers):
        params = [param for group in optimizer.param_groups for param in group["params"]]
        position = {id(param): number for number, param in enumerate(params)}
        pieces[f"optimizer{index}.state"] = sorted(
            (position[id(param)], _Same(entry), _value_print(entry)) for param, entry in optimizer.state.items()
        )
        pieces[f"optimizer{index}.param_groups"] = [
            (
                _Same(group),
                _Same(group["params"]),
                [_Same(param) for param in group["params"]],
                _value_print({key: value for key, value in group.items() if key != "params"}),
            )
            for group in optimizer.param_groups
        ]
        pieces[f"optimizer{index}.flags"] = (
            optimizer.__dict__.get("_opt_called", "absent"),
            _Same(optimizer.state),
            _Same(optimizer.param_groups),
        )
    for index, scheduler in enumerate(schedulers):
        pieces[f"scheduler{index}"] = _value_print(scheduler.state_dict())
    for index, scaler in enumerate(scalers):
        pieces[f"scaler{index}"] = (
            scaler.state_dict(),
            _tensor_print(scaler._scale),
            _tensor_print(scaler._growth_tracker),
            {
                key: (value["stage"], _value_print(value["found_inf_per_device"]))
                for key, value in scaler._per_optimizer_states.items()
            },
        )
    return pieces


def _changed(before: dict[str, Print], now: dict[str, Print]) -> set[str]:
    return {piece for piece in before if before[piece] != now[piece]}


def _train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch_size: int) -> None:
    """A plain training step without zero_grad, so gradients accumulate on top of the user's."""
    inputs = torch.randn(batch_size, 4)
    targets = torch.randint(0, 3, (batch_size,))
    nn.functional.cross_entropy(model(inputs), targets).backward()
    optimizer.step()


def _rng_bytes() -> int:
    """The size of the generator states a snapshot holds (CUDA's only where another test initialised it)."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else []
    return sum(state.numel() for state in [torch.get_rng_state(), *cuda])


def _draw() -> tuple[bytes, float, float]:
    """The next numbers of every global generator the snapshot protects."""
    return _bits(torch.randn(5))[2], random.random(), float(np.random.rand())


@contextmanager
def _raising_grad_hook(tensor: torch.Tensor) -> Iterator[None]:
    """Make backward fail when it reaches `tensor`'s gradient, as an out-of-memory error there would."""

    def out_of_memory(grad: torch.Tensor) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    handle = tensor.register_hook(out_of_memory)
    try:
        yield
    finally:
        handle.remove()


@pytest.fixture(autouse=True)
def _seeded() -> None:
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)


def _trained_net() -> tuple[Net, torch.optim.SGD]:
    """A net after two steps: gradients and momentum buffers exist, BatchNorm has statistics."""
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        _train_step(model, optimizer, 8)
    return model, optimizer


# -- restore after whole trials -----------------------------------------------------------------------------


def test_restore_undoes_training_steps_mode_switches_replaced_parameters_and_rng() -> None:
    model, optimizer = _trained_net()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model.body[3].eval()  # mixed flags: model.train() on restore would be wrong
    objects = TrainingObjects([model], [optimizer], [scheduler], [])
    before = _fingerprint([model], [optimizer], [scheduler])
    snapshot = StateSnapshot.take(objects)
    expected_draws = _draw()  # consumed after the snapshot: restore must rewind this too
    original_weight = model.head.weight
    momentum = optimizer.state[original_weight]["momentum_buffer"]

    for batch_size in (8, 16):
        _train_step(model, optimizer, batch_size)
        scheduler.step()
    model.train()
    model.eval()
    model.head.weight = nn.Parameter(torch.zeros(3, 8))
    model.body[0].bias.requires_grad_(False)

    assert _changed(before, _fingerprint([model], [optimizer], [scheduler])) == set(before) - {"module0.submodules"}
    snapshot.restore()

    assert _fingerprint([model], [optimizer], [scheduler]) == before
    assert model.head.weight is original_weight
    assert optimizer.state[original_weight]["momentum_buffer"] is momentum
    assert optimizer.param_groups[0]["lr"] == 0.1
    assert scheduler.last_epoch == 0
    assert scheduler.get_last_lr() == [0.1]
    assert _draw() == expected_draws


def test_restore_can_be_repeated_after_trials_that_mutate_restored_values_in_place() -> None:
    model, optimizer = _trained_net()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    before = _fingerprint([model], [optimizer], [scheduler])
    snapshot = StateSnapshot.take(TrainingObjects([model], [optimizer], [scheduler], []))

    for _ in range(3):
        _train_step(model, optimizer, 8)
        scheduler.step()
        # In-place changes to lists the previous restore handed back must not reach the snapshot.
        scheduler.base_lrs[0] = 99.0
        scheduler._last_lr[0] = 99.0
        assert _changed(before, _fingerprint([model], [optimizer], [scheduler])) >= {
            "module0.params",
            "optimizer0.state",
            "scheduler0",
        }
        snapshot.restore()
        assert _fingerprint([model], [optimizer], [scheduler]) == before


def test_tied_weights_are_copied_once_and_stay_tied() -> None:
    model = TiedNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loss = model(torch.randint(0, 10, (4, 3))).sum()
    loss.backward()
    before = _fingerprint([model], [optimizer])
    snapshot = StateSnapshot.take(TrainingObjects([model], [optimizer], [], []))

    for _ in range(2):
        model(torch.randint(0, 10, (4, 3))).sum().backward()
        optimizer.step()
    assert _changed(before, _fingerprint([model], [optimizer])) >= {"module0.params", "module0.grads"}
    snapshot.restore()

    assert _fingerprint([model], [optimizer]) == before
    assert model.decoder.weight is model.embed.weight
    unique = {id(t): t for t in [*model.parameters(), *(p.grad for p in model.parameters())]}
    tensor_bytes = sum(t.numel() * t.element_size() for t in unique.values())
    assert snapshot.host_bytes == tensor_bytes + _rng_bytes()


def test_a_trial_that_swaps_storage_or_dtype_gets_the_original_storage_back() -> None:
    model, optimizer = _trained_net()
    before = _fingerprint([model], [optimizer])
    snapshot = StateSnapshot.take(TrainingObjects([model], [optimizer], [], []))
    weight = model.body[0].weight

    weight.data = torch.zeros(16, 4)  # what resizing code does, keeping the Parameter object
    model.double()  # param.data = param.data.double() for every parameter and buffer
    assert weight.dtype == torch.float64
    assert _changed(before, _fingerprint([model], [optimizer])) >= {"module0.params", "module0.buffers"}
    snapshot.restore()

    assert _fingerprint([model], [optimizer]) == before
    assert weight.shape == (8, 4)
    assert weight.dtype == torch.float32


def test_a_replaced_submodule_and_a_deleted_parameter_are_put_back() -> None:
    model, optimizer = _trained_net()
    before = _fingerprint([model], [optimizer])
    snapshot = StateSnapshot.take(TrainingObjects([model], [optimizer], [], []))
    head = model.head

    model.head = nn.Linear(8, 3)
    del model.body[0].bias
    model.body[0].bias = torch.zeros(8)  # now a plain attribute, no longer a parameter
    assert _changed(before, _fingerprint([model], [optimizer])) >= {"module0.params", "module0.submodules"}
    snapshot.restore()

    assert _fingerprint([model], [optimizer]) == before
    assert model.head is head
    assert "bias" not in model.body[0].__dict__


def test_parameters_known_only_to_an_optimizer_are_restored() -> None:
    model, optimizer = _trained_net()  # the model itself was not found, say it lives inside a closure we missed
    before = _fingerprint([model], [optimizer])
    snapshot = StateSnapshot.take(TrainingObjects([], [optimizer], [], []))

    _train_step(model, optimizer, 8)
    assert _changed(before, _fingerprint([model], [optimizer])) >= {"module0.params", "module0.grads"}
    snapshot.restore()

    after = _fingerprint([model], [optimizer])
    assert after["module0.params"] == before["module0.params"]
    assert after["module0.grads"] == before["module0.grads"]
    assert after["optimizer0.state"] == before["optimizer0.state"]


# -- fresh optimizers: what a trial creates is dropped and freed ---------------------------------------------


@pytest.mark.parametrize(
    "make_optimizer",
    [
        pytest.param(lambda params: torch.optim.Adam(params, lr=1e-3), id="adam"),
        pytest.param(lambda params: torch.optim.AdamW(params, lr=1e-3, foreach=True), id="adamw-foreach"),
    ],
)
def test_state_and_gradients_created_by_a_trial_are_dropped_and_freed(
    make_optimizer: Callable[[Any], torch.optim.Optimizer],
) -> None:
    model = Net()
    optimizer = make_optimizer(model.parameters())
    before = _fingerprint([model], [optimizer])
    snapshot = StateSnapshot.take(TrainingObjects([model], [optimizer], [], []))

    _train_step(model, optimizer, 8)
    weight = model.head.weight
    assert weight.grad is not None
    assert optimizer.state[weight]
    trial_grad = weakref.ref(weight.grad)
    trial_moment = weakref.ref(optimizer.state[weight]["exp_avg"])
    trial_step = weakref.ref(optimizer.state[weight]["step"])
    snapshot.restore()
    gc.collect()

    assert _fingerprint([model], [optimizer]) == before
    assert len(optimizer.state) == 0
    assert all(param.grad is None for param in model.parameters())
    assert trial_grad() is None
    assert trial_moment() is None
    assert trial_step() is None
    del snapshot  # the snapshot never held the trial's tensors: they were dead before it went


def test_existing_adam_state_keeps_its_tensor_objects_and_values() -> None:
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    _train_step(model, optimizer, 8)
    weight = model.head.weight
    entry = optimizer.state[weight]
    moments = (entry["exp_avg"], entry["exp_avg_sq"], entry["step"])
    before = _fingerprint([model], [optimizer])
    snapshot = StateSnapshot.take(TrainingObjects([model], [optimizer], [], []))

    for _ in range(2):
        _train_step(model, optimizer, 8)
    assert _changed(before, _fingerprint([model], [optimizer])) >= {"optimizer0.state", "module0.params"}
    snapshot.restore()

    assert _fingerprint([model], [optimizer]) == before
    assert optimizer.state[weight] is entry
    assert all(a is b for a, b in zip((entry["exp_avg"], entry["exp_avg_sq"], entry["step"]), moments, strict=True))


# -- trials that fail half-way ----------------------------------------------------------------------------


def test_failure_half_way_through_backward() -> None:
    model, optimizer = _trained_net()
    before = _fingerprint([model], [optimizer])
    snapshot = StateSnapshot.take(TrainingObjects([model], [optimizer], [], []))
    first_layer = model.body[0].weight
    head_grad_before = _bits(model.head.weight.grad)

    loss = nn.functional.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 3, (8,)))
    with _raising_grad_hook(first_layer), pytest.raises(torch.OutOfMemoryError):
        loss.backward()
    # Half-way: the head's gradient (reached first) grew, the first layer's did not.
    assert _bits(model.head.weight.grad) != head_grad_before
    assert _bits(first_layer.grad) == before["module0.grads"][0][1][1]
    snapshot.restore()

    assert _fingerprint([model], [optimizer]) == before


def test_failure_half_way_through_per_parameter_optimizer_steps() -> None:
    """The optimizer-in-backward pattern: each parameter steps as soon as its gradient is ready, so a failure
    in backward leaves some parameters updated with new optimizer state and others untouched."""
    model = Net()
    optimizers = {param: torch.optim.Adam([param], lr=0.1) for param in model.parameters()}
    for param, optimizer in optimizers.items():
        param.register_post_accumulate_grad_hook(lambda p, opt=optimizer: opt.step())
    before = _fingerprint([model], list(optimizers.values()))
    snapshot = StateSnapshot.take(TrainingObjects([model], list(optimizers.values()), [], []))
    first_layer = model.body[0].weight

    loss = nn.functional.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 3, (8,)))
    with _raising_grad_hook(first_layer), pytest.raises(torch.OutOfMemoryError):
        loss.backward()
    now = _fingerprint([model], list(optimizers.values()))
    stepped = {piece for piece in _changed(before, now) if piece.endswith(".state")}
    assert 0 < len(stepped) < len(optimizers)
    assert optimizers[model.head.weight].state
    assert not optimizers[first_layer].state
    snapshot.restore()

    assert _fingerprint([model], list(optimizers.values())) == before


def test_failure_inside_a_single_optimizer_step_after_part_of_the_state_was_created() -> None:
    """Adam creates state parameter by parameter and raises at a sparse gradient: the state is half made."""
    dense = nn.Linear(4, 4)
    sparse = nn.Embedding(6, 4, sparse=True)
    model = nn.ModuleDict({"dense": dense, "sparse": sparse})
    optimizer = torch.optim.Adam([*dense.parameters(), *sparse.parameters()], lr=0.1)
    before = _fingerprint([model], [optimizer])
    snapshot = StateSnapshot.take(TrainingObjects([model], [optimizer], [], []))

    (dense(torch.randn(2, 4)).sum() + sparse(torch.tensor([1, 2])).sum()).backward()
    with pytest.raises(RuntimeError, match="sparse"):
        optimizer.step()
    assert optimizer.state[dense.weight]
    assert sparse.weight.grad.is_sparse
    snapshot.restore()

    assert _fingerprint([model], [optimizer]) == before
    assert len(optimizer.state) == 0


def test_failure_between_two_optimizers_after_the_first_stepped() -> None:
    model = Net()
    first = torch.optim.SGD(model.body.parameters(), lr=0.1, momentum=0.9)
    second = torch.optim.SGD(model.head.parameters(), lr=0.1, momentum=0.9)
    _train_step(model, first, 8)
    second.step()

    def out_of_memory(*_: object) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    before = _fingerprint([model], [first, second])
    snapshot = StateSnapshot.take(TrainingObjects([model], [first, second], [], []))
    nn.functional.cross_entropy(model(torch.randn(8, 4)), torch.randint(0, 3, (8,))).backward()
    first.step()
    handle = second.register_step_pre_hook(out_of_memory)
    try:
        with pytest.raises(torch.OutOfMemoryError):
            second.step()
    finally:
        handle.remove()
    assert _bits(model.body[0].weight) != before["module0.params"][0][1][1]
    assert _bits(model.head.weight) == before["module0.params"][-2][1][1]
    snapshot.restore()

    assert _fingerprint([model], [first, second]) == before


# -- schedulers, optimizer flags and the AMP scaler ------------------------------------------------------------


def test_scheduler_and_the_opt_called_flag_of_a_fresh_optimizer() -> None:
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    plateau_optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.1)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(plateau_optimizer, patience=0)
    assert "_opt_called" not in optimizer.__dict__
    schedulers = [scheduler, plateau]
    before = _fingerprint([model], [optimizer, plateau_optimizer], schedulers)
    snapshot = StateSnapshot.take(TrainingObjects([model], [optimizer, plateau_optimizer], schedulers, []))

    for loss in (1.0, 2.0, 3.0):
        _train_step(model, optimizer, 8)
        scheduler.step()
        plateau.step(loss)
    assert optimizer.param_groups[0]["lr"] != 1.0
    assert plateau_optimizer.param_groups[0]["lr"] != 1.0
    assert optimizer.__dict__["_opt_called"] is True
    snapshot.restore()

    assert _fingerprint([model], [optimizer, plateau_optimizer], schedulers) == before
    assert "_opt_called" not in optimizer.__dict__
    assert scheduler.last_epoch == 0
    assert optimizer.param_groups[0]["lr"] == 1.0
    assert plateau_optimizer.param_groups[0]["lr"] == 1.0


def _scaled_step(model: Net, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> None:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(torch.randn(8, 4)).float()
    loss = nn.functional.cross_entropy(logits, torch.randint(0, 3, (8,)))
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)


def test_grad_scaler_scale_and_growth_tracker_are_restored() -> None:
    model, optimizer = _trained_net()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=1)
    _scaled_step(model, optimizer, scaler)
    scaler.step(optimizer)
    scaler.update()
    scale, tracker = scaler._scale, scaler._growth_tracker
    before = _fingerprint([model], [optimizer], [], [scaler])
    snapshot = StateSnapshot.take(TrainingObjects([model], [optimizer], [], [scaler]))

    for _ in range(2):
        _scaled_step(model, optimizer, scaler)
        scaler.step(optimizer)
        scaler.update()  # growth_interval=1: the scale doubles each step
    assert scaler.get_scale() != before["scaler0"][0]["scale"]
    snapshot.restore()

    assert _fingerprint([model], [optimizer], [], [scaler]) == before
    assert scaler._scale is scale
    assert scaler._growth_tracker is tracker


def test_grad_scaler_after_a_trial_that_failed_between_unscale_and_step() -> None:
    """Without restoring the per-optimizer stage, the user's next scaler.step would skip unscaling."""
    model, optimizer = _trained_net()
    scaler = torch.amp.GradScaler("cpu")
    before = _fingerprint([model], [optimizer], [], [scaler])
    snapshot = StateSnapshot.take(TrainingObjects([model], [optimizer], [], [scaler]))
    assert scaler._scale is None

    _scaled_step(model, optimizer, scaler)  # ... and the out-of-memory error came here
    assert scaler._per_optimizer_states[id(optimizer)]["stage"].name == "UNSCALED"
    snapshot.restore()

    assert _fingerprint([model], [optimizer], [], [scaler]) == before
    assert scaler._scale is None
    assert len(scaler._per_optimizer_states) == 0
    _scaled_step(model, optimizer, scaler)  # the user's next real iteration works
    scaler.step(optimizer)
    scaler.update()


def test_a_disabled_grad_scaler_is_accepted() -> None:
    model, optimizer = _trained_net()
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    before = _fingerprint([model], [optimizer])
    snapshot = StateSnapshot.take(TrainingObjects([model], [optimizer], [], [scaler]))
    scaler.step(optimizer)
    snapshot.restore()
    assert _fingerprint([model], [optimizer]) == before
    assert scaler.state_dict() == {}


# -- RNG ------------------------------------------------------------------------------------------------------


def test_rng_of_torch_python_and_numpy_is_rewound_without_initialising_cuda() -> None:
    cuda_was_initialised = torch.cuda.is_initialized()
    snapshot = StateSnapshot.take(TrainingObjects([], [], [], []))
    expected = _draw()
    for _ in range(3):
        assert _draw() != expected
    snapshot.restore()
    assert _draw() == expected
    assert torch.cuda.is_initialized() == cuda_was_initialised
    assert snapshot.host_bytes == _rng_bytes()


# -- finding the objects ----------------------------------------------------------------------------------


def test_finds_namespace_values_containers_and_lists_each_module_once() -> None:
    model, optimizer = _trained_net()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    scaler = torch.amp.GradScaler("cpu")
    generator, discriminator = Net(), Net()
    namespace = {
        "model": model,
        "head": model.head,  # a submodule of model: covered by it
        "opt": optimizer,
        "alias": optimizer,  # the same object twice
        "sched": scheduler,
        "scaler": scaler,
        "gan": {"gen": generator, "disc": discriminator},
        "pair": [Net()],
        "_hidden": Net(),
        "Out": {1: Net()},
        "In": ["", "model"],
        "number": 3,
    }
    found = find_training_objects(namespace)

    assert found.modules == [model, generator, discriminator, namespace["pair"][0]]
    assert found.optimizers == [optimizer]
    assert found.schedulers == [scheduler]
    assert found.scalers == [scaler]
    assert found.names() == ["model", "gan['gen']", "gan['disc']", "pair[0]", "opt", "sched", "scaler"]


def test_finds_what_the_step_reaches_through_closure_partial_and_bound_self() -> None:
    model, optimizer = _trained_net()
    other = Net()

    def step(batch_size: int) -> None:
        _train_step(model, optimizer, batch_size)

    found = find_training_objects({}, step)
    assert (found.modules, found.optimizers, found.names()) == ([model], [optimizer], ["model", "optimizer"])

    partial_step = functools.partial(_train_step, other, optimizer=optimizer)
    found = find_training_objects({}, partial_step)
    assert found.names() == ["_train_step argument 0", "optimizer"]
    assert found.modules == [other]

    trainer = Trainer()
    found = find_training_objects({"trainer": trainer}, trainer.step)
    assert (found.modules, found.optimizers) == ([trainer.model], [trainer.optimizer])
    assert found.names() == ["trainer.model", "trainer.optimizer"]


def test_finds_the_globals_the_step_names() -> None:
    model, optimizer = _trained_net()
    step_globals: dict[str, Any] = {"model": model, "opt": optimizer, "unused": Net(), "torch": torch}
    exec(
        "def step(batch_size):\n    opt.zero_grad()\n    model(torch.randn(batch_size, 4)).sum().backward()",
        step_globals,
    )
    found = find_training_objects({}, step_globals["step"])
    assert found.modules == [model]
    assert found.optimizers == [optimizer]


def test_find_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from jupyter_gpu.probekit.training_state import find_training_objects\n"
        "found = find_training_objects({'x': 1}, lambda batch_size: None)\n"
        "assert found.objects() == [] and 'torch' not in sys.modules, sys.modules.keys()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
