"""One rank of a profiled distributed run: `python -m jupyter_gpu.ddpprofile.rank_main SCRIPT [ARGS...]`.

Started by torchrun (`jupyter-gpu profile -- torchrun ... train.py` puts this module before the script) or by this
package's own launcher (a notebook cell, written to a file). The script runs as `__main__` with its own argv, under
`%%gpuprofile`'s instruments (the same step counting, warm-up and stop after the profiled steps in every rank, since
every rank counts the same optimizer steps) and the communication timer; then the rank measures its clock against
rank 0's over the script's own process group, writes its result as JSON to `$JUPYTER_GPU_DDP_OUT/rank-N.json`, and
leaves the process group. A status file (`status-N.json`), rewritten twice a second, says where the rank is, so the
launcher can name the rank and the collective of a hang.

The script's own objects were made by the script and end with it: nothing needs putting back, unlike a notebook's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import runpy
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

OUT_ENV = "JUPYTER_GPU_DDP_OUT"
STEPS_ENV = "JUPYTER_GPU_DDP_STEPS"
WARMUP_ENV = "JUPYTER_GPU_DDP_WARMUP"
STATUS_SECONDS = 0.5


def rank_of_env() -> int:
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m jupyter_gpu.ddpprofile.rank_main [--module] SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    out = Path(os.environ.get(OUT_ENV) or ".")
    rank = rank_of_env()
    steps = int(os.environ.get(STEPS_ENV, "20"))
    warmup = int(os.environ.get(WARMUP_ENV, "5"))
    import torch

    from jupyter_gpu.ddpprofile.apply_fixes import fixes_from_env, install_fixes
    from jupyter_gpu.ddpprofile.comm_timing import CommTimer
    from jupyter_gpu.gpuprofile.runner import profile_training

    timer = CommTimer(torch)
    status = _StatusWriter(out / f"status-{rank}.json", rank, timer)
    status.start()
    as_module = argv[0] == "--module"
    if as_module:
        argv = argv[1:]
    script, args = argv[0], argv[1:]
    sys.argv = [script, *args]
    if not as_module:
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    record: dict[str, Any] = {"rank": rank, "pid": os.getpid(), "world_size": int(os.environ.get("WORLD_SIZE", "1")),
                              "local_rank": int(os.environ.get("LOCAL_RANK", "0")), "host": _host()}
    code = 0
    fixes = fixes_from_env()
    undo_fixes = install_fixes(torch, fixes)  # before the timer: its wrappers see the fixed objects
    record["applied"] = fixes
    timer.install()
    try:
        def run_script() -> Any:
            if as_module:
                return runpy.run_module(script, run_name="__main__", alter_sys=True)
            return runpy.run_path(script, run_name="__main__")

        result = profile_training(run_script, steps=steps, warmup=warmup, namespace={})
        record["profile"] = result.to_dict()  # ProfileResult's own JSON form: what the report's JSON holds too
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        record["error"] = f"SystemExit: {exit_.code}" if code else None
    except BaseException as exc:  # the script's error: written for the launcher, then the rank fails
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc(limit=-8)
        code = 1
    finally:
        timer.uninstall()
        for undo in undo_fixes:
            undo()
    record["comm"] = _comm_record(timer)
    if _group_up(torch):
        record["backend"] = str(torch.distributed.get_backend())
    record["clocks"] = _clocks(torch) if code == 0 else None
    status.stop()
    _write(out / f"rank-{rank}.json", record)
    if code == 0:
        _gather(torch, record, out)
    _leave(torch)
    return code


def _comm_record(timer: Any) -> dict[str, Any]:
    records = timer.records
    def spans(found: list[Any]) -> list[dict[str, Any]]:
        return [{"step": b.step, "index": b.index, "bytes": b.nbytes, "ready": b.ready, "done": b.done,
                 "kind": b.kind} for b in found]

    return {"buckets": spans(records.buckets), "gathers": spans(records.gathers),
            "backwards": [{"step": b.step, "start": b.start, "end": b.end} for b in records.backwards],
            "step_ends": records.step_ends, "settings": records.settings, "parameters": records.parameters,
            "ddp_logging": records.logging, "input_hashes": records.input_hashes,
            "loaders": records.loaders, "batch_norms": records.batch_norms,
            "sync_batch_norms": records.sync_batch_norms,
            # perf_counter and the wall clock read together: the launcher puts every rank's stamps on rank 0's clock
            "clock_pair": _clock_pair()}


def _clock_pair() -> dict[str, float]:
    from jupyter_gpu.ddpprofile.clocks import rank_clock_ns

    return {"perf_counter": time.perf_counter(), "wall_ns": rank_clock_ns()}


def _clocks(torch: Any) -> list[dict[str, Any]] | None:
    """This rank's clock against rank 0's, over the script's process group while it is still up."""
    if not _group_up(torch):
        return None
    dist = torch.distributed
    from jupyter_gpu.ddpprofile.clocks import measure_offsets

    try:
        backend = dist.get_backend()
        device = f"cuda:{torch.cuda.current_device()}" if backend == "nccl" else "cpu"
        return [dataclasses.asdict(offset) for offset in measure_offsets(device=device)]
    except Exception as exc:  # said in the report, never the rank's failure
        return [{"error": f"{type(exc).__name__}: {exc}"}]


def _gather(torch: Any, record: dict[str, Any], out: Path) -> None:
    """Every rank's record to rank 0, which writes them all (`all-ranks.json`): ranks on other nodes write their
    files on their own machines, and the report is made where rank 0 runs."""
    if not _group_up(torch):
        return
    dist = torch.distributed
    try:
        gathered: list[Any] = [None] * dist.get_world_size() if dist.get_rank() == 0 else []
        dist.gather_object(json.loads(json.dumps(record, default=str)), gathered if dist.get_rank() == 0 else None,
                           dst=0)
        if dist.get_rank() == 0:
            _write(out / "all-ranks.json", {"records": gathered})
    except Exception as exc:  # the files of this node's ranks still say what they can
        record["gather_error"] = f"{type(exc).__name__}: {exc}"


def _leave(torch: Any) -> None:
    if _group_up(torch):
        with contextlib.suppress(Exception):  # the script may have left it half torn down
            torch.distributed.destroy_process_group()


def _group_up(torch: Any) -> bool:
    """Whether the script's default process group is still up (a script stopped mid-loop leaves it so)."""
    dist = torch.distributed
    return bool(dist.is_available() and dist.is_initialized())


def _host() -> str:
    import socket

    return socket.gethostname()


def _write(path: Path, data: dict[str, Any]) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data, default=str), encoding="utf-8")
    os.replace(temporary, path)


class _StatusWriter:
    """Where the rank is (its step, the collective it is in and since when), rewritten every STATUS_SECONDS."""

    def __init__(self, path: Path, rank: int, timer: Any) -> None:
        self.path, self.rank, self.timer = path, rank, timer
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jupyter-gpu-rank-status", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def _run(self) -> None:
        while True:
            now = self.timer.now
            with contextlib.suppress(OSError):
                _write(self.path, {"rank": self.rank, "pid": os.getpid(), "step": now.step,
                                   "collective": now.collective, "since": now.since, "at": time.time()})
            if self._stop.wait(STATUS_SECONDS):
                return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
