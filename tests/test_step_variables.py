"""The notebook variables a step changes as it runs are put back after a probe: a step counter, a running loss, a
history list. Found on a loop `%%gpuprofile` lifted with `global_step += 1` and `if global_step >= max_steps: break`
in its body: `%speedprobe profile_train_step` left the user's `global_step` at 38 instead of 14, and after enough
probe calls the step would have stopped returning its loss. Real torch on the CPU, steps defined in a namespace
dict as a notebook defines them."""

from __future__ import annotations

import os
import textwrap

import torch

from jupyter_gpu.probekit.step_variables import StepVariables, step_globals

NOTEBOOK = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
model = nn.Linear(8, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,))), batch_size=32)
global_step = 14
max_steps = 20
losses = [0.5]
stats = {"seen": 448}
running = torch.zeros(())
checkpoint = None  # a path: the body saves the model there every fifth step

def train_body(batch):
    global global_step
    x, y = batch
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    global_step += 1
    losses.append(loss.item())
    stats["seen"] += len(y)
    running.add_(loss.detach())
    if global_step % 5 == 0:
        print(f"[{global_step}] loss: {loss.item():.3f}")  # a tutorial's logging, kept in the lifted body
        if checkpoint:
            torch.save(model.state_dict(), checkpoint)
    if global_step >= max_steps:
        return
    return loss

batch = next(iter(loader))

def train_step():
    return train_body(batch)

def sized_step(batch_size):
    x, y = batch
    return train_body((x[:1].repeat(batch_size, 1), y[:1].repeat(batch_size)))
"""


def notebook() -> dict:
    namespace: dict = {}
    exec(textwrap.dedent(NOTEBOOK), namespace)
    return namespace


def state(ns: dict) -> tuple:
    return ns["global_step"], list(ns["losses"]), dict(ns["stats"]), float(ns["running"])


def test_the_step_reaches_the_variables_of_the_functions_it_calls() -> None:
    ns = notebook()
    names = {name for _, name in step_globals(ns["train_step"])}
    assert {"global_step", "max_steps", "losses", "stats", "running", "batch", "optimizer", "model"} <= names
    # A notebook function is followed; of it, a snapshot keeps only the numbers it holds on itself.
    assert "train_body" in names
    snapshot = StepVariables.take(ns["train_step"], skip=set())
    assert all(name != "train_body" for _, name, _, _ in snapshot._entries)


def test_the_counter_a_lifted_step_keeps_on_itself_is_put_back_and_not_reported() -> None:
    # As %%gpuprofile lifts a loop: `iter = range(...)[step.calls % ...]; step.calls += 1`. Left counting, a probe's
    # second configuration started where the first stopped, past the loop's `if iter % 50 == 0` evaluation, drew
    # other random batches, and the step was judged not repeatable.
    namespace: dict = {}
    exec(textwrap.dedent("""
        seen = []
        def profile_train_step():
            i = range(0, 200)[profile_train_step.calls % 200]
            profile_train_step.calls += 1
            seen.append(i)
        profile_train_step.calls = 0
    """), namespace)
    step = namespace["profile_train_step"]
    snapshot = StepVariables.take(step, skip=set())
    for _ in range(3):
        step()
    snapshot.restore()
    step()
    assert namespace["seen"] == [0] and step.calls == 1
    assert snapshot.changed == ["seen"]


def test_a_restore_puts_counters_lists_dicts_and_small_tensors_back_in_place() -> None:
    ns = notebook()
    losses, stats, running = ns["losses"], ns["stats"], ns["running"]
    before = state(ns)
    snapshot = StepVariables.take(ns["train_step"], skip={id(ns["model"]), id(ns["optimizer"])})
    for _ in range(10):
        ns["train_step"]()
    ns["made_by_the_step"] = 1  # a name the snapshot did not have is not touched unless the step names it
    assert state(ns) != before
    snapshot.restore()
    assert state(ns) == before
    assert ns["losses"] is losses and ns["stats"] is stats and ns["running"] is running  # in place
    assert snapshot.changed == ["global_step", "losses", "stats", "running"]
    snapshot.restore()  # again: nothing more to put back, the same names reported
    assert state(ns) == before and snapshot.changed == ["global_step", "losses", "stats", "running"]


def test_the_attributes_a_step_changes_on_the_users_own_object_are_put_back() -> None:
    # `%speedprobe trainer.train_step`: the method counts self.step and logs into self.log, which holds an object of
    # the user's too; a frozen dataclass (no __setattr__) among the attributes is read, never written.
    namespace: dict = {"__name__": "__main__"}  # as in a notebook: the classes are of module __main__
    exec(textwrap.dedent("""
        import dataclasses

        @dataclasses.dataclass(frozen=True)
        class Config:
            lr: float = 0.1

        class Log:
            def __init__(self):
                self.lines, self.last = [], None

        class Trainer:
            def __init__(self):
                self.step, self.log, self.config = 0, Log(), Config()

            def train_step(self):
                self.step += 1
                self.log.lines.append(self.step)
                self.log.last = self.step
                self.cache = {"made": self.step}

        trainer = Trainer()
    """), namespace)
    trainer = namespace["trainer"]
    log, lines = trainer.log, trainer.log.lines
    probe = StepVariables.take(trainer.train_step, skip=set())
    for _ in range(3):
        trainer.train_step()
    probe.restore()
    assert (trainer.step, trainer.log.lines, trainer.log.last) == (0, [], None)
    assert trainer.log is log and log.lines is lines and not hasattr(trainer, "cache")
    assert probe.changed == ["trainer.cache", "trainer.step", "trainer.log.lines", "trainer.log.last"]
    # A profiled run (whole_run) keeps the attributes it added, as it keeps the names a cell creates.
    profiled = StepVariables.take(trainer.train_step, skip=set(), whole_run=True)
    trainer.train_step()
    profiled.restore()
    assert trainer.step == 0 and trainer.cache == {"made": 1}


def test_a_librarys_objects_are_left_as_the_step_leaves_them() -> None:
    # A notebook's `logger = logging.getLogger(...)` is a library's object: rewinding it rewound its manager's
    # registry too, so a logger a library made during the step was dropped from it, and the next getLogger of that
    # name made a second, unconfigured one. (A wandb run's step counter is the same kind of state.)
    import logging

    namespace: dict = {"__name__": "__main__"}
    exec(textwrap.dedent("""
        import logging
        logger = logging.getLogger("jupyter_gpu_tests.train")

        def train_step():
            logger.debug("step")
            logging.getLogger("jupyter_gpu_tests.train.made_by_a_library")
    """), namespace)
    probe = StepVariables.take(namespace["train_step"], skip=set())
    namespace["train_step"]()
    made = logging.getLogger("jupyter_gpu_tests.train.made_by_a_library")
    probe.restore()
    assert logging.getLogger("jupyter_gpu_tests.train.made_by_a_library") is made
    assert probe.changed == []


def test_a_probe_names_the_loader_iterator_its_calls_moved_on() -> None:
    from jupyter_gpu.speedprobe.runner import probe_speed

    ns = notebook()
    exec(textwrap.dedent("""
        train_iter = iter(loader)

        def next_batch_step():  # the infinite-loader pattern: a new epoch where the iterator ends
            global train_iter
            try:
                batch = next(train_iter)
            except StopIteration:
                train_iter = iter(loader)
                batch = next(train_iter)
            return train_body(batch)
    """), ns)
    first = ns["train_iter"]
    speed = probe_speed(ns["next_batch_step"], options=("fused-optimizer",), steps=2, namespace=ns)
    taken = ns["train_iter"]._num_yielded
    assert ns["train_iter"] is first and taken > 2  # the binding is put back; the batches it gave are not
    # It read the 8 batches the iterator had, to its end, then made new ones (dropped with the probe's calls).
    assert taken == len(ns["loader"])
    notes = " ".join(speed.notes)
    assert (f"The probe's calls of the step read from iterators of the notebook (train_iter: {taken} batches, to its "
            "end). Their bindings are put back, but an iterator cannot be rewound") in notes, notes
    assert "train_iter" not in speed.restored  # not also claimed "exactly as before"


def test_speedprobe_batchprobe_and_dataprobe_leave_the_notebooks_variables_as_they_were(capsys, tmp_path) -> None:
    from jupyter_gpu.batchprobe.runner import ProbeRequest, probe_batch_size
    from jupyter_gpu.dataprobe.runner import probe_loader
    from jupyter_gpu.speedprobe.runner import probe_speed

    ns = notebook()
    # The body's periodic checkpoint, called tens of times by each probe, overwrote the user's file with the trials'.
    checkpoint = ns["checkpoint"] = tmp_path / "model.pt"
    checkpoint.write_bytes(b"the real run's checkpoint")
    before = state(ns)
    speed = probe_speed(ns["train_step"], options=("fused-optimizer",), steps=3, namespace=ns)
    assert state(ns) == before
    assert {"global_step", "losses", "stats", "running"} <= set(speed.restored)
    # Every call of the step returned its loss: the counter never reached max_steps inside the probe.
    assert not any("returns no loss" in note for note in speed.notes)
    sized = probe_batch_size(ns["sized_step"], ProbeRequest(max_memory=64 << 20, max_seconds=30), namespace=ns)
    assert state(ns) == before and "global_step" in sized.restored
    data = probe_loader(ns["loader"], ns["train_body"], workers=[0], seconds=3, namespace=ns)
    assert state(ns) == before and "global_step" in data.restored
    assert torch.equal(ns["running"], torch.zeros(()))
    assert checkpoint.read_bytes() == b"the real run's checkpoint" and os.listdir(tmp_path) == ["model.pt"]
    # The body's print ran on the probes' calls: kept out of the output, counted in each report.
    assert "loss:" not in capsys.readouterr().out
    for result in (speed, sized, data):
        assert f"{checkpoint}: written by the step's torch.save while the probe called it and put back" in " ".join(
            result.notes), result.notes
        [printed] = [note for note in result.notes if "printed" in note]
        assert "while the probe called it, not shown here (the first: '[" in printed, printed
        assert "they come from the probe's calls, not from training" in printed


def test_a_progress_bar_the_loop_updates_neither_moves_nor_redraws_while_a_probe_calls_the_step() -> None:
    # The Hugging Face course's loop: progress_bar = tqdm(range(num_training_steps)); progress_bar.update(1) in
    # the body. A bar draws to the stream it was made with, so only pausing it keeps the probe's calls off it.
    import io

    from tqdm import tqdm

    from jupyter_gpu.speedprobe.runner import probe_speed

    ns = notebook()
    screen = io.StringIO()
    ns["progress_bar"] = tqdm(total=100, file=screen, mininterval=0, miniters=1)
    exec("def bar_step():\n    loss = train_step()\n    progress_bar.update(1)\n    return loss\n", ns)
    ns["progress_bar"].update(3)
    drawn = screen.getvalue()
    probe_speed(ns["bar_step"], options=("fused-optimizer",), steps=3, namespace=ns)
    assert ns["progress_bar"].n == 3 and screen.getvalue() == drawn
    assert not ns["progress_bar"].disable  # the user's bar works again after the probe
    ns["progress_bar"].update(1)
    assert ns["progress_bar"].n == 4 and screen.getvalue() != drawn


def test_what_another_thread_writes_meanwhile_is_not_the_steps_and_goes_on_out(capsys) -> None:
    # A terminal shell prints the probe's own progress line from its ticking thread while the step runs: counted
    # as the step's, %speedprobe said "printed 3 lines (the first: 'speedprobe profile_train_step: amp-bf16 …')".
    import threading

    from jupyter_gpu.probekit.step_output import StepOutput

    output = StepOutput()
    with output.hidden():
        print("the step's own line")
        ticker = threading.Thread(target=print, args=("speedprobe: step 3/7, 1.2 s elapsed",))
        ticker.start()
        ticker.join()
    assert output.lines == 1 and output.first == "the step's own line"
    assert capsys.readouterr().out == "speedprobe: step 3/7, 1.2 s elapsed\n"
