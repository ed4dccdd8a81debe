"""`probe_loader` / `run_dataprobe` on real DataLoaders and real steps on the CPU, with known costs.

The fixtures sleep (tests/fixtures/sleepy_data.py): a sleep holds no CPU, so workers overlap for real even on two
cores, and the ratio of loading to compute is a number each test chooses. Budgets are a few seconds.
"""

from __future__ import annotations

import gc
import random
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from processes import child_pids
from sleepy_data import SleepyDataset, loader_for_ratio, sleepy_loader, sleepy_step
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from jupyter_gpu.dataprobe.result import CURRENT, LOOP, RECHECK, SWEEP, VERIFY
from jupyter_gpu.dataprobe.runner import DataProbeError, DataProbeRequest, probe_loader, run_dataprobe
from jupyter_gpu.dataprobe.settings import LoaderSettings

STEP_SECONDS = 0.02


def probe(loader, step=None, *, workers=None, seconds=4.0, **kwargs):
    return run_dataprobe(loader, step, DataProbeRequest(workers, seconds), loader_name="loader",
                         step_name="step" if step is not None else None, **kwargs)




def unchanged(now: dict, before: dict) -> bool:
    return now.keys() == before.keys() and all(torch.equal(now[key], before[key]) for key in now)


def live_tensors() -> dict[int, torch.Tensor]:
    # type(), not isinstance(): isinstance reads __class__, and torch's deprecated module aliases warn on that.
    return {id(obj): obj for obj in gc.get_objects() if issubclass(type(obj), torch.Tensor)}


# -- the verdict on known ratios --------------------------------------------------------------------------------

# (load/compute ratio, the loader's workers, the verdict). Without workers the loop is serial, so the share of it
# spent waiting is r/(1+r); one worker overlaps loading with the step, so the wait is max(0, 1 - 1/r).
KNOWN_RATIOS = [
    (0.2, 0, "balanced"),        # waits 17% of the loop
    (1.0, 0, "input-bound"),     # 50%
    (5.0, 0, "input-bound"),     # 83%
    (0.2, 1, "compute-bound"),   # 0%: the worker keeps ahead
    (0.5, 1, "compute-bound"),   # 0%
    (2.0, 1, "input-bound"),     # 50%
    (5.0, 1, "input-bound"),     # 80%
]


# Handing a batch over from a worker costs the loop 1-2 ms on these two cores, counted as waiting: a 50 ms step keeps
# that far from the 10% line between compute-bound and balanced.
VERDICT_STEP_SECONDS = 0.05


@pytest.mark.timing
@pytest.mark.parametrize(("ratio", "workers", "expected"), KNOWN_RATIOS)
def test_the_verdict_is_right_on_every_known_ratio(ratio, workers, expected):
    loader = loader_for_ratio(ratio, step_seconds=VERDICT_STEP_SECONDS, num_workers=workers,
                              persistent_workers=workers > 0)
    result = probe(loader, sleepy_step(VERDICT_STEP_SECONDS), workers=(workers,), seconds=3.0)
    assert result.verdict == expected, (ratio, workers, result.wait_fraction)
    step_rate = 8 / VERDICT_STEP_SECONDS
    assert result.step_alone.samples_per_second == pytest.approx(step_rate, rel=0.25)
    assert len(result.step_alone.rates) >= 2 and len(result.together.rates) >= 2  # each with its spread
    assert result.perfect_loader_speedup >= 1.0


@pytest.mark.timing
def test_an_input_bound_loader_gets_more_workers_and_the_gain_is_checked():
    loader = loader_for_ratio(2.0, step_seconds=STEP_SECONDS)  # one batch takes two steps to load
    result = probe(loader, sleepy_step(STEP_SECONDS), workers=(0, 1, 2), seconds=8.0)
    assert result.verdict == "input-bound"
    assert result.recommended_settings.num_workers == 2
    assert result.recommended["num_workers"] == 2
    assert "num_workers=2" in result.code()
    # Two workers load two batches per four steps' time: the loop runs at the step's speed, about 3x serial.
    assert result.speedup > 2.0
    assert result.predicted >= 0.9 * result.best  # within 10% of the best the sweep saw
    assert result.verified == pytest.approx(result.predicted, rel=0.25)
    stages = [trial.stage for trial in result.trials]
    # The recommendation is checked last, on a fresh loader; the runner-up is measured again only when that check
    # fell under 90% of what it showed in the sweep, and a note then says so.
    assert stages[:2] == [CURRENT, CURRENT] and VERIFY in stages
    assert stages.count(RECHECK) == 0 or any("measured again" in note for note in result.notes), result.notes
    swept = [trial for trial in result.trials if trial.stage in (SWEEP, RECHECK)]
    assert all(len(trial.rates) >= 2 for trial in swept)  # every setting measured more than once
    # 1 worker loads at most half the step's speed, under what 2 measured: left out, and said why.
    counts = {trial.settings.num_workers for trial in result.trials}
    assert counts in ({0, 1, 2}, {0, 2}), counts
    if 1 not in counts:
        assert any(skip.startswith("1 worker: each worker loads at most what one process loads alone")
                   for skip in result.skipped), result.skipped
    # Deeper prefetch and non-persistent workers are swept unless the probe says why not (two workers keep up with
    # this step by design; batches that all take one sleep to load; no epoch ends within a trial).
    prefetch = {trial.settings.prefetch_factor for trial in swept if trial.settings.num_workers}
    persistent = {trial.settings.persistent_workers for trial in swept if trial.settings.num_workers}
    if 4 not in prefetch:
        assert any(skip.startswith("deeper prefetch") for skip in result.skipped), result.skipped
    if False not in persistent:
        assert any(skip.startswith(("deeper prefetch and non-persistent", "non-persistent workers"))
                   for skip in result.skipped), result.skipped
    assert all(trial.mode == LOOP for trial in result.trials[1:])
    assert not any(trial.settings.pin_memory for trial in result.trials)  # pinning is for a GPU step


@pytest.mark.timing
def test_a_steady_loader_five_steps_to_load_is_swept_only_where_a_setting_could_win():
    # One process loads a batch in five steps' time, every batch alike, a long epoch: 1 and 2 workers cannot reach
    # what 8 measure, a deeper queue has no slow batch to absorb, and no epoch ends within a trial. What is left:
    # the two baselines, 8 and 4 workers, and the check (the old engine ran 11 trials here: bench_dataprobe.py).
    # `pin_memory=True` as the tutorials write it (pytorch/examples' imagenet/main.py): on this machine the sweep's
    # settings are unpinned, and the unpinned main process cannot reach 8 workers either (the old engine measured it).
    loader = loader_for_ratio(5.0, step_seconds=STEP_SECONDS, pin_memory=True)
    result = probe(loader, sleepy_step(STEP_SECONDS), workers=(0, 1, 2, 4, 8), seconds=20.0)
    assert result.recommended_settings == LoaderSettings(8, 2, persistent_workers=True), result.recommended_settings
    assert result.predicted >= 0.9 * result.best and result.speedup > 3.0
    counts = [trial.settings.num_workers for trial in result.trials]
    assert 1 not in counts and 2 not in counts and counts.count(0) == 2, counts  # 0: the two baselines only
    assert len(result.trials) <= 5, [trial.settings.label() for trial in result.trials]
    assert any(skip.startswith("0, 1, 2 workers: each worker loads at most what one process loads alone")
               for skip in result.skipped), result.skipped
    assert any(skip.startswith("deeper prefetch: in one process every batch loaded in about the same time")
               for skip in result.skipped), result.skipped
    assert any(skip.startswith("non-persistent workers: no epoch ended within a trial")
               for skip in result.skipped), result.skipped


class SlowerWhenStartedAgain(SleepyDataset):
    """Sleepy items; with four workers, from their second start on, workers 2 and 3 load ten times slower (another
    job took their cores between the sweep and the check). Each worker counts its own starts in `starts`."""

    def __init__(self, length: int, item_seconds: float, starts: Path) -> None:
        super().__init__(length, item_seconds)
        self.starts = starts
        self.slow = 1.0

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.item_seconds * self.slow)
        return torch.zeros(self.shape), index % 10


def _two_of_four_slow_down_when_started_again(worker_id: int) -> None:
    info = torch.utils.data.get_worker_info()
    if info.num_workers != 4:
        return
    with open(info.dataset.starts, "a") as file:
        file.write(f"{worker_id}\n")
    starts = info.dataset.starts.read_text().split().count(str(worker_id))
    if starts >= 2 and worker_id >= 2:
        info.dataset.slow = 10.0


@pytest.mark.timing
def test_a_recommendation_that_falls_behind_when_checked_gives_way_to_the_runner_up_measured_again(tmp_path):
    # Three steps to load a batch: 4 workers keep up in the sweep, 2 reach two thirds of that. When the check starts
    # 4 workers again, two of them crawl: 4 falls under 90% of what 2 showed, so 2 is measured again and wins.
    dataset = SlowerWhenStartedAgain(4096, 3 * STEP_SECONDS / 8, tmp_path / "starts")
    loader = DataLoader(dataset, batch_size=8, worker_init_fn=_two_of_four_slow_down_when_started_again)
    result = probe(loader, sleepy_step(STEP_SECONDS), workers=(0, 2, 4), seconds=20.0)
    stages = [(trial.stage, trial.settings.num_workers) for trial in result.trials]
    assert (VERIFY, 4) in stages and (RECHECK, 2) in stages, stages
    assert result.recommended_settings.num_workers == 2, stages
    recheck = next(trial for trial in result.trials if trial.stage == RECHECK)
    assert result.verified == recheck.samples_per_second
    assert any("it is recommended instead" in note and "4 workers" in note for note in result.notes), result.notes
    report = str(result)
    assert "recommended  2 workers" in report
    assert "which measured" in report and "the setting measured better when checked was chosen" in report


@pytest.mark.timing
def test_no_setting_is_swept_twice_when_a_variant_of_the_users_is_one_the_sweep_measured():
    # The user's 2 non-persistent workers cannot keep up; the sweep measures 2 persistent ones. Whichever is best, its
    # variants include the other: measured again, it was a second row with the same label and other numbers.
    loader = loader_for_ratio(3.0, step_seconds=STEP_SECONDS, num_workers=2, persistent_workers=False)
    result = probe(loader, sleepy_step(STEP_SECONDS), workers=(2,), seconds=6.0)
    measured = [trial.settings for trial in result.trials if trial.stage in (CURRENT, SWEEP) and trial.mode == LOOP]
    assert len(measured) == len(set(measured)) >= 2, [settings.label() for settings in measured]


@pytest.mark.timing  # a verdict from measured times: another test's load can tip it
def test_a_compute_bound_step_is_named_and_the_loader_is_not_tuned():
    loader = loader_for_ratio(0.2, step_seconds=VERDICT_STEP_SECONDS, num_workers=1, persistent_workers=True)
    result = run_dataprobe(loader, sleepy_step(VERDICT_STEP_SECONDS), DataProbeRequest((0, 1, 2), 4.0),
                           loader_name="train_loader", step_name="train_on")
    assert result.verdict == "compute-bound", result.wait_fraction
    assert [trial.stage for trial in result.trials] == [CURRENT, CURRENT]
    # The step for %speedprobe is written from the user's names (it said `train_step`, a name the notebook had for
    # its %batchprobe step).
    assert any("%%gputime" in note and "batch = next(iter(train_loader)); def whole_step(): return train_on(batch); "
               "then %speedprobe whole_step." in note for note in result.notes), result.notes
    assert result.recommended == result.current.kwargs() and result.code() is None  # keep what you have
    assert "keep your setting" in str(result)


@pytest.mark.timing
def test_without_a_step_the_loader_alone_is_swept():
    loader = sleepy_loader(item_seconds=0.002)
    result = probe(loader, workers=(0, 2), seconds=4.0)
    assert result.verdict is None and result.step_alone is None and result.together is None
    assert result.recommended_settings.num_workers == 2  # sleeps overlap: two workers load twice as fast
    assert result.loader_alone.first_batch_seconds is not None
    # Two workers load at most twice as fast; on two busy cores the hand-over took it to 1.45x once and 1.14x in a
    # clean-clone run: the check is that the recommendation was verified faster, not by how much.
    assert result.speedup > 1.1


@pytest.mark.timing
def test_the_time_budget_is_kept():
    import time

    loader = loader_for_ratio(2.0, step_seconds=STEP_SECONDS)
    started = time.perf_counter()
    result = probe(loader, sleepy_step(STEP_SECONDS), workers=(0, 1, 2, 3, 4), seconds=3.0)
    elapsed = time.perf_counter() - started
    assert elapsed < 3.0 * 1.6, elapsed
    assert result.seconds <= elapsed


# -- nothing lost ------------------------------------------------------------------------------------------------


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 10))

    def forward(self, x):
        return self.net(x)


def test_model_optimizer_rngs_sampler_and_loader_come_back_exactly_and_no_worker_is_left():
    torch.manual_seed(0)
    model = Mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(7)
    dataset = TensorDataset(torch.randn(512, 8), torch.randint(0, 10, (512,)))
    loader = DataLoader(dataset, batch_size=16, shuffle=True, generator=generator, num_workers=1,
                        persistent_workers=True)

    def step(batch):
        x, y = batch
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    step(next(iter(DataLoader(dataset, batch_size=16))))  # Adam has state to put back
    before_params = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    before_grads = {name: param.grad.clone() for name, param in model.named_parameters()}
    before_opt = {key: value.clone() for key, value in opt.state[next(model.parameters())].items()}
    random.seed(3)
    np.random.seed(4)
    states = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy(), generator.get_state())
    children = child_pids()
    gc.collect()
    tensors_before = live_tensors()

    result = probe(loader, step, workers=(0, 1), seconds=4.0, namespace={"model": model, "opt": opt})

    assert result.trials and result.recommended is not None
    assert unchanged(model.state_dict(), before_params)  # a function: no loop variable keeps a tensor alive
    assert unchanged(opt.state[next(model.parameters())], before_opt)
    assert torch.equal(torch.get_rng_state(), states[0])
    assert random.getstate() == states[1]
    assert (np.random.get_state()[1] == states[2]).all()
    assert torch.equal(generator.get_state(), states[3])
    assert loader._iterator is None  # the user's loader was never iterated: its persistent workers never started
    assert child_pids() == children  # every worker the probe started has exited
    gc.collect()
    # Batches, cached copies and snapshots are gone. Gradients the step freed (zero_grad) come back as new
    # objects with the same bytes (batchprobe's restore): nothing else may be new.
    grads = {id(param.grad) for param in model.parameters()}
    new = [tensor for key, tensor in live_tensors().items() if key not in tensors_before and key not in grads]
    assert not new, [tensor.shape for tensor in new]
    assert unchanged({name: param.grad for name, param in model.named_parameters()}, before_grads)
    assert {"model", "opt", "RNG", "sampler"} <= set(result.restored)


@pytest.mark.timing  # a verdict from measured times: another test's load can tip it
def test_probe_loader_for_scripts_names_the_step_and_returns_the_result():
    result = probe_loader(loader_for_ratio(2.0, step_seconds=STEP_SECONDS), sleepy_step(STEP_SECONDS),
                          workers=(0, 2), seconds=3.0)
    assert result.step_name == "step" and result.mode == LOOP  # the step function's own name
    assert result.verdict == "input-bound" and result.recommended["num_workers"] == 2
    assert "step step on cpu" in str(result)


def test_ctrl_c_keeps_what_was_measured_shuts_workers_down_and_puts_the_state_back():
    model = nn.Linear(8, 2)
    weights = model.weight.detach().clone()
    calls = {"n": 0}

    def step(batch):
        calls["n"] += 1
        with torch.no_grad():
            model.weight.add_(1.0)
        if calls["n"] == 200:
            raise KeyboardInterrupt
        import time

        time.sleep(0.005)

    children = child_pids()
    loader = sleepy_loader(item_seconds=0.001, num_workers=1)
    result = probe(loader, step, workers=(0, 1, 2), seconds=30.0, namespace={"model": model})
    assert result.interrupted
    assert result.trials  # what was measured before Ctrl-C
    assert torch.equal(model.weight, weights)
    assert child_pids() == children
    with pytest.raises(KeyboardInterrupt):
        calls["n"] = 0
        probe_loader(loader, step, workers=(0, 1), seconds=30.0, namespace={"model": model})
    assert child_pids() == children


# -- bad input ---------------------------------------------------------------------------------------------------


def test_not_a_dataloader_is_one_sentence():
    expected = "`loader` cannot be probed: it is a list, not a torch.utils.data.DataLoader"
    with pytest.raises(DataProbeError, match=re.escape(expected)):
        probe([1, 2, 3])


def test_an_empty_dataset_is_one_sentence():
    with pytest.raises(DataProbeError, match="dataset is empty"):
        probe(DataLoader(TensorDataset(torch.zeros(0, 3)), batch_size=4))


def test_drop_last_with_fewer_samples_than_a_batch_is_one_sentence():
    with pytest.raises(DataProbeError, match="fails to load a batch"):
        probe(DataLoader(TensorDataset(torch.zeros(3, 3)), batch_size=4, drop_last=True))


def test_a_step_that_raises_is_one_sentence_and_loses_nothing():
    model = nn.Linear(8, 2)
    weights = model.weight.detach().clone()

    def step(batch):
        with torch.no_grad():
            model.weight.mul_(2)
        raise ValueError("shapes do not match")

    children = child_pids()
    with pytest.raises(DataProbeError, match=r"the step raised ValueError: shapes do not match \(at "
                                             r"test_dataprobe_runner\.py, line \d+, in step: `raise ValueError"):
        probe(sleepy_loader(), step, namespace={"model": model})
    assert torch.equal(model.weight, weights)
    assert child_pids() == children


def test_a_step_of_another_signature_is_refused_before_the_loader_starts():
    children = child_pids()

    def sized_step(batch_size):  # %batchprobe's kind of step
        return torch.randn(batch_size, 8)

    with pytest.raises(DataProbeError, match=r"^`step` takes batch_size, a batch size \(the step %batchprobe "
                                             r"takes\), and %dataprobe calls it with one batch from the loader"):
        probe(sleepy_loader(), sized_step)

    def whole_step():
        return None

    with pytest.raises(DataProbeError, match=r"^`step` takes no arguments, and %dataprobe calls it with one "
                                             r"batch from the loader, step\(batch\); write def step\(batch\)"):
        probe(sleepy_loader(), whole_step)
    assert child_pids() == children


def test_a_setting_whose_workers_fail_is_reported_and_the_others_still_measured():
    class FailsInWorkers(SleepyDataset):
        def __getitem__(self, index):
            if torch.utils.data.get_worker_info() is not None:
                raise OSError("the data share is not mounted in workers")
            return super().__getitem__(index)

    loader = DataLoader(FailsInWorkers(512, 0.0005), batch_size=8)
    result = probe(loader, workers=(0, 1), seconds=3.0)
    failed = [trial for trial in result.trials if trial.error]
    assert failed and all(trial.settings.num_workers == 1 for trial in failed)
    assert "the data share is not mounted in workers" in failed[0].error
    assert result.recommended_settings.num_workers == 0


def test_worker_memory_is_measured_for_worker_settings():
    result = probe(sleepy_loader(item_seconds=0.0005), workers=(0, 1), seconds=3.0)
    with_workers = [trial for trial in result.trials if trial.settings.num_workers and not trial.error]
    assert with_workers and all(trial.worker_memory is not None for trial in with_workers)
    assert all(trial.worker_memory.rss_bytes > 10 * 2**20 for trial in with_workers)  # a Python with torch
    assert all(trial.worker_memory is None for trial in result.trials if trial.settings.num_workers == 0)


def test_an_iterable_dataset_is_probed_and_its_per_worker_copies_are_named():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            for index in range(2048):
                yield torch.zeros(8), index % 10

    result = probe(DataLoader(Stream(), batch_size=16), workers=(0, 1), seconds=2.0)
    assert result.dataset_len is None and result.recommended is not None
    assert any("get_worker_info" in note for note in result.notes)


@pytest.fixture
def small_shm_context(tmp_path: Path):
    """A machine root whose /dev/shm is a real 64 MiB tmpfs, Docker's default (skips where mount is refused)."""
    import subprocess

    from jupyter_gpu.facts.context import ProbeContext

    target = tmp_path / "root" / "dev" / "shm"
    target.mkdir(parents=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(target)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    yield ProbeContext(root=tmp_path / "root", env={})
    subprocess.run(["umount", str(target)], check=True)


def test_settings_whose_batches_do_not_fit_dev_shm_are_named_and_never_started(small_shm_context):
    # A batch is 16 MiB: one worker with 2 batches in flight fits 64 MiB with headroom, two workers do not.
    loader = DataLoader(TensorDataset(torch.zeros(64, 256, 1024)), batch_size=16)
    children = child_pids()
    result = probe(loader, workers=(0, 1, 2), seconds=3.0, context=small_shm_context)
    assert "SHM_TOO_SMALL" in [finding.code for finding in result.pitfalls]
    assert {trial.settings.num_workers for trial in result.trials} <= {0, 1}
    assert any(text.startswith("2 workers") and "/dev/shm" in text for text in result.skipped)
    assert child_pids() == children


def test_a_dataset_of_large_python_lists_shows_copy_on_read_and_worker_memory():
    class Captions(torch.utils.data.Dataset):
        def __init__(self) -> None:
            self.captions = [f"caption number {index}" for index in range(200_000)]

        def __len__(self) -> int:
            return len(self.captions)

        def __getitem__(self, index):
            return torch.tensor([len(self.captions[index])])

    result = probe(DataLoader(Captions(), batch_size=64), workers=(0, 1), seconds=3.0)
    (finding,) = [finding for finding in result.pitfalls if finding.code == "DATASET_COPY_ON_READ"]
    assert "captions" in str(finding.evidence)
    with_workers = [trial for trial in result.trials if trial.settings.num_workers]
    assert with_workers and all(trial.worker_memory.private_bytes is not None for trial in with_workers)
    assert "private" in str(result)  # the table shows each worker's own memory, where copy-on-read grows


def test_a_warning_each_loader_it_builds_repeats_is_one_note_not_a_stream_above_the_report(recwarn):
    # On a machine without an accelerator torch warns at every iterator of a loader with pin_memory=True: the
    # probe builds several, and the report came under four copies of the same warning.
    loader = DataLoader(SleepyDataset(512, item_seconds=0.0), batch_size=16, num_workers=1, pin_memory=True)
    result = probe(loader, workers=(1, 2), seconds=3.0)
    assert not [w for w in recwarn.list if "pin_memory" in str(w.message)]
    [note] = [note for note in result.notes if "pin_memory" in note]
    assert note.startswith("warned while the probe ran (") and "UserWarning: 'pin_memory' argument" in note
