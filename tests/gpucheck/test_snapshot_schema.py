"""Facts snapshots use the live metrics' NVML names (schema 2); a schema-1 file still diagnoses the same."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from jupyter_gpu.facts.gather import SCHEMA_VERSION, load_snapshot
from jupyter_gpu.gpucheck.diagnose.engine import diagnose
from jupyter_gpu.metrics.sample import DeviceSample, GpuProcess, MigInstance

EXAMPLE = Path(__file__).resolve().parents[2] / "example_notebooks" / "snapshots" / "h100-notebook-audit.json"


def as_schema_1(snapshot: dict) -> dict:
    """The same facts as jupyter-gpu 0.1.0 wrote them, before the names were unified."""
    old = copy.deepcopy(snapshot)
    old["schema_version"] = 1
    for device in old["nvml"]["devices"]:
        enabled = device.pop("mig_enabled")
        device["mig_mode"] = None if enabled is None else int(enabled)
        if "mig_instances" in device:
            device["mig_devices"] = device.pop("mig_instances")
        for process in device.get("processes") or []:
            process["used_memory"] = process.pop("memory_used")
    return old


def with_gpu_state(mig: bool, processes: list[dict]) -> dict:
    snapshot = json.loads(EXAMPLE.read_text())
    device = snapshot["nvml"]["devices"][0]
    device["mig_enabled"] = mig
    if mig:
        device["mig_instances"] = []
    device["processes"] = processes
    return snapshot


def test_the_nvml_fields_of_a_snapshot_carry_the_sample_models_names() -> None:
    device = json.loads(EXAMPLE.read_text())["nvml"]["devices"][0]
    sample_names = {f for cls in (DeviceSample, GpuProcess, MigInstance) for f in cls.__dataclass_fields__}
    assert {"mig_enabled", "memory_used", "memory_total"} <= set(device) & sample_names
    assert not {"mig_mode", "mig_devices", "used_memory"} & set(device)


@pytest.mark.parametrize(("mig", "processes", "code"), [
    (False, [{"pid": 4242, "memory_used": 60 * 2**30, "in_this_pid_namespace": True}],
     "GPU_MEMORY_HELD_BY_OTHER_PROCESS"),
    (True, [], "MIG_NO_INSTANCES"),
])
def test_a_schema_1_snapshot_gives_the_same_findings(tmp_path: Path, mig: bool, processes: list, code: str) -> None:
    current = with_gpu_state(mig, processes)
    old_file = tmp_path / "old.json"
    old_file.write_text(json.dumps(as_schema_1(current)))
    new_file = tmp_path / "new.json"
    new_file.write_text(json.dumps(current))
    old, new = diagnose(load_snapshot(str(old_file))), diagnose(load_snapshot(str(new_file)))
    assert code in new.codes
    assert [f.to_dict() for f in old.findings] == [f.to_dict() for f in new.findings]
    assert load_snapshot(str(old_file))["schema_version"] == SCHEMA_VERSION == 2
