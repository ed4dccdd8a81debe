"""Containers: a container without the GPU, and /dev/shm sized from the notebook's real DataLoaders.

The container markers and the environment come from a fake machine read by the real gathering code (there is
no container engine here); the DataLoaders are real torch objects gathered by the real notebook audit.
"""

from __future__ import annotations

import json

import pytest
import torch
from fake_machine import Machine
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

from jupyter_gpu.facts.notebook import gather_notebook_facts
from jupyter_gpu.gpucheck.diagnose.usage import usage_findings

DOCKER = {"/.dockerenv": ""}
PODMAN = {"/run/.containerenv": ""}
KUBERNETES_ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}
MIB, GIB = 2**20, 2**30
# torch warns when a loader has more workers than this machine's CPUs; these loaders are never iterated.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


def container_finding(check_machine, machine: Machine):
    report = check_machine(machine.cpu_torch())
    assert report.primary.code == "CONTAINER_NO_GPU" and report.primary.severity == "fail"
    assert report.primary.headline.startswith("This container was started without access to a GPU")
    return report.primary


def first(fix: list[str], *needles: str) -> int:
    """Index of the first fix line holding any of the needles."""
    return next(i for i, line in enumerate(fix) if any(n in line for n in needles))


def test_docker_gets_the_toolkit_from_its_repository_then_configures_restarts_and_runs(check_machine):
    fix = container_finding(check_machine, Machine(files=DOCKER)).fix
    text = "\n".join(fix)
    for step in ("libnvidia-container", "apt-get install -y nvidia-container-toolkit",
                 "sudo nvidia-ctk runtime configure --runtime=docker", "sudo systemctl restart docker",
                 "docker run --rm --gpus all ubuntu nvidia-smi", "docker run --gpus all ..."):
        assert step in text, step
    # The host set-up comes in the order it has to be done, before the run line it enables.
    order = [first(fix, "libnvidia-container"), first(fix, "apt-get install"), first(fix, "runtime configure"),
             first(fix, "systemctl restart docker"), first(fix, "docker run --rm --gpus all"),
             first(fix, "docker run --gpus all ...")]
    assert order == sorted(order)
    # Docker first here; Podman's CDI and Kubernetes are there too, after it.
    assert first(fix, "docker run --gpus") < first(fix, "nvidia-ctk cdi generate") < first(fix, "nvidia.com/gpu: 1")
    assert "podman run --device nvidia.com/gpu=all" in text and "sudo nvidia-ctk cdi generate" in text


def test_podman_gets_cdi_first(check_machine):
    fix = container_finding(check_machine, Machine(files=PODMAN)).fix
    assert first(fix, "sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml") < first(fix, "--runtime=docker")
    assert first(fix, "podman run --device nvidia.com/gpu=all") < first(fix, "docker run --gpus all")
    assert first(fix, "apt-get install -y nvidia-container-toolkit") < first(fix, "cdi generate")


def test_kubernetes_gets_the_device_plugin_and_the_resource_limit_first(check_machine):
    finding = container_finding(check_machine, Machine(files=DOCKER, env=KUBERNETES_ENV))
    fix = finding.fix
    assert "kubernetes" in finding.evidence["container"]
    assert first(fix, "GPU Operator") == 0 and "device plugin" in fix[0]
    assert first(fix, "resources.limits: {nvidia.com/gpu: 1}") == 1
    assert first(fix, "nvidia.com/gpu") < first(fix, "docker run --gpus all") < first(fix, "podman run")


@pytest.mark.parametrize(("files", "env", "engine_hint"), [
    (DOCKER, {"NVIDIA_VISIBLE_DEVICES": "void"}, "where the container is started"),
    (PODMAN, {"NVIDIA_VISIBLE_DEVICES": "none"}, "where the container is started"),
    (DOCKER, {**KUBERNETES_ENV, "NVIDIA_VISIBLE_DEVICES": "void"}, "requests no GPU"),
])
def test_nvidia_visible_devices_asking_for_no_gpu_is_named_first(check_machine, files, env, engine_hint):
    finding = container_finding(check_machine, Machine(files=files, env=env))
    value = env["NVIDIA_VISIBLE_DEVICES"]
    assert finding.evidence["NVIDIA_VISIBLE_DEVICES"] == value
    assert finding.fix[0].startswith(f"NVIDIA_VISIBLE_DEVICES={value} ") and engine_hint in finding.fix[0]


def test_nvidia_visible_devices_all_is_no_explanation(check_machine):
    # Images based on nvidia/cuda set it to all even without --gpus: it proves nothing, so it is not blamed.
    finding = container_finding(check_machine, Machine(files=DOCKER, env={"NVIDIA_VISIBLE_DEVICES": "all"}))
    assert not any(line.startswith("NVIDIA_VISIBLE_DEVICES") for line in finding.fix)


def test_every_fix_line_is_one_short_line(check_machine):
    finding = container_finding(check_machine, Machine(files=DOCKER, env={"NVIDIA_VISIBLE_DEVICES": "void"}))
    assert all("\n" not in line and len(line) <= 130 for line in finding.fix), finding.fix


# --- /dev/shm sized from the DataLoaders ------------------------------------------------------------------


def gathered(**namespace):
    facts = gather_notebook_facts(namespace)
    return json.loads(json.dumps(facts))  # exactly what a saved snapshot replays


def shm_findings(notebook: dict, shm_bytes: int, hosting: dict | None = None):
    found = usage_findings(notebook, gpu_usable=True, gpu_kind="cuda", cuda_launch_blocking=False,
                           shm_bytes=shm_bytes, cpu_count=8, hosting=hosting)
    return [f for f in found if f.code == "SHM_TOO_SMALL"]


def one_mib_samples(count: int = 16) -> TensorDataset:
    return TensorDataset(torch.zeros(count, 256, 1024))  # one float32 sample: 256 x 1024 x 4 B = 1 MiB


def test_a_tensor_dataset_loader_reports_its_sample_size_and_prefetch():
    entry = gathered(loader=DataLoader(Subset(one_mib_samples(), [0, 1]), batch_size=64, num_workers=4,
                                       prefetch_factor=4))["objects"][0]
    assert (entry["sample_bytes"], entry["prefetch_factor"], entry["num_workers"]) == (MIB, 4, 4)


def test_shm_size_comes_from_batches_in_flight():
    loader = DataLoader(one_mib_samples(), batch_size=64, num_workers=4, prefetch_factor=4)
    (f,) = shm_findings(gathered(loader=loader), shm_bytes=64 * MIB, hosting={"docker": True})
    # 4 workers x 4 batches x 64 samples x 1 MiB = 1 GiB in flight, x2 headroom = 2 GiB.
    assert f.fix[0].startswith("docker run --shm-size=2g ")
    assert f.fix[1].startswith("docker run --ipc=host ")
    assert f.evidence["batches_in_flight"] == [
        "`loader`: 4 workers x prefetch_factor 4 x batch_size 64 x 1.0 MiB per sample = 1.0 GiB"
    ]
    assert f.evidence["shm_needed"].startswith("2 GiB")
    assert "64 MiB" in f.headline and "1.0 GiB" in f.headline


def test_small_batches_still_get_at_least_one_gib():
    loader = DataLoader(TensorDataset(torch.zeros(100, 3)), batch_size=8, num_workers=2)
    (f,) = shm_findings(gathered(loader=loader), shm_bytes=64 * MIB)
    assert f.fix[0].startswith("docker run --shm-size=1g ")


def test_batches_that_do_not_fit_are_flagged_even_above_the_512_mib_floor():
    loader = DataLoader(one_mib_samples(), batch_size=64, num_workers=4, prefetch_factor=4)  # 1 GiB in flight
    assert shm_findings(gathered(loader=loader), shm_bytes=768 * MIB)
    assert not shm_findings(gathered(loader=loader), shm_bytes=4 * GIB)


class CountingDataset(Dataset):
    """A dataset whose samples only its own __getitem__ knows: the audit must never call it."""

    def __init__(self) -> None:
        self.loaded = 0

    def __len__(self) -> int:
        return 1000

    def __getitem__(self, index: int) -> torch.Tensor:
        self.loaded += 1
        return torch.zeros(3, 224, 224)


def test_an_unknown_sample_size_uses_the_per_worker_allowance_without_loading_a_sample():
    dataset = CountingDataset()
    facts = gathered(loader=DataLoader(dataset, batch_size=32, num_workers=3))
    assert facts["objects"][0]["sample_bytes"] is None and dataset.loaded == 0
    (f,) = shm_findings(facts, shm_bytes=64 * MIB)
    # 3 workers x 512 MiB allowed each = 1.5 GiB, x2 headroom = 3 GiB.
    assert f.fix[0].startswith("docker run --shm-size=3g ")
    assert "allowed per worker (one sample's size is unknown)" in f.evidence["batches_in_flight"][0]


def test_several_loaders_add_up():
    facts = gathered(train=DataLoader(one_mib_samples(), batch_size=64, num_workers=4, prefetch_factor=4),
                     val=DataLoader(CountingDataset(), batch_size=32, num_workers=2))
    (f,) = shm_findings(facts, shm_bytes=64 * MIB)
    # 1 GiB known + 2 x 512 MiB allowed = 2 GiB, x2 = 4 GiB.
    assert f.fix[0].startswith("docker run --shm-size=4g ") and f.evidence["dataloaders"] == ["train", "val"]


@pytest.mark.parametrize(("hosting", "expected"), [
    ({"podman": True}, "podman run --shm-size=2g ..."),
    ({"kubernetes": True, "cgroup_container": True}, "emptyDir: {medium: Memory, sizeLimit: 2Gi}"),
    ({}, "sudo mount -o remount,size=2G /dev/shm"),
])
def test_the_shm_fix_speaks_the_engine_the_facts_show(hosting, expected):
    loader = DataLoader(one_mib_samples(), batch_size=64, num_workers=4, prefetch_factor=4)
    (f,) = shm_findings(gathered(loader=loader), shm_bytes=64 * MIB, hosting=hosting)
    assert any(expected in line for line in f.fix), f.fix
    if hosting.get("kubernetes"):
        assert any("mountPath: /dev/shm" in line for line in f.fix)
        assert not any("docker run" in line for line in f.fix)


# /proc/self/mountinfo's line for / on this project's own test machine (a Firecracker microVM whose image was made from
# a Docker image, so /.dockerenv is there), and on Docker with its overlay2 and btrfs storage drivers.
VM_ROOT = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard\n"
OVERLAY_ROOT = ("636 535 0:64 / / rw,relatime master:278 - overlay overlay rw,lowerdir=/var/lib/docker/overlay2/l/"
                "Q2:/var/lib/docker/overlay2/l/Z7,upperdir=/var/lib/docker/overlay2/4f/diff\n")
BTRFS_ROOT = "410 380 0:45 /@/var/lib/docker/btrfs/subvolumes/9a1c / rw,relatime - btrfs /dev/sda2 rw,subvol=/@\n"


def test_a_machine_made_from_a_docker_image_is_not_called_a_container(check_machine):
    report = check_machine(Machine(files={**DOCKER, "/proc/self/mountinfo": VM_ROOT}).cpu_torch())
    primary = report.primary
    assert primary.code == "NO_NVIDIA_GPU", primary
    assert primary.headline.startswith("No NVIDIA GPU is visible on this machine")
    assert not any("docker" in line or "container" in line for line in primary.fix), primary.fix
    assert "a machine made from a Docker image, not a container" in primary.evidence["/.dockerenv"]
    assert "ext4 /dev/vda" in primary.evidence["/.dockerenv"]


@pytest.mark.parametrize("root", [OVERLAY_ROOT, BTRFS_ROOT])
def test_docker_storage_drivers_still_make_a_container(check_machine, root):
    finding = container_finding(check_machine, Machine(files={**DOCKER, "/proc/self/mountinfo": root}))
    assert finding.evidence["container"] == "docker"
