"""Issue 54, point 3 (the loader probe's cost): the settings the sweep may leave out must never be the ones that
matter. Each shortcut that saves `%dataprobe` a trial has a neighbour here where leaving it out would be wrong,
written the way public reports describe the loader:

1. **Batches that take very different times to load** (a detection set with a few huge images, text batches padded
   to their longest sequence): a deeper prefetch queue is what lets the other workers carry on while one loads a slow
   batch (the reason `prefetch_factor` was added: pytorch/pytorch#40604, PR #41130; PaddlePaddle/Paddle#43081 shows
   the stalls it removed; intelligent-machine-learning/dlrover#662 asks to tune it for the same reason). Here the
   deeper queue must be measured.
2. **A dataset whose epoch is a few batches long** (a 100-structure set in metatensor/metatrain#1271, a small
   fine-tuning set; pytorch/pytorch#15849, open-mmlab/mmhuman3d#233: 7 min -> 35 s an epoch with persistent workers):
   restarting the workers at every epoch's end costs the loop, and the non-persistent variant must be measured (and
   persistent workers recommended).
3. **A loader that burns CPU on a machine with few cores** (image decoding and augmentation in the workers;
   AILab-CVC/YOLO-World#413: 8 workers on 4 cores, embeddings-benchmark/mteb#1331: 104 workers on 23 froze the
   run): workers cannot load faster than the cores allow, so a sweep that starts at the count the loading time calls
   for must still come down to the count the cores can run.

Run before the engine changed (7f8b16d's engine): 1 of 3 failed, the short epoch: once doubling 4 to 8 workers
bought under 5%, that engine left restarted workers out as "only adding their start-up", though here an epoch ended
every six batches and the restarts were what the loop paid. Each test also fails with its own rule switched off
(a deeper queue never tried, restarts never shown, no count below the first measured): checked by hand. Real
DataLoader workers, real processes, sleeps and busy loops with known costs; marker `timing`.
"""

from __future__ import annotations

import time

import pytest
import torch
from sleepy_data import SleepyDataset, UnevenBatches, sleepy_step
from torch.utils.data import DataLoader

from jupyter_gpu.dataprobe.result import DataProbeResult
from jupyter_gpu.dataprobe.runner import DataProbeRequest, run_dataprobe

STEP_SECONDS = 0.02
BATCH = 8

pytestmark = pytest.mark.timing


def probe(loader: DataLoader, workers: tuple[int, ...], seconds: float) -> DataProbeResult:
    return run_dataprobe(loader, sleepy_step(STEP_SECONDS), DataProbeRequest(workers, seconds),
                         loader_name="loader", step_name="step")


def measured(result: DataProbeResult) -> list[str]:
    return [trial.settings.label() for trial in result.trials]


def test_batches_that_load_in_uneven_times_get_a_deeper_prefetch_queue_measured():
    # 6x the step on average, so 4 workers cannot keep up and the sweep goes on past the worker counts.
    loader = DataLoader(UnevenBatches(4096, 6 * STEP_SECONDS / BATCH, batch_size=BATCH), batch_size=BATCH)
    result = probe(loader, (0, 2, 4), seconds=10.0)
    deeper = [trial for trial in result.trials if trial.settings.num_workers and trial.settings.prefetch_factor == 4]
    assert deeper, (measured(result), result.skipped)


def test_a_dataset_of_a_few_batches_an_epoch_gets_workers_restarting_measured_and_persistent_recommended():
    # 6 batches an epoch, each taking 5 steps to load in one process: workers started anew at every epoch's end
    # cost the loop their start-up and the first batch's whole loading time, six batches apart.
    loader = DataLoader(SleepyDataset(6 * BATCH, 5 * STEP_SECONDS / BATCH), batch_size=BATCH)  # a small set
    result = probe(loader, (0, 4, 8), seconds=12.0)
    restarted = [trial for trial in result.trials if trial.settings.num_workers and
                 not trial.settings.persistent_workers]
    assert restarted, (measured(result), result.skipped)
    assert result.recommended_settings is not None and result.recommended_settings.persistent_workers, measured(result)


class BusyItems(SleepyDataset):
    """Items that each burn `item_seconds` of CPU (decoding, augmenting): workers share the machine's cores."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        until = time.thread_time() + self.item_seconds
        while time.thread_time() < until:
            pass
        return torch.zeros(8), index % 10


def test_a_cpu_bound_loader_on_few_cores_is_swept_down_to_the_count_the_cores_run():
    # Loading takes 4 steps' time: 4 workers would keep up if each had a core; this machine has 2.
    loader = DataLoader(BusyItems(4096, 4 * STEP_SECONDS / BATCH), batch_size=BATCH)
    result = probe(loader, (0, 1, 2, 4, 8), seconds=12.0)
    counts = {trial.settings.num_workers for trial in result.trials if trial.error is None}
    assert 2 in counts, (measured(result), result.skipped)
    assert result.recommended_settings is not None and result.recommended_settings.num_workers >= 2, measured(result)
