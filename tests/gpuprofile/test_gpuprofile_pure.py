"""The pure parts of %%gpuprofile: the peak table, the step clock, lifting a loop body, the plan and the rendering."""

from __future__ import annotations

import ast
import linecache
from dataclasses import replace

import pytest

from jupyter_gpu.gpuprofile import lift
from jupyter_gpu.gpuprofile.peaks import BF16, FP16, FP32, TF32, find_peak
from jupyter_gpu.gpuprofile.plan import speedup_ceiling, with_plan
from jupyter_gpu.gpuprofile.render import render_html, render_text, verdict_line
from jupyter_gpu.gpuprofile.result import (
    BACKWARD,
    DATA,
    FORWARD,
    GC,
    OPTIMIZER,
    OTHER,
    SYNC,
    AppliedFixes,
    Bucket,
    Ceiling,
    ProfileResult,
    RunFigures,
    Sync,
    typical,
)
from jupyter_gpu.gpuprofile.timeline import Timeline

# -- the peak table ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("device_name", "row"), [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"), ("NVIDIA H200", "H200"),
    ("NVIDIA B200", "B200"), ("NVIDIA A100-SXM4-40GB", "A100 40GB"), ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
    ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"), ("NVIDIA L40S", "L40S"), ("NVIDIA L4", "L4"), ("Tesla T4", "T4"),
    ("NVIDIA A10G", "A10G"), ("NVIDIA A10", "A10"), ("Tesla V100-SXM2-16GB", "V100"),
    ("NVIDIA GeForce RTX 3090", "RTX 3090"), ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ("NVIDIA GeForce RTX 5090", "RTX 5090"),
])
def test_each_gpu_users_train_on_finds_its_own_row(device_name: str, row: str) -> None:
    peak = find_peak(device_name)
    assert peak is not None and peak.name == row
    assert peak.bandwidth_gbs > 0 and peak.source


@pytest.mark.parametrize("device_name", ["NVIDIA GeForce RTX 4090 D", "NVIDIA GeForce RTX 3090 Ti", "NVIDIA L40",
                                         "NVIDIA GeForce GTX 1080", "AMD Instinct MI300X", "", None])
def test_a_gpu_not_in_the_table_gets_no_peak_never_a_neighbours(device_name: str | None) -> None:
    assert find_peak(device_name) is None


def test_the_peak_follows_the_format_the_step_computes_in() -> None:
    h200 = find_peak("NVIDIA H200")
    assert h200 is not None
    assert h200.peak_flops(BF16) == pytest.approx(989e12) and h200.peak_flops(FP32) == pytest.approx(67e12)
    assert h200.peak_flops(TF32) == pytest.approx(494.5e12)
    assert h200.ridge_point(BF16) == pytest.approx(989e12 / 4.8e12)
    t4 = find_peak("Tesla T4")
    assert t4 is not None and t4.peak_flops(BF16) is None and t4.peak_flops(FP16) == pytest.approx(65e12)


# -- the step clock --------------------------------------------------------------------------------------------

class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_each_moment_goes_to_the_innermost_bucket_and_the_buckets_add_up() -> None:
    clock = FakeClock()
    timeline = Timeline(clock)
    clock.now = 1.0                       # 1 s outside everything: other
    timeline.enter(DATA)
    clock.now = 4.0                       # 3 s waiting for data
    timeline.leave()
    timeline.enter(FORWARD)
    clock.now = 5.0
    timeline.enter(SYNC)                  # a .item() inside forward: 0.5 s of sync, not forward
    clock.now = 5.5
    timeline.leave()
    clock.now = 6.0
    timeline.leave()
    timeline.enter("copies")              # a .to() that copied nothing: its time stays with what surrounds it
    clock.now = 6.25
    timeline.leave(merge=True)
    clock.now = 7.0
    step = timeline.boundary()
    assert step.seconds == 7.0
    assert step.buckets == {OTHER: 2.0, DATA: 3.0, FORWARD: 1.5, SYNC: 0.5}
    assert sum(step.buckets.values()) == step.seconds


def test_a_bucket_open_at_a_boundary_is_split_between_the_two_steps() -> None:
    clock = FakeClock()
    timeline = Timeline(clock)
    timeline.enter(OPTIMIZER)
    clock.now = 2.0
    first = timeline.boundary()           # the optimizer's post-hook closes a step while nothing else is open
    clock.now = 3.0
    timeline.leave()
    second = timeline.boundary()
    assert first.buckets == {OPTIMIZER: 2.0} and second.buckets == {OPTIMIZER: 1.0}


def test_a_typical_step_is_the_mean_of_the_middle_half() -> None:
    assert typical([1.0, 2.0, 3.0, 100.0]) == 2.5  # the stalled step is left out, like a median would
    assert typical([1.0, 3.0]) == 2.0


# -- lifting the loop body --------------------------------------------------------------------------------------

def cell(text: str) -> str:
    """Register `text` as a cell file (as IPython does) and return its name."""
    filename = f"<cell-{abs(hash(text))}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    return filename


def lift_from(text: str, line: int, namespace: dict | None = None, accumulation: int = 1,
              scope: lift.LoopScope | None = None):
    filename = cell(text)
    lifted = lift.ready_steps(lift.LoopSource(filename), {(filename, line): 25},
                              namespace if namespace is not None else {"model": 1, "opt": 1, "loader": 1,
                                                                        "loss_fn": 1, "device": 1},
                              ["loader"], accumulation=accumulation, batch=object(),
                              scopes={(filename, line): scope} if scope is not None else None)
    return lifted.steps, lifted.defined


ENUMERATE = """%%gpuprofile --steps 10
for epoch in range(3):
    running_loss = 0.0
    for i, (x, y) in enumerate(tqdm(loader)):
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        running_loss += loss.item()
        if i % 100 == 0:
            print(f"{epoch} {i} {running_loss / (i + 1):.3f}")
"""


def test_an_enumerate_loop_is_lifted_with_its_counter_and_its_running_total() -> None:
    steps, defined = lift_from(ENUMERATE, 4, {"model": 1, "opt": 1, "loader": 1, "loss_fn": 1, "device": 1,
                                              "running_loss": 0.0, "epoch": 2})
    assert defined == ["profile_step", "profile_train_step", "profile_sized_step", "profile_batch"]
    data = steps[0]
    assert data.command == "%dataprobe loader --step profile_step"
    function = ast.parse(data.code).body[0]
    assert isinstance(function, ast.FunctionDef) and function.name == "profile_step"
    assert [a.arg for a in function.args.args] == ["batch"]
    code = data.code
    assert "global running_loss" in code          # carried across batches, as in the loop
    assert "(x, y) = batch" in code or "x, y = batch" in code
    assert "i = profile_step.calls" in code       # the counter counts calls, as the loop counted batches
    assert "global loss" not in code              # assigned before it is read: local, freed after each call
    assert [s.command for s in steps[1:]] == ["%speedprobe profile_train_step", "%batchprobe profile_sized_step"]


def test_a_hidden_state_carried_across_batches_stays_the_notebooks() -> None:
    # The word-language-model loop (truncated backpropagation through time): `hidden` is read by the assignment
    # that writes it, so it is carried from batch to batch, like `running_loss`; as a local the step raised
    # UnboundLocalError on its first line.
    text = ("for data, targets in loader:\n    hidden = tuple(h.detach() for h in hidden)\n"
            "    output, hidden = model(data, hidden)\n    loss = criterion(output, targets)\n    loss.backward()\n"
            "    opt.step()\n")
    steps, _ = lift_from(text, 1, {"model": 1, "opt": 1, "loader": 1, "criterion": 1, "hidden": (0, 0)})
    assert "global hidden" in steps[0].code
    seen: list = []

    def model(data, hidden):
        seen.append(tuple(h.value for h in hidden))
        return 3.0, tuple(Hidden(h.value + 1) for h in hidden)

    namespace: dict = {"hidden": (Hidden(1), Hidden(2)), "profile_batch": ("data", "targets"), "model": model,
                       "criterion": lambda output, targets: Loss(), "opt": Loss()}
    for step in steps:
        exec(step.code, namespace)
    namespace["profile_train_step"]()
    namespace["profile_train_step"]()
    assert seen == [(1, 2), (2, 3)] and [h.value for h in namespace["hidden"]] == [3, 4]  # carried as in the loop


class Hidden:  # a hidden-state tensor as the body uses it
    def __init__(self, value: int) -> None:
        self.value = value

    def detach(self) -> Hidden:
        return self


class Loss:  # a loss and an optimizer as the lifted body uses them
    def backward(self) -> None:
        pass

    def step(self) -> None:
        pass


def test_gradient_accumulation_makes_one_train_step_one_optimizer_step() -> None:
    text = """for i, batch in enumerate(loader):
    loss = model(batch).mean() / 4
    loss.backward()
    if (i + 1) % 4 == 0:
        opt.step()
        opt.zero_grad()
"""
    steps, _ = lift_from(text, 1, accumulation=4)

    class Recorder:  # stands in for the model, its loss and the optimizer: records what the body did
        def __init__(self) -> None:
            self.optimizer_steps, self.backwards = 0, 0

        def __call__(self, batch):
            return self

        def mean(self):
            return self

        def __truediv__(self, other):
            return self

        def backward(self):
            self.backwards += 1

        def step(self):
            self.optimizer_steps += 1

        def zero_grad(self):
            pass

    recorder = Recorder()
    namespace: dict = {"model": recorder, "opt": recorder, "loader": [], "profile_batch": object()}
    for step in steps:
        exec(step.code, namespace)
    namespace["profile_step"](object())           # %dataprobe ran the body on one batch: a window is half-open
    for _ in range(3):
        namespace["profile_train_step"]()
    # Each train step starts a new window of 4 batches: 4 backward passes, then exactly one optimizer step.
    assert (recorder.backwards, recorder.optimizer_steps) == (1 + 3 * 4, 3)


def test_the_loop_counter_goes_on_from_step_to_step_so_a_logging_line_logs_as_in_the_loop() -> None:
    # The PyTorch MNIST example logs `if batch_idx % log_interval == 0`: %speedprobe's 40 steps log 4 times, not 40.
    text = ("for batch_idx, (data, target) in enumerate(loader):\n    loss = model(data)\n    loss.backward()\n"
            "    opt.step()\n    if batch_idx % 10 == 0:\n        logged.append(batch_idx)\n")
    steps, _ = lift_from(text, 1, {"model": 1, "opt": 1, "loader": 1, "logged": 1})

    class Tensor:
        def backward(self):
            pass

    class Optimizer:
        def step(self):
            pass

    logged: list[int] = []
    namespace: dict = {"model": lambda data: Tensor(), "opt": Optimizer(), "logged": logged,
                       "profile_batch": (1, 2)}
    for step in steps:
        exec(step.code, namespace)
    for _ in range(40):
        namespace["profile_train_step"]()
    assert logged == [0, 10, 20, 30]


@pytest.mark.parametrize(("backward", "returned"), [
    ("loss.backward()", "loss"),
    ("(loss / 4).backward()", "loss"),
    ("scaler.scale(loss).backward()", "loss"),
    ("model(x).sum().backward()", None),           # no variable holds the loss: nothing to return
    # A loss function returning a dict (a VAE's {"loss", "recon", "kl"}), or a model's output object.
    ("losses = {'loss': loss, 'kl': loss}\n    losses['loss'].backward()", "losses['loss']"),
    ("out = model(x)\n    out.loss.backward()", "out.loss"),
    ("losses = {'a': loss}\n    key = 'a'\n    losses[key].backward()", None),  # the key may change
])
def test_the_lifted_step_returns_the_loss_it_calls_backward_on(backward: str, returned: str | None) -> None:
    text = f"for x in loader:\n    loss = model(x).sum()\n    {backward}\n    opt.step()\n"
    steps, _ = lift_from(text, 1, {"model": 1, "opt": 1, "loader": 1, "scaler": 1})
    function = ast.parse(steps[0].code).body[0]
    last = function.body[-1]
    assert (ast.unparse(last.value) if isinstance(last, ast.Return) else None) == returned
    assert "return loss" in steps[1].code and "return loss" in steps[2].code  # None when the body returned none


def test_a_loss_assigned_under_autocast_is_returned_and_one_assigned_under_an_if_is_not() -> None:
    under_with = ("for x in loader:\n    with torch.autocast('cpu', dtype=torch.bfloat16):\n"
                  "        loss = model(x).sum() / 2\n    scaler.scale(loss).backward()\n")
    under_if = "for x in loader:\n    if x.numel():\n        loss = model(x).sum()\n    loss.backward()\n"
    namespace = {"model": 1, "loader": 1, "scaler": 1, "torch": 1}
    bodies = [ast.parse(lift_from(text, 1, namespace)[0][0].code).body[0].body for text in (under_with, under_if)]
    returns = [body[-1] for body in bodies]
    assert isinstance(returns[0], ast.Return) and returns[0].value.id == "loss"
    assert "loss = None" not in [ast.unparse(statement) for statement in bodies[0]]
    # It may not be assigned in every run of the body (issue 51: nanoGPT's micro-step loop, timm's if/else): the
    # step sets it to None first, so it returns the loss where the body computed one and None, not an error, where
    # it did not.
    assert isinstance(returns[1], ast.Return) and returns[1].value.id == "loss"
    assert "loss = None" in [ast.unparse(statement) for statement in bodies[1]]


def test_dict_batches_keep_the_loop_target_as_the_parameter() -> None:
    text = """for batch in loader:
    out = model(batch["input_ids"], attention_mask=batch["attention_mask"])
    out.loss.backward()
    opt.step()
"""
    steps, _ = lift_from(text, 1)
    function = ast.parse(steps[0].code).body[0]
    assert isinstance(function, ast.FunctionDef) and [a.arg for a in function.args.args] == ["batch"]


@pytest.mark.parametrize(("text", "reason"), [
    ("def batches():\n    for x in loader:\n        opt.step()\n        yield x\n", "`yield`"),
    ("def train():\n    for x in loader:\n        opt.step()\n        return\n", "`return`"),
])
def test_a_body_that_cannot_run_alone_gets_the_wrapper_and_the_reason(text: str, reason: str) -> None:
    line = 2
    steps, defined = lift_from(text, line)
    assert defined == []
    assert all(step.name is None and reason in (step.reason or "") for step in steps)
    assert "def step(batch):" in steps[0].code


WHILE_NEXT = """data_iter = iter(loader)
step = 0
while step < max_steps:
    batch = next(data_iter)
    loss = loss_fn(model(batch["x"]), batch["y"])
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
"""

RANGE_TRY_NEXT = """it = iter(loader)
for step in range(max_steps):
    try:
        x, y = next(it)
    except StopIteration:
        it = iter(loader)
        x, y = next(it)
    loss = loss_fn(model(x), y)
    loss.backward()
    if step % 100 == 0:
        print(step, loss.item())
"""


@pytest.mark.parametrize(("text", "site", "parameter", "counter"), [
    (WHILE_NEXT, 4, "batch", None),                    # the step-based loop: `batch = next(data_iter)`
    (RANGE_TRY_NEXT, 4, "batch", "step"),              # next() inside the try that restarts the iterator
    (RANGE_TRY_NEXT, 7, "batch", "step"),              # ... and the one after StopIteration
])
def test_a_loop_that_fetches_its_batch_with_next_is_lifted_without_the_fetch(text, site, parameter, counter) -> None:
    namespace = {"model": 1, "opt": 1, "loader": 1, "loss_fn": 1, "max_steps": 100, "step": 0}
    steps, defined = lift_from(text, site, namespace)
    assert defined == ["profile_step", "profile_train_step", "profile_sized_step", "profile_batch"]
    function = ast.parse(steps[0].code).body[0]
    assert [a.arg for a in function.args.args] == [parameter]
    assert "next(" not in steps[0].code and "StopIteration" not in steps[0].code
    assert ("step = profile_step.calls" in steps[0].code) == (counter is not None)
    assert ("global step" in steps[0].code) == (counter is None)  # the while loop's own count, carried
    assert function.body[-1].value.id == "loss"


def test_a_loop_over_one_loader_that_fetches_from_another_keeps_that_fetch_in_its_step() -> None:
    # Semi-supervised: labelled batches from the loop, unlabelled ones by next() from a second loader.
    text = ("unlabelled_iter = iter(unlabelled)\nfor x, y in loader:\n    u = next(unlabelled_iter)\n"
            "    loss = loss_fn(model(x), y) + model(u).pow(2).mean()\n    loss.backward()\n    opt.step()\n")
    filename = cell(text)
    namespace = {"model": 1, "opt": 1, "loader": 1, "loss_fn": 1, "unlabelled": 1, "unlabelled_iter": 1}
    lifted = lift.ready_steps(lift.LoopSource(filename), {(filename, 2): 25, (filename, 3): 25}, namespace,
                              ["loader"], accumulation=1, batch=object())
    function = ast.parse(lifted.steps[0].code).body[0]
    code = lifted.steps[0].code.replace("(x, y) = batch", "x, y = batch")
    assert [a.arg for a in function.args.args] == ["batch"] and "x, y = batch" in code
    assert "u = next(unlabelled_iter)" in code


def test_a_leading_max_steps_guard_is_left_out_and_the_loops_other_breaks_end_the_step() -> None:
    guarded = ("for step, batch in enumerate(loader):\n    if step >= max_steps:\n        break\n"
               "    loss = model(batch).sum()\n    loss.backward()\n    opt.step()\n")
    steps, defined = lift_from(guarded, 1, {"model": 1, "opt": 1, "loader": 1, "max_steps": 10})
    assert defined and "break" not in steps[0].code and "max_steps" not in steps[0].code
    # The PyTorch MNIST example: `if args.dry_run: break` inside its logging `if`, after the optimizer step; and a
    # `continue` that skips a batch. Either ends the body's run on this batch: in the step, a `return`.
    mnist = ("for batch_idx, (data, target) in enumerate(loader):\n    if data is None:\n        continue\n"
             "    loss = model(data)\n    loss.backward()\n    opt.step()\n    if batch_idx % 10 == 0:\n"
             "        print(loss.item())\n        if args.dry_run:\n            break\n"
             "    for retry in range(3):\n        if retry:\n            break\n")
    steps, defined = lift_from(mnist, 1, {"model": 1, "opt": 1, "loader": 1, "args": 1})
    function = ast.parse(steps[0].code).body[0]
    assert defined and "continue" not in steps[0].code
    assert [node for node in ast.walk(function) if isinstance(node, ast.Break)] != []  # the inner loop keeps its own
    returns = [node for node in ast.walk(function) if isinstance(node, ast.Return)]
    assert len(returns) == 3 and function.body[-1].value.id == "loss"  # `continue`, `break`, the loss at the end


def test_a_loop_over_two_zipped_loaders_is_not_lifted_and_says_why() -> None:
    # Each step takes a batch from each loader; the profile keeps only the last batch fetched, so a lifted step
    # would unpack one batch as two.
    text = ("for (x, y), (u, _) in zip(labelled, unlabelled):\n    loss = loss_fn(model(x), y) + model(u).mean()\n"
            "    loss.backward()\n    opt.step()\n")
    steps, defined = lift_from(text, 1, {"model": 1, "opt": 1, "loss_fn": 1, "labelled": 1, "unlabelled": 1})
    assert defined == [] and all("several loaders at once (`zip`)" in (step.reason or "") for step in steps)


def test_the_step_runs_in_the_grad_and_autocast_contexts_around_the_loop_but_not_in_others() -> None:
    text = ("with open('log.txt', 'w') as log, torch.inference_mode():\n    with torch.autocast('cpu'):\n"
            "        for x, y in loader:\n            correct = (model(x).argmax(1) == y).sum()\n")
    steps, defined = lift_from(text, 3, {"model": 1, "loader": 1, "torch": 1})
    assert defined
    function = ast.parse(steps[0].code).body[0]
    [block] = [node for node in function.body if isinstance(node, ast.With)]
    assert [ast.unparse(item) for item in block.items] == ["torch.inference_mode()", "torch.autocast('cpu')"]
    assert "open(" not in steps[0].code  # re-opening the log on every call would empty it


def test_a_function_s_own_variables_are_named_as_the_reason() -> None:
    text = """def train_one_epoch(net, data, optimizer):
    for x, y in data:
        optimizer.zero_grad()
        net(x).sum().backward()
        optimizer.step()
"""
    steps, defined = lift_from(text, 2, {"loader": 1})
    assert defined == [] and "`net`, `optimizer`" in (steps[0].reason or "")


def test_no_batch_seen_means_nothing_to_lift() -> None:
    lifted = lift.ready_steps(None, {}, {}, [], accumulation=1, batch=None)
    assert lifted.defined == [] and "no DataLoader batch" in (lifted.steps[0].reason or "")


TRAIN_ONE_EPOCH = """def train_one_epoch(net, data, optimizer, log_every=10):
    running = 0.0
    for step, (x, y) in enumerate(data):
        optimizer.zero_grad()
        loss = loss_fn(net(x), y)
        loss.backward()
        optimizer.step()
        running += loss.item()
        if step % log_every == 0:
            print(step, running)
"""


def test_a_loop_inside_a_function_closes_over_the_function_s_variables_as_they_were_when_it_began() -> None:
    class Net:  # stands in for the function's model and optimizer: records what the lifted body did with them
        def __init__(self) -> None:
            self.calls: list[str] = []

        def __call__(self, x):
            self.calls.append("forward")
            return self

        def backward(self):
            self.calls.append("backward")

        def zero_grad(self):
            self.calls.append("zero_grad")

        def step(self):
            self.calls.append("step")

        def item(self):
            return 0.5

    net = Net()
    printed: list[tuple] = []
    notebook = {"loss_fn": lambda out, y: out, "print": lambda *a: printed.append(a),
                "net": "the notebook's own net, shadowed by the function's argument"}
    # What the function saw when its loop first asked for a batch: its arguments and `running`, defined before it.
    scope = lift.LoopScope({"net": net, "data": [], "optimizer": net, "log_every": 10, "running": 0.0}, notebook)
    filename = cell(TRAIN_ONE_EPOCH)
    lifted = lift.ready_steps(lift.LoopSource(filename), {(filename, 3): 25}, notebook, ["loader"], accumulation=1,
                              batch=("x", "y"), scopes={(filename, 3): scope})
    assert lifted.defined == ["profile_step", "profile_train_step", "profile_sized_step", "profile_batch"]
    assert sorted(lifted.bound) == ["log_every", "net", "optimizer", "running"]  # not the loop's own names
    assert "nonlocal running" in lifted.steps[0].code and "global" not in lifted.steps[0].code
    lift.define(lifted, notebook)
    notebook["profile_batch"] = ("x", "y")
    assert notebook["profile_train_step"]() is net  # the loss the body called backward() on
    assert net.calls == ["zero_grad", "forward", "backward", "step"]  # the function's net and optimizer
    notebook["profile_train_step"]()
    assert printed == [(0, 0.5)]  # `running` carried across calls (nonlocal), logged at step 0 only
    assert "_make_profile_step" not in notebook and notebook["profile_step"].calls == 2


def test_a_function_from_a_module_sees_its_module_s_globals_not_the_notebook_s() -> None:
    module_globals = {"loss_fn": "the module's loss_fn"}
    scope = lift.LoopScope({"net": 1, "data": [], "optimizer": 1, "log_every": 10, "running": 0.0}, module_globals)
    filename = cell(TRAIN_ONE_EPOCH)
    lifted = lift.ready_steps(lift.LoopSource(filename), {(filename, 3): 25}, {"loader": 1, "loss_fn": "notebook's"},
                              ["loader"], accumulation=1, batch=object(), scopes={(filename, 3): scope})
    assert lifted.defined and lifted.bound["loss_fn"] == "the module's loss_fn"


# -- plan and rendering ------------------------------------------------------------------------------------------

def profile(**changes) -> ProfileResult:
    buckets = [Bucket(DATA, 0.046, 0.04, 0.05, 0.46), Bucket(FORWARD, 0.02, 0.02, 0.02, 0.2),
               Bucket(BACKWARD, 0.02, 0.02, 0.02, 0.2), Bucket(OPTIMIZER, 0.004, 0.004, 0.004, 0.04),
               Bucket(SYNC, 0.004, 0.004, 0.004, 0.04), Bucket(OTHER, 0.006, 0.006, 0.006, 0.06)]
    base = ProfileResult(device="cuda:0", device_name="NVIDIA H200", counted="optimizer steps",
                         step_seconds=[0.1] * 20, warmup_seconds=[1.0] * 5, requested=20, breakdown=buckets,
                         syncs=[Sync("<ipython-input-3>", 14, "running_loss += loss.item()", (".item()",), 1.0,
                                     0.004)],
                         flops=int(4e12), compute="bf16",
                         ceiling=Ceiling("cuda:0", "bf16", 800e12, 4e12, 0.3, "H200", 989e12, 4.8e12, "sheet"),
                         batch_size=256)
    return replace(base, **changes)


def test_the_plan_ranks_causes_by_time_lost_with_their_ceilings_and_commands() -> None:
    result = with_plan(profile(), loaders=["train_loader"], total_memory=None)
    causes = [item.cause for item in result.plan]
    assert causes[0] == "waiting for data"
    assert result.plan[0].command == "%dataprobe train_loader --step STEP"
    assert result.plan[0].ceiling == pytest.approx(0.1 / (0.1 - 0.046))
    sync = next(item for item in result.plan if item.cause.startswith("sync at line 14"))
    assert sync.seconds == pytest.approx(0.004) and "line 14" in sync.command
    seconds = [item.seconds for item in result.plan if item.seconds]
    assert seconds == sorted(seconds, reverse=True)


def _steps(seconds: list[float], gc_at: dict[int, float]) -> dict:
    """Step times and buckets in the shape of profile()'s typical step, the extra of step i charged to GC."""
    typical = {DATA: 0.046, FORWARD: 0.02, BACKWARD: 0.02, OPTIMIZER: 0.004, SYNC: 0.004, OTHER: 0.006}
    buckets = [dict(typical, **({GC: gc_at[i]} if i in gc_at else {})) for i in range(len(seconds))]
    return {"step_seconds": seconds, "step_buckets": buckets}


def test_stalls_that_recur_are_a_plan_item_and_a_one_off_is_only_named() -> None:
    # A collection every fifth step, 0.4 s each: the typical step (the interquartile mean) leaves them out, the run
    # pays them. One stalled step (an epoch's end) in twenty is not a pattern.
    recurring = with_plan(profile(**_steps([0.5 if i % 5 == 4 else 0.1 for i in range(20)],
                                           {i: 0.4 for i in range(4, 20, 5)})), loaders=[], total_memory=None)
    assert recurring.mean_seconds == pytest.approx(0.18) and recurring.stalled_steps == [4, 9, 14, 19]
    [stalls] = [item for item in recurring.plan if item.cause.startswith("recurring stalls")]
    assert stalls.cause == "recurring stalls, mostly garbage collection" and "gc.freeze()" in stalls.command
    assert stalls.seconds == pytest.approx(0.08) and stalls.ceiling == pytest.approx(1.8)
    assert "4 of 20 profiled steps took 500 ms - 500 ms (steps 5, 10, 15, 20)" in stalls.detail
    assert recurring.plan[0] is stalls  # 80 ms/step, before the data wait's 46
    text = str(recurring)
    assert "/step (mean 180 ms: 4 of 20 steps stalled, garbage collection):" in text.splitlines()[0]
    assert "slowest step      step 5, 500 ms (5.0x the typical step): 400 ms garbage collection" in text
    one_off = with_plan(profile(**_steps([0.5] + [0.1] * 19, {0: 0.4})), loaders=[], total_memory=None)
    assert not one_off.recurring_stalls and not any(i.cause.startswith("recurring") for i in one_off.plan)
    assert "stalled" not in str(one_off).splitlines()[0] and "slowest step      step 1, 500 ms" in str(one_off)
    assert recurring.to_dict()["stalled_steps"] == [4, 9, 14, 19]
    # --apply compares what each run pays: a fix that ends the stalls leaves the typical step as it was.
    figures = recurring.figures()
    assert figures.seconds == pytest.approx(0.18) and figures.stalls_included
    assert figures.samples_per_second == pytest.approx(256 / 0.18)
    assert one_off.figures().seconds == pytest.approx(0.1) and not one_off.figures().stalls_included
    assert one_off.to_dict()["mean_seconds"] == pytest.approx(0.12)


def test_on_the_cpu_a_sync_is_listed_but_not_ranked_by_its_microseconds() -> None:
    result = with_plan(profile(device="cpu", ceiling=None), loaders=[], total_memory=None)
    sync = next(item for item in result.plan if item.cause.startswith("sync"))
    assert sync.seconds == 0.0 and "free on the CPU" in sync.detail and result.plan[-1] is sync


def test_a_small_memory_footprint_points_at_batchprobe() -> None:
    result = with_plan(profile(peak_memory=10 * 2**30), loaders=[], total_memory=141 * 2**30)
    assert any(item.command == "%batchprobe STEP" for item in result.plan)


def test_a_step_faster_than_the_big_matmul_in_its_format_has_no_ceiling_to_compare_with() -> None:
    # fp16 autocast on a CPU: the big fp16 matmul ran at 0.0004 TFLOP/s, the step's small ones 400 times faster;
    # "401% of this CPU's fp16 matmul ceiling" was the report.
    slow = Ceiling("cpu", "fp16", 0.4e9, 20e9, 0.1)
    result = with_plan(profile(device="cpu", compute="fp16", flops=int(1.6e7), ceiling=slow, gpu_busy=None),
                       loaders=[], total_memory=None)  # 1.6e7 FLOP in 0.1 s: 0.16 GFLOP/s... 0.4x the matmul
    assert result.of_ceiling == pytest.approx(0.4) and not result.beyond_ceiling
    assert "FLOPs             16 MFLOP per step" in str(result)  # not "0.016 GFLOP"
    faster = with_plan(replace(result, flops=int(1.6e9)), loaders=[], total_memory=None)  # 16 GFLOP/s: 40x it
    assert faster.beyond_ceiling and faster.of_ceiling is None
    text = str(faster)
    assert "FLOPs             1.600 GFLOP per step" in text
    assert "matmul ceiling" not in text.splitlines()[0] and "%" not in text.split("measured ceiling")[1].split("\n")[0]
    assert "it is no ceiling: this CPU has no fast fp16 matmul for big matrices" in text
    assert not any(item.cause.startswith("compute below") for item in faster.plan)


def test_speedup_ceiling() -> None:
    assert speedup_ceiling(0.1, 0.05) == pytest.approx(2.0)
    assert speedup_ceiling(0.1, 0.0) is None and speedup_ceiling(0.1, 0.2) is None


def test_the_verdict_line_says_step_time_data_wait_syncs_and_mfu() -> None:
    line = verdict_line(profile())
    assert line.startswith("gpuprofile: 100 ms/step: 46% waiting for data, 4% in 1 sync/step (line 14)")
    assert "MFU 4% of H200 bf16" in line  # 4e12 FLOPs / 0.1 s = 40 TFLOP/s of 989


def test_a_read_logged_every_sixth_step_is_said_as_one_every_six_steps_not_a_fraction() -> None:
    # `if step % 6 == 0: print(loss.item())`: 1/6 of a read per optimizer step.
    logged = Sync("<ipython-input-3>", 16, 'print("loss", loss.item())', (".item()",), 1 / 6, 0.0007)
    result = with_plan(profile(syncs=[logged]), loaders=[], total_memory=None)
    assert "1 sync every 6 steps (line 16)" in verdict_line(result)
    text, html = str(result), result._repr_html_()
    assert ".item(), 1 every 6 steps" in text and ".item(), 1 every 6 steps" in html
    assert "0.166" not in text + html
    item = next(item for item in result.plan if item.cause.startswith("sync"))
    assert "1 every 6 steps" in item.detail


def test_mfu_is_against_the_datasheet_and_the_measured_ceiling_beside_it() -> None:
    result = profile()
    assert result.mfu == pytest.approx(40e12 / 989e12)
    assert result.of_ceiling == pytest.approx(40e12 / 800e12)
    assert result.samples_per_second == pytest.approx(2560)


def test_the_text_and_html_renderings_show_the_same_facts_and_escape_the_code() -> None:
    result = with_plan(profile(syncs=[Sync("<ipython-input-3>", 14, "print(x < y & z)", ("printing a tensor",), 1.0,
                                           0.004)]), loaders=["loader"], total_memory=None)
    text, html = render_text(result), render_html(result)
    for shown in ("waiting for data", "46%", "%dataprobe loader --step STEP", "line 14"):
        assert shown in text and shown in html
    assert "print(x < y & z)" in text and "print(x &lt; y &amp; z)" in html and "x < y" not in html
    assert repr(result).startswith("<ProfileResult: gpuprofile: 100 ms/step")


def test_to_dict_is_plain_data() -> None:
    import json

    data = profile().to_dict()
    assert json.loads(json.dumps(data))["syncs"][0]["line"] == 14
    assert data["steps"] == 20 and data["mfu"] == pytest.approx(40e12 / 989e12)


# -- the kernel timeline ------------------------------------------------------------------------------------------

def test_idle_gaps_are_split_as_hta_splits_them_and_busy_counts_overlap_once() -> None:
    from jupyter_gpu.probekit.kernel_trace import GpuEvent, analyse

    us = 1e-6
    events = [
        GpuEvent(0 * us, 100 * us, stream=7, launched=-5 * us),
        GpuEvent(110 * us, 200 * us, stream=7, launched=50 * us),    # 10 µs gap, launched early: kernel wait
        GpuEvent(300 * us, 400 * us, stream=7, launched=250 * us),   # 100 µs gap, launched after 200: host wait
        GpuEvent(500 * us, 600 * us, stream=7, launched=310 * us),   # 100 µs gap, launched early: other
        GpuEvent(150 * us, 250 * us, stream=8, launched=140 * us),   # overlaps stream 7: busy counts it once
    ]
    timeline = analyse(events, steps=2, window=(0.0, 1000 * us))
    assert timeline is not None
    assert timeline.busy == pytest.approx((100 + 140 + 100 + 100) / 1000)  # 0-100, 110-250, 300-400, 500-600
    assert timeline.kernel_wait == pytest.approx(10 * us / 2)
    assert timeline.host_wait == pytest.approx(100 * us / 2)
    assert timeline.other_wait == pytest.approx(100 * us / 2)
    assert timeline.kernels_per_step == 2.5 and timeline.median_kernel == pytest.approx(100 * us)
    assert not timeline.launch_bound


def test_many_short_kernels_with_an_idle_gpu_are_launch_bound_and_planned() -> None:
    from jupyter_gpu.probekit.kernel_trace import GpuEvent, analyse

    events = [GpuEvent(i * 50e-6, i * 50e-6 + 5e-6, stream=7, launched=i * 50e-6 + 1e-6) for i in range(400)]
    timeline = analyse(events, steps=2, window=(0.0, 0.02))
    assert timeline is not None and timeline.launch_bound and timeline.busy == pytest.approx(0.1)
    result = with_plan(profile(gpu_timeline=timeline, gpu_busy=timeline.busy), loaders=[], total_memory=None)
    item = next(i for i in result.plan if i.cause.startswith("launch-bound"))
    assert "reduce-overhead" in item.command and "200 kernels per step" in item.detail


def test_a_loaded_hosts_one_off_stalls_do_not_make_a_launch_bound_step_host_bound() -> None:
    # As in CI on 2 loaded cores: a launch-bound step's launches came 25-30 us apart, but the OS took the CPU away
    # 3-7 times in 3 steps for 3-8 ms each, somewhere different each time; the sum outgrew the launches' waits and
    # the verdict flipped to host-bound. A step's own host work (its batch) waits before the same launch every step.
    from jupyter_gpu.probekit.kernel_trace import GpuEvent, analyse

    def trace(stall_at: list[int]) -> list[GpuEvent]:
        events, now = [], 0.0
        for i in range(3 * 40):
            now += 0.004 if i in stall_at else 30e-6
            events.append(GpuEvent(now + 2e-6, now + 5e-6, stream=7, launched=now))
        return events

    stalled = analyse(trace([7, 53, 61, 118]), steps=3, window=(0.0, trace([7, 53, 61, 118])[-1].end))
    assert stalled is not None and stalled.outside_launches > stalled.launch_wait  # the sum alone says host work
    assert stalled.step_host_work == 0.0 and stalled.launch_bound
    batch = [40, 80]  # 4 ms before the first launch of every step after the first: the step makes its batch
    # (the window starts at the first kernel: the first step's batch, made before the trace, is in no wait)
    host = analyse(trace(batch), steps=3, window=(trace(batch)[0].start, trace(batch)[-1].end))
    assert host is not None and host.step_host_work == pytest.approx(host.outside_launches) and not host.launch_bound
    ragged = analyse(trace([7, 53, 61, 118])[:-1], steps=3, window=(0.0, 0.02))  # launches that do not line up
    assert ragged is not None and ragged.steady_outside is None and not ragged.launch_bound


def test_a_loaded_host_that_launches_everything_slower_is_still_launching_back_to_back() -> None:
    # As in CI (the fake-CUDA MLP in the timing lane, another test file beside it): every launch came about twice as
    # far apart, and the one recurring slow spot (the optimizer's Python between backward and step, 230 us unloaded)
    # passed 400 us in every step, so a fixed 200 us line called it the step's own host work and the launch-bound
    # step read host-bound. A batch made on the host (10 ms here) still waits before the same launch every step.
    from jupyter_gpu.probekit.kernel_trace import HOST_WORK_SPACING, GpuEvent, analyse

    def trace(pace: float, slow_spot: float, batch: float = 0.0) -> list[GpuEvent]:
        events, now = [], 0.0
        for i in range(3 * 40):
            now += batch if i % 40 == 0 and i else slow_spot if i % 40 == 30 else pace
            events.append(GpuEvent(now + 2e-6, now + 5e-6, stream=7, launched=now))
        return events

    for pace, slow_spot in [(20e-6, 230e-6), (40e-6, 460e-6), (60e-6, 700e-6)]:  # unloaded, 2x, 3x slower
        events = trace(pace, slow_spot)
        timeline = analyse(events, steps=3, window=(0.0, events[-1].end))
        assert timeline is not None and timeline.launch_bound, (pace, timeline)
        assert timeline.step_host_work == 0.0
        batched = trace(pace, slow_spot, batch=0.010)
        host = analyse(batched, steps=3, window=(0.0, batched[-1].end))
        assert host is not None and not host.launch_bound
        assert host.step_host_work == pytest.approx(0.010 * 2 / 3, rel=0.01)
    # However slow the host's pace, a wait past HOST_WORK_SPACING is never launching.
    slow = trace(300e-6, 300e-6, batch=HOST_WORK_SPACING * 1.5)
    timeline = analyse(slow, steps=3, window=(0.0, slow[-1].end))
    assert timeline is not None and timeline.step_host_work == pytest.approx(HOST_WORK_SPACING * 1.5 * 2 / 3, rel=0.01)


def test_time_the_host_waited_for_a_cpu_core_is_not_the_steps_host_work() -> None:
    # As on 2 cores shared three ways: the scheduler held the host off its core 8-16 ms at a time at the same
    # launches of every step (a step that repeats exactly meets the ticks at the same place), so the waits recurred
    # and read as the step's own host work. The run queue says how much of that the OS made.
    from jupyter_gpu.probekit.cpu_contention import runqueue_seconds
    from jupyter_gpu.probekit.kernel_trace import GpuEvent, analyse, with_cpu_wait

    events, now = [], 0.0
    for i in range(3 * 40):
        now += 0.008 if i % 40 in (5, 17) else 30e-6
        events.append(GpuEvent(now + 2e-6, now + 5e-6, stream=7, launched=now))
    # The window from the first kernel: all of it is covered by the waits the run queue's seconds are taken from.
    timeline = analyse(events, steps=3, window=(events[0].start, events[-1].end))
    assert timeline is not None and not timeline.launch_bound and timeline.step_host_work > 0.015
    held = with_cpu_wait(timeline, 1.0, 1.0 + 3 * 0.016)  # the thread queued 16 ms a step
    assert held is not None and held.cpu_wait == pytest.approx(0.016)
    assert held.step_host_work < 1e-3 and held.launch_bound
    assert held.at_step(0.02).cpu_wait == pytest.approx(
        held.at_step(0.02).host_wait * held.cpu_wait / held.host_wait)  # scaled as the waits are
    assert with_cpu_wait(timeline, None, 2.0) is timeline  # where the OS does not say, nothing is taken off
    # On Linux the figure is read for real: it is a count of seconds that only grows.
    before = runqueue_seconds()
    if before is not None:
        after = runqueue_seconds()
        assert after is not None and after >= before >= 0


def test_the_timeline_is_set_against_the_unprofiled_step_so_no_cause_outgrows_the_step() -> None:
    # As on the H200: torch.profiler slowed a 38.4 ms transformer step to about 53 ms, and the trace had the GPU
    # waiting 46 ms a step for the host; the plan said "launch-bound (45.9 ms/step)" on a 38.4 ms step.
    from jupyter_gpu.probekit.kernel_trace import GpuEvent, analyse

    traced = 0.053
    events = [GpuEvent(i * traced / 860, i * traced / 860 + 8e-6, stream=7, launched=i * traced / 860 + 2e-6)
              for i in range(860 * 3)]
    timeline = analyse(events, steps=3, window=(0.0, 3 * traced))
    assert timeline is not None and timeline.host_wait > 0.038  # the trace's own figure: more than the step
    seen = timeline.at_step(0.0384)
    assert seen.kernel_seconds == pytest.approx(timeline.kernel_seconds)  # the same kernels
    assert seen.busy == pytest.approx(860 * 8e-6 / 0.0384)
    assert seen.host_wait + seen.kernel_wait + seen.other_wait == pytest.approx(0.0384 - 860 * 8e-6)
    assert seen.traced_step == pytest.approx(traced) and seen.launch_bound
    result = with_plan(profile(gpu_timeline=seen, gpu_busy=seen.busy), loaders=[], total_memory=None)
    item = next(i for i in result.plan if i.cause.startswith("launch-bound"))
    assert item.seconds < 0.0384
    text = render_text(result)
    assert "of a typical step" in text and "under torch.profiler, 53.0 ms per step there" in text
    # The phases' CUDA-event GPU time is a span that waits with the host: the note says so, with the kernels' time.
    assert "GPU time: each phase's span" not in text  # no phase has a GPU time here
    assert not any(line.rstrip().endswith("GPU time") for line in text.splitlines())  # nor an empty column for it
    forward = replace(result.breakdown[1], gpu_seconds=0.0150)
    spans = render_text(replace(result, breakdown=[result.breakdown[0], forward, *result.breakdown[2:]]))
    assert "spread             GPU time" in spans and "15.0 ms" in spans
    assert ("GPU time: each phase's span on the GPU (CUDA events around it), idle gaps included; its kernels ran "
            "6.88 ms of the whole step (18%, kernel timeline)") in spans
    # Kernels that fill most of the unprofiled step are not launch-bound, however idle the traced GPU looked.
    busy = analyse([GpuEvent(i * 1e-4, i * 1e-4 + 1.5e-5, stream=7, launched=i * 1e-4 + 2e-5) for i in range(900)],
                   steps=3, window=(0.0, 0.09))
    assert busy is not None and busy.launch_bound and not busy.at_step(0.006).launch_bound
    assert busy.at_step(0.006).busy == pytest.approx(0.75)


def test_on_cuda_operators_rank_by_their_kernels_time_not_the_hosts() -> None:
    # As on the H200: a bf16 transformer's table led with `_to_copy` (12.9 ms of host time a step) and
    # `_local_scalar_dense` (104 CPU scalar reads, 2.7 ms), and "100% of operator time is memory-bound".
    from jupyter_gpu.gpuprofile.assemble import _operators
    from jupyter_gpu.gpuprofile.census import CensusTotals, OperatorCount

    totals = CensusTotals(operators={
        "_to_copy": OperatorCount(calls=196, seconds=0.0129, bytes=680_000_000),
        "_local_scalar_dense": OperatorCount(calls=104, seconds=0.0027, bytes=416),
        "mm": OperatorCount(calls=76, seconds=0.0072, flops=232_000_000_000, bytes=1_000_000_000),
    }, flops_by_dtype={})
    ceiling = Ceiling(device="cuda:0", compute="bf16", matmul_flops=8.5e14, bandwidth=3.6e12, seconds=0.07,
                      datasheet_flops=989e12, datasheet_bandwidth=4.8e12)
    host, host_share, _ = _operators(totals, ceiling, {})
    assert [op.name for op in host] == ["_to_copy", "mm", "_local_scalar_dense"] and host_share > 0.6
    gpu_times = {("_to_copy", False): 0.0004, ("_local_scalar_dense", False): 0.0, ("mm", False): 0.0030,
                 ("addmm", False): 0.001}
    ranked, share, _ = _operators(totals, ceiling, gpu_times)
    assert [(op.name, op.time) for op in ranked] == [("mm", 0.0030), ("_to_copy", 0.0004),
                                                     ("_local_scalar_dense", 0.0)]
    assert ranked[0].seconds == 0.0072 and ranked[0].bound == "compute"  # the host time is kept beside it
    assert share == pytest.approx(0.0004 / 0.0034)
    text = render_text(profile(operators=ranked, memory_bound_share=share))
    assert "Top operators by their kernels' time per step" in text and "GPU time/step" in text
    assert "12% of operator time is memory-bound" in text


def test_the_compile_fixes_name_the_models_the_loop_called() -> None:
    from jupyter_gpu.probekit.kernel_trace import GpuEvent, analyse

    events = [GpuEvent(i * 50e-6, i * 50e-6 + 5e-6, stream=7, launched=i * 50e-6 + 1e-6) for i in range(400)]
    timeline = analyse(events, steps=2, window=(0.0, 0.02))
    gan = profile(models=["G", "D"], memory_bound_share=0.5, gpu_timeline=timeline, gpu_busy=0.1)
    commands = {item.cause: item.command for item in with_plan(gan, loaders=[], total_memory=None).plan}
    assert commands["memory-bound operators (fusion candidates)"] == (
        "G = torch.compile(G); D = torch.compile(D)  (or %speedprobe STEP --try compile)")
    assert commands["launch-bound: the GPU waits between many short kernels"] == (
        'G = torch.compile(G, mode="reduce-overhead"); D = torch.compile(D, mode="reduce-overhead")  '
        "(fusion and CUDA graphs)")
    unnamed = with_plan(profile(memory_bound_share=0.5), loaders=[], total_memory=None).plan
    assert any(item.command.startswith("model = torch.compile(model)  (or") for item in unnamed)


def test_no_events_no_timeline() -> None:
    from jupyter_gpu.probekit.kernel_trace import analyse

    assert analyse([], steps=3, window=(0.0, 1.0)) is None


@pytest.mark.parametrize(("file", "where"), [
    ("<ipython-input-3-5f2a>", "line 14"), ("/tmp/ipykernel_16749/1208385271.py", "line 14"),
    ("/home/me/project/train.py", "train.py:14"),
])
def test_a_sync_in_a_notebook_cell_is_named_by_its_line(file: str, where: str) -> None:
    assert Sync(file, 14, "x.item()", (".item()",), 1.0, 0.0).where == where


def test_apply_compares_the_faster_run_of_each_so_one_disturbed_run_does_not_decide() -> None:
    # A clean clone's suite: the second run with the fixes took 71 ms a step (the machine busy), the first 15.6 ms;
    # the mean of the two made a 2.8x fix look like 0.91x.
    def run(seconds: float, data_share: float) -> RunFigures:
        return RunFigures(seconds=seconds, samples_per_second=16 / seconds, mfu=None, of_ceiling=None,
                          peak_memory=None, data_share=data_share, sync_share=None, losses=[1.0],
                          step_seconds=[seconds] * 3, run_seconds=[seconds])

    before = RunFigures.fastest([run(0.0436, 0.89), run(0.0357, 0.88)])
    after = RunFigures.fastest([run(0.0156, 0.30), run(0.0713, 0.60)])
    assert (before.seconds, before.data_share, after.seconds, after.data_share) == (0.0357, 0.88, 0.0156, 0.30)
    assert before.run_seconds == [0.0436, 0.0357] and len(after.step_seconds) == 6  # every run is kept
    applied = AppliedFixes(applied=["loader"], left_out=[], checked=[], code=[], before=before, after=after,
                           runs_each=2)
    assert applied.speedup == pytest.approx(0.0357 / 0.0156)
    assert applied.pair_speedups == pytest.approx([0.0436 / 0.0156, 0.0357 / 0.0713])


def test_apply_shows_both_runs_mean_loss_with_the_same_decimals() -> None:
    def run(losses: list[float]) -> RunFigures:
        return RunFigures(0.003, 40_000.0, None, 0.24, None, 0.22, 0.0, losses)

    applied = AppliedFixes(["bf16 autocast"], [], [], [], run([2.32, 2.32]), run([2.31, 2.30]))
    row = next(line for line in str(replace(profile(), applied=applied)).splitlines() if "loss (mean" in line)
    assert row.split()[-2:] == ["2.320", "2.305"]  # not "2.32" beside "2.305"


def test_apply_leaves_out_a_figure_neither_run_has() -> None:
    # An evaluation loop on a CPU: no MFU (no datasheet), no peak memory (no CUDA allocator), no loss.
    def run(seconds: float) -> RunFigures:
        return RunFigures(seconds, 64 / seconds, None, 0.2, None, 0.07, 0.0, [])

    applied = AppliedFixes(["bf16 autocast"], [], [], [], run(0.016), run(0.013))
    shown = str(replace(profile(), applied=applied))
    table = shown[shown.index("--apply"):]
    assert "n/a" not in table and "MFU" not in table and "loss (mean" not in table
    assert "  step  " in table and "stalls recur" not in table
    stalled = AppliedFixes(["loader"], [], [], [], replace(run(0.05), stalls_included=True), run(0.013))
    assert "step (mean: stalls recur)" in str(replace(profile(), applied=stalled))
    assert "of the matmul ceiling" in table and "samples/s" in table


def test_apply_pairs_that_disagree_are_called_not_reproducible_not_a_speed_up() -> None:
    # As a shared machine gave them: the pairs (before, after) 1.21x and 0.22x, shown as "1.21x per step".
    def runs(*seconds: float) -> RunFigures:
        return RunFigures(min(seconds), 64 / min(seconds), None, 0.5, None, 0.1, 0.0, [], run_seconds=list(seconds))

    shared = AppliedFixes(["bf16 autocast"], [], [], [], runs(0.212, 0.050), runs(0.176, 0.230), runs_each=2)
    text = str(replace(profile(), applied=shared))
    assert not shared.reproducible and shared.to_dict()["reproducible"] is False
    assert "x per step, measured on your loop" not in text
    assert "not reproducible: the pairs of runs gave 0.22x to 1.20x" in text
    steady = AppliedFixes(["bf16 autocast"], [], [], [], runs(0.212, 0.214), runs(0.176, 0.170), runs_each=2)
    assert steady.reproducible and "1.25x per step, measured on your loop" in str(replace(profile(), applied=steady))


def test_resizing_a_batch_leaves_nothing_for_the_garbage_collector() -> None:
    # %batchprobe counts what stays alive after each call: a reference cycle holding the index tensor looked like a
    # leak of 8 bytes a sample per call.
    import gc
    import weakref

    import torch

    from jupyter_gpu.gpuprofile.batches import resize_batch

    batch = {"features": torch.randn(4, 3), "target": torch.arange(4)}
    gc.collect()
    gc.disable()
    try:
        resized = resize_batch(batch, 1000)
        kept = weakref.ref(resized["target"])
        del resized
        assert kept() is None, "freed by reference counting, with no collection"
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_a_gan_body_returns_the_generator_loss_the_last_backward_was_called_on() -> None:
    # Two backward calls (the discriminator's, then the generator's): the ready step returns the generator's loss, so
    # %speedprobe compares a loss over the steps as well as the update (it said "returns no loss" before).
    text = """for i, (real, _) in enumerate(loader):
    optD.zero_grad()
    errD = criterion(D(real), ones) + criterion(D(G(noise).detach()), zeros)
    errD.backward()
    optD.step()
    optG.zero_grad()
    errG = criterion(D(G(noise)), ones)
    errG.backward()
    optG.step()
"""
    names = {name: 1 for name in ("loader", "optD", "optG", "criterion", "D", "G", "ones", "zeros", "noise")}
    steps, _ = lift_from(text, 1, names)
    function = ast.parse(steps[0].code).body[0]
    assert isinstance(function.body[-1], ast.Return) and function.body[-1].value.id == "errG"


def test_loaders_are_named_as_the_probes_take_them_a_variable_or_an_attribute_path() -> None:
    import torch
    from torch.utils.data import DataLoader

    from jupyter_gpu.gpuprofile.instrument import loaders_seen

    class Trainer:
        def __init__(self) -> None:
            self.train_loader = DataLoader(list(range(8)), batch_size=2)

    trainer, loose, in_dict = Trainer(), DataLoader(list(range(4))), DataLoader(list(range(6)))
    namespace = {"trainer": trainer, "loose": loose, "loaders": {"val": in_dict}}
    samplers = [in_dict._index_sampler, trainer.train_loader._index_sampler, loose._index_sampler]
    # `loaders['val']` is no name %dataprobe takes: it is left out, not printed as a command that cannot run.
    assert loaders_seen(namespace, samplers, torch.utils.data.DataLoader) == ["trainer.train_loader", "loose"]
