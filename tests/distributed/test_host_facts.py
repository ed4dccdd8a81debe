"""The host facts NCCL depends on, read from a fake machine's files and a given environment."""

from __future__ import annotations

from pathlib import Path

from jupyter_gpu.distributed.host_facts import gather_host_facts, resolves, shared_memory_facts, variable_facts
from jupyter_gpu.facts.context import ProbeContext


def lay_out(root: Path, files: dict[str, str], folders: tuple[str, ...] = ()) -> Path:
    for folder in folders:
        (root / folder.lstrip("/")).mkdir(parents=True, exist_ok=True)
    for path, text in files.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return root


DOCKER_MOUNTS = ("overlay / overlay rw,relatime 0 0\n"
                 "shm /dev/shm tmpfs rw,nosuid,nodev,noexec,relatime,size=65536k,inode64 0 0\n")


def test_docker_default_shm_is_read_as_64_mib_from_the_mount_table(tmp_path: Path) -> None:
    root = lay_out(tmp_path, {"/proc/mounts": DOCKER_MOUNTS}, ("/dev/shm",))
    (root / "dev/shm").chmod(0o1777)
    shm = shared_memory_facts(ProbeContext(root=root))
    assert shm["exists"] and shm["writable"]
    assert shm["size_bytes"] == 64 * 1024**2
    assert shm["free_bytes"] <= shm["size_bytes"]
    assert shm["mode"] == "0o1777"


def test_missing_shm(tmp_path: Path) -> None:
    assert shared_memory_facts(ProbeContext(root=tmp_path))["exists"] is False


def test_this_machine_shm_has_a_size() -> None:
    shm = shared_memory_facts(ProbeContext())
    assert shm["exists"] and shm["size_bytes"] and shm["size_bytes"] > 0


def test_infiniband_ports_and_interfaces(tmp_path: Path) -> None:
    port = "/sys/class/infiniband/mlx5_0/ports/1"
    root = lay_out(tmp_path, {f"{port}/state": "4: ACTIVE\n", f"{port}/link_layer": "InfiniBand\n",
                              f"{port}/rate": "200 Gb/sec (4X HDR)\n",
                              "/sys/class/infiniband/mlx5_1/ports/1/state": "1: DOWN\n",
                              "/sys/class/net/eth0/operstate": "up\n", "/sys/class/net/lo/operstate": "unknown\n"})
    facts = gather_host_facts(ProbeContext(root=root, env={}))
    assert facts["infiniband"] == [
        {"name": "mlx5_0", "ports": [{"port": "1", "state": "4: ACTIVE", "link_layer": "InfiniBand",
                                      "rate": "200 Gb/sec (4X HDR)"}]},
        {"name": "mlx5_1", "ports": [{"port": "1", "state": "1: DOWN", "link_layer": None, "rate": None}]}]
    assert facts["interfaces"] == [{"name": "eth0", "state": "up"}, {"name": "lo", "state": "unknown"}]


def test_variables_are_shown_exactly_as_set() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "localhost", "NCCL_P2P_DISABLE": "1",
           "NCCL_SOCKET_IFNAME": "^docker,lo", "NCCL_DEBUG": "WARN", "CUDA_VISIBLE_DEVICES": "0,1", "HOME": "/root"}
    facts = variable_facts(env)
    assert facts["torchrun"] == {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "localhost"}
    assert facts["nccl"] == {"NCCL_DEBUG": "WARN", "NCCL_P2P_DISABLE": "1", "NCCL_SOCKET_IFNAME": "^docker,lo"}
    assert facts["debug"] == {"CUDA_VISIBLE_DEVICES": "0,1"}


def test_master_addr_lookup() -> None:
    assert resolves("localhost") is True
    assert resolves("no-such-host.invalid") in (False, None)  # None: the resolver did not answer within a second
