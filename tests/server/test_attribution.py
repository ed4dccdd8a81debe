"""Which notebook holds the GPU: attribution of NVML processes to kernels, notebooks and other users."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_gpu.metrics.sample import DeviceSample, GpuProcess, Sample
from jupyter_gpu.server.attribution import OTHER_PROCESS, attribute
from jupyter_gpu.server.kernels import BusyTracker, KernelInfo
from jupyter_gpu.server.processes import ProcessInfo, cached_lookup, read_process

NOW = 1_800_000_000.0
GB = 10**9
ME = 1000


def kernel(pid: int, state: str = "idle", paths: tuple[str, ...] = ("Untitled3.ipynb",), *,
           last_activity: float = NOW - 3 * 3600, busy_since: float | None = None) -> KernelInfo:
    return KernelInfo(f"kid-{pid}-0000", "python3", pid, state, last_activity, busy_since, paths)


def sample(*devices: tuple[GpuProcess, ...] | None) -> Sample:
    return Sample(NOW, "simulated:test", True, devices=tuple(
        DeviceSample(i, "NVIDIA H200", f"GPU-{i}", memory_used=100 * GB, memory_total=141 * GB, processes=procs)
        for i, procs in enumerate(devices)))


def table(**entries: tuple[int, int, str]):
    infos = {int(pid[1:]): ProcessInfo(int(pid[1:]), *value) for pid, value in entries.items()}
    return infos.get


def test_a_kernels_process_is_named_by_its_notebook_with_memory_and_idle_time() -> None:
    holders = attribute(sample((GpuProcess(500, 22 * GB),)), [kernel(500)], table(p500=(1, ME, "python")), ME)
    assert len(holders) == 1
    row = holders[0].to_dict(NOW)
    assert row["kind"] == "kernel"
    assert row["summary"] == "Untitled3.ipynb holds 20.5 GiB on GPU 0, idle for 3 h"
    assert row["paths"] == ["Untitled3.ipynb"] and row["kernel_id"] == "kid-500-0000"
    assert row["idle_seconds"] == pytest.approx(3 * 3600)


def test_dataloader_workers_count_for_the_notebook_that_started_them_across_gpus() -> None:
    procs = table(p500=(1, ME, "python"), p501=(500, ME, "python"), p502=(501, ME, "python"))
    holders = attribute(sample((GpuProcess(500, 2 * GB),), (GpuProcess(502, 3 * GB),)),
                        [kernel(500, "busy", busy_since=NOW - 60)], procs, ME)
    assert len(holders) == 1
    row = holders[0].to_dict(NOW)
    assert row["devices"] == [{"index": 0, "memory": 2 * GB}, {"index": 1, "memory": 3 * GB}]
    assert row["memory"] == 5 * GB
    assert row["summary"] == ("Untitled3.ipynb holds 1.9 GiB on GPU 0 and 2.8 GiB on GPU 1, busy for 60 s")
    assert holders[0].pids == {500, 502}


def test_other_users_processes_show_only_their_memory() -> None:
    holders = attribute(sample((GpuProcess(900, 40 * GB),)), [kernel(500)],
                        table(p900=(1, 0, "train.py --secret-token=abc")), ME)
    row = holders[0].to_dict(NOW)
    assert row["kind"] == "other" and row["label"] == OTHER_PROCESS
    assert row["pid"] is None and row["kernel_id"] is None
    assert "train" not in str(row) and "900" not in str(row) and "secret" not in str(row)


def test_an_invisible_pid_is_another_process_and_the_users_own_process_is_named() -> None:
    procs = table(p700=(1, ME, "<img src=x onerror=alert(1)>"))
    holders = attribute(sample((GpuProcess(700, 1 * GB), GpuProcess(123456, 2 * GB))), [], procs, ME)
    kinds = {h.kind: h.to_dict(NOW) for h in holders}
    assert kinds["process"]["label"] == "<img src=x onerror=alert(1)>" and kinds["process"]["pid"] == 700
    assert kinds["other"]["label"] == OTHER_PROCESS
    assert [h.kind for h in holders] == ["process", "other"]  # the user's own before everyone else's


def test_other_processes_are_one_row_per_gpu_and_notebooks_come_first() -> None:
    others = (GpuProcess(901, 40 * GB), GpuProcess(902, 30 * GB))
    holders = attribute(sample((*others, GpuProcess(500, 1 * GB)), (GpuProcess(903, 5 * GB),)),
                        [kernel(500)], table(p500=(1, ME, "python")), ME)
    rows = [h.to_dict(NOW) for h in holders]
    assert [(r["kind"], r["label"], r["memory"]) for r in rows] == [
        ("kernel", "Untitled3.ipynb", 1 * GB), ("other", "2 other processes", 70 * GB),
        ("other", "other process", 5 * GB)]
    assert rows[1]["summary"] == "2 other processes hold 65.2 GiB on GPU 0"


def test_unknown_memory_is_said_not_counted_as_zero() -> None:
    holders = attribute(sample((GpuProcess(500, None),)), [kernel(500)], table(p500=(1, ME, "python")), ME)
    assert holders[0].memory is None
    assert holders[0].summary(NOW) == "Untitled3.ipynb holds memory on GPU 0, idle for 3 h"


def test_a_kernel_without_a_notebook_and_a_dead_kernel_are_labelled() -> None:
    info = KernelInfo("abcdef0123", "python3", 500, "dead", None, None, ())
    holders = attribute(sample((GpuProcess(500, GB),)), [info], table(p500=(1, ME, "python")), ME)
    assert holders[0].summary(NOW) == "kernel abcdef01 (python3) holds 953.7 MiB on GPU 0, kernel dead"


def test_no_holders_without_a_reading_or_a_process_list() -> None:
    assert attribute(None, [], table(), ME) == []
    assert attribute(Sample(NOW, "nvml", False, status="no_driver", message="x"), [], table(), ME) == []
    assert attribute(sample(None), [kernel(500)], table(), ME) == []


def test_a_parent_loop_in_proc_ends_the_walk() -> None:
    procs = table(p600=(601, ME, "a"), p601=(600, ME, "b"))
    holders = attribute(sample((GpuProcess(600, GB),)), [kernel(500)], procs, ME)
    assert holders[0].kind == "process"


def write_proc(root: Path, pid: int, status: str, cmdline: bytes) -> None:
    folder = root / str(pid)
    folder.mkdir(parents=True)
    (folder / "status").write_text(status)
    (folder / "cmdline").write_bytes(cmdline)


def test_read_process_parses_status_and_keeps_only_the_program_name(tmp_path: Path) -> None:
    write_proc(tmp_path, 42, "Name:\tpython3\nPPid:\t7\nUid:\t1000\t1000\t1000\t1000\n",
               b"/opt/conda/bin/python\0-m\0ipykernel_launcher\0-f\0/secret/kernel.json\0")
    assert read_process(42, tmp_path) == ProcessInfo(42, 7, 1000, "python")
    assert read_process(43, tmp_path) is None


def test_read_process_caps_a_crafted_name_and_falls_back_to_comm(tmp_path: Path) -> None:
    write_proc(tmp_path, 1, "Name:\tkworker\nPPid:\t0\nUid:\t0\t0\t0\t0\n", b"")
    write_proc(tmp_path, 2, "Name:\tx\nPPid:\t1\nUid:\tbad\n", b"A" * 500 + b"\0")
    assert read_process(1, tmp_path) == ProcessInfo(1, 0, 0, "kworker")
    info = read_process(2, tmp_path)
    assert info is not None and info.uid is None and len(info.name or "") == 64


def test_read_process_on_the_real_proc_sees_a_child_and_its_parent() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        info = read_process(child.pid)
        assert info is not None
        assert info.ppid == os.getpid() and info.uid == os.getuid()
        assert info.name is not None and info.name.startswith("python")
    finally:
        child.kill()
        child.wait()


def test_cached_lookup_reads_each_pid_once(tmp_path: Path) -> None:
    write_proc(tmp_path, 5, "PPid:\t1\nUid:\t0\n", b"x\0")
    lookup = cached_lookup(tmp_path)
    first = lookup(5)
    (tmp_path / "5" / "status").write_text("PPid:\t9\nUid:\t0\n")
    assert lookup(5) is first


def test_busy_tracker_keeps_the_first_time_a_kernel_was_seen_busy() -> None:
    tracker = BusyTracker()
    assert tracker.update("k", "busy", 10.0) == 10.0
    assert tracker.update("k", "busy", 15.0) == 10.0
    assert tracker.update("k", "idle", 16.0) is None
    assert tracker.update("k", "busy", 20.0) == 20.0
    tracker.forget_except(set())
    assert tracker.update("k", "busy", 30.0) == 30.0
