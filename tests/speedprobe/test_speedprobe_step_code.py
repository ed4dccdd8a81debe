"""The lines to adopt are written with the step's own names and statements (`outputs = net(inputs)`,
`loss = criterion(outputs, labels)`), read from the source of steps defined in a real IPython shell, and the
template stays where that source cannot be used as it is."""

from __future__ import annotations

from jupyter_gpu.speedprobe.catalog import CodeContext, OptimizerCode, adopt_lines
from jupyter_gpu.speedprobe.step_code import forward_code

SETUP = """
import torch
from torch import nn
torch.manual_seed(0)
net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                    nn.Flatten(), nn.Linear(8, 10))
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
images, targets = torch.randn(16, 3, 16, 16), torch.randint(0, 10, (16,))
"""


def context_for(ip, step: str, models: tuple[str, ...] = ("net",), forward_only: bool = False) -> CodeContext:
    ip.run_cell(SETUP + step).raise_error()
    return CodeContext(device_type="cuda", models=models, optimizers=(OptimizerCode(name="optimizer"),),
                       forward_only=forward_only,
                       forward=forward_code(ip.user_ns["train_step"], models, forward_only))


def test_autocast_wraps_the_steps_own_forward_and_loss_and_the_scaler_scales_its_loss(ip) -> None:
    context = context_for(ip, """
def train_step():
    optimizer.zero_grad()
    outputs = net(images)
    loss = criterion(outputs,
                     targets)
    loss.backward()
    optimizer.step()
""")
    assert adopt_lines(("amp-bf16",), context) == [
        'with torch.autocast("cuda", dtype=torch.bfloat16):  # in the step, around these lines of it; backward '
        "stays outside",
        "    outputs = net(images)",
        "    loss = criterion(outputs,",
        "                     targets)",
    ]
    fp16 = adopt_lines(("amp-fp16",), context)
    assert fp16[2:6] == ["    outputs = net(images)", "    loss = criterion(outputs,", "                     targets)",
                         "scaler.scale(loss).backward()"]
    assert fp16[-2:] == ["scaler.step(optimizer)", "scaler.update()"]
    # `images` is a global: `images = images.to(...)` inside the step would make it a local and raise
    # UnboundLocalError, so the model's call converts it.
    assert adopt_lines(("channels-last",), context)[-1] == (
        "outputs = net(images.to(memory_format=torch.channels_last))  # in the step: the model's input in "
        "channels_last")
    # With autocast, which quotes the call too, the converted call goes inside its block: the lines had the call
    # twice, once converted before the block and once as it was inside it, so pasting them undid channels_last.
    combined = adopt_lines(("channels-last", "amp-bf16"), context)
    assert combined == [
        "net = net.to(memory_format=torch.channels_last)  # before creating the optimizer",
        'with torch.autocast("cuda", dtype=torch.bfloat16):  # in the step, around these lines of it; backward '
        "stays outside",
        "    outputs = net(images.to(memory_format=torch.channels_last))",
        "    loss = criterion(outputs,",
        "                     targets)",
    ]
    assert sum("net(" in line for line in combined) == 1
    assert "    outputs = net(images.to(memory_format=torch.channels_last))" in adopt_lines(
        ("channels-last", "amp-fp16"), context)


def test_a_batch_the_step_unpacks_is_converted_where_it_is_and_a_dict_batch_in_the_call(ip) -> None:
    context = context_for(ip, """
def train_step(batch=(images, targets)):
    inputs, labels = batch
    optimizer.zero_grad()
    loss = criterion(net(inputs), labels)
    loss.backward()
    optimizer.step()
""")
    assert adopt_lines(("channels-last",), context)[-1] == (
        "inputs = inputs.to(memory_format=torch.channels_last)  # each input batch, in the step")
    assert adopt_lines(("amp-bf16",), context)[1:] == ["    loss = criterion(net(inputs), labels)"]
    context = context_for(ip, """
def train_step(batch={"pixels": images, "label": targets}):
    optimizer.zero_grad()
    logits = net(batch["pixels"])  # the forward
    loss = criterion(logits, batch["label"])
    loss.backward()
    optimizer.step()
""")
    assert adopt_lines(("channels-last",), context)[-1] == (
        'logits = net(batch["pixels"].to(memory_format=torch.channels_last))  # the forward  # in the step: the '
        "model's input in channels_last")


def test_steps_that_cannot_be_quoted_as_they_are_keep_the_template(ip) -> None:
    one_line = context_for(ip, """
def train_step():
    optimizer.zero_grad()
    criterion(net(images), targets).backward()
    optimizer.step()
""")
    assert one_line.forward is None
    assert adopt_lines(("amp-bf16",), one_line)[1] == (
        "    loss = loss_fn(net(x), y)  # stands for your step's forward and loss lines")
    accumulating = context_for(ip, """
def train_step():
    optimizer.zero_grad()
    for chunk_x, chunk_y in zip(images.chunk(2), targets.chunk(2)):
        loss = criterion(net(chunk_x), chunk_y) / 2
        loss.backward()
    optimizer.step()
""")
    assert accumulating.forward is None  # a backward per micro-batch: no one block to wrap
    assert adopt_lines(("amp-fp16",), accumulating)[2].endswith("# stands for your step's forward and loss lines")
    own_autocast = context_for(ip, """
def train_step():
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = criterion(net(images), targets)
    loss.backward()
    optimizer.step()
""")
    assert own_autocast.forward is None
    two_losses = context_for(ip, """
def train_step():
    loss_a = criterion(net(images), targets)
    loss_a.backward()
    loss_b = criterion(net(images * 2), targets)
    loss_b.backward()
""")
    assert two_losses.forward is None
    ip.run_cell("train_step = lambda: criterion(net(images), targets).backward()").raise_error()
    assert forward_code(ip.user_ns["train_step"], ("net",)) is None


def test_a_step_lifted_by_gpuprofile_gets_the_loops_own_names(ip) -> None:
    ip.run_cell(SETUP + """
from torch.utils.data import DataLoader, TensorDataset
loader = DataLoader(TensorDataset(torch.randn(256, 3, 16, 16), torch.randint(0, 10, (256,))), batch_size=16)
""").raise_error()
    ip.run_cell("""%%gpuprofile -q --steps 3 --warmup 1
for epoch in range(3):
    for inputs, labels in loader:
        optimizer.zero_grad()
        outputs = net(inputs)
        loss = criterion(outputs, labels)
        loss.backward()
        optimizer.step()
""").raise_error()
    result = ip.run_cell("%speedprobe profile_train_step --try channels-last --steps 3 -o -q").result
    lines = adopt_lines(("channels-last", "amp-bf16"), result.code_context)
    assert "inputs = inputs.to(memory_format=torch.channels_last)  # each input batch, in the step" in lines
    assert lines[-2:] == ["    outputs = net(inputs)", "    loss = criterion(outputs, labels)"]


def test_without_the_steps_source_the_input_conversion_names_no_variable() -> None:
    # A lifted loop body's step calls the body: its own source shows no model call, and the line had read
    # `x = x.to(...)` for a loop whose batch was `images`.
    from jupyter_gpu.speedprobe.catalog import CodeContext, adopt_lines

    lines = adopt_lines(("channels-last",), CodeContext(device_type="cpu", models=("cnn",)))
    assert lines[0] == "cnn = cnn.to(memory_format=torch.channels_last)  # before creating the optimizer"
    assert lines[1].startswith("# and each input batch, where the step calls cnn: ")
    assert not any(line.startswith("x = ") for line in lines)
