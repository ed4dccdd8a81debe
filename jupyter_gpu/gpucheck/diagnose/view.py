"""Derived, typed answers over a raw facts snapshot, so the rules read like the catalogue."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from jupyter_gpu.gpucheck.diagnose import nvml_classes
from jupyter_gpu.gpucheck.diagnose.cuda_driver import DriverApiAnswer, driver_api_answer
from jupyter_gpu.gpucheck.diagnose.visibility import Visibility, canonical_uuid, parse_visible_devices, short_uuid
from jupyter_gpu.snapshot import schedulers as access
from jupyter_gpu.snapshot.paths import PathFlavour, flavour_of_snapshot
from jupyter_gpu.snapshot.schedulers import Scheduler, current_job

ERROR_NUMBER = re.compile(r"Error (\d+)")
FOUND_VERSION = re.compile(r"too old \(found version (\d+)\)")


@dataclass(frozen=True)
class NvmlDevice:
    index: int
    name: str | None
    uuid: str | None
    capability: tuple[int, int] | None
    memory_total: int | None
    memory_used: int | None
    memory_free: int | None
    compute_mode: int | None
    mig_enabled: bool | None
    mig_instances: list[dict[str, Any]] | None
    processes: list[dict[str, Any]] | None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NvmlDevice:
        cc = data.get("compute_capability")
        return cls(
            index=int(data.get("index", 0)), name=data.get("name"), uuid=data.get("uuid"),
            capability=(int(cc[0]), int(cc[1])) if cc else None,
            memory_total=data.get("memory_total"), memory_used=data.get("memory_used"),
            memory_free=data.get("memory_free"),
            compute_mode=data.get("compute_mode"), mig_enabled=data.get("mig_enabled"),
            mig_instances=data.get("mig_instances"), processes=data.get("processes"),
        )


@dataclass(frozen=True)
class CudaDeviceSlot:
    """One CUDA device the variable selects now: the UUIDs CUDA may report for it, and how to name it."""

    uuids: frozenset[str]  # canonical: a GPU's own, or those of its MIG instances
    label: str
    mig: bool


class FactsView:
    def __init__(self, snapshot: dict[str, Any]) -> None:
        self.raw = snapshot
        self.system: dict[str, Any] = snapshot.get("system") or {}
        self.env: dict[str, str] = snapshot.get("env") or {}
        self.install: dict[str, Any] = snapshot.get("install") or {}
        self.python: dict[str, Any] = snapshot.get("python") or {}
        self.nvml: dict[str, Any] = snapshot.get("nvml") or {}
        self.torch: dict[str, Any] | None = snapshot.get("torch")
        self.kernel: dict[str, Any] = snapshot.get("kernel") or {}
        self.in_kernel: dict[str, Any] = snapshot.get("in_kernel") or {}
        self.notebook: dict[str, Any] | None = snapshot.get("notebook")
        self.hosting: dict[str, Any] = self.system.get("hosting") or {}
        self.platform: dict[str, Any] = self.system.get("platform") or {}
        # The checked machine's path rules (a Windows snapshot splits PYTHONPATH on ';').
        self.paths: PathFlavour = flavour_of_snapshot(snapshot)

    # -- the kernel's Python and torch install -------------------------------------------------------
    @property
    def base_probe_ok(self) -> bool:
        run = (self.raw.get("probe") or {}).get("base") or {}
        return bool(run.get("ok"))

    @property
    def kernel_python(self) -> str:
        return self.python.get("executable") or (self.raw.get("context") or {}).get("python") or "python"

    @property
    def torch_installed(self) -> bool:
        return bool(self.install.get("spec_origin"))

    @property
    def torch_version(self) -> str | None:
        if self.torch and self.torch.get("version"):
            return self.torch["version"]
        build = self.install.get("build") or {}
        if build.get("version"):
            return build["version"]
        dists = self.install.get("distributions") or []
        return dists[0]["version"] if dists else None

    @property
    def torch_cuda(self) -> str | None:
        """The CUDA version torch was built with ("13.0"), None for CPU/ROCm builds."""
        if self.torch and "import_error" not in self.torch:
            return self.torch.get("cuda")
        return (self.install.get("build") or {}).get("cuda")

    @property
    def torch_hip(self) -> str | None:
        if self.torch and "import_error" not in self.torch:
            return self.torch.get("hip")
        return (self.install.get("build") or {}).get("hip")

    @property
    def build_known(self) -> bool:
        return bool(self.install.get("build")) or bool(self.torch and "import_error" not in self.torch)

    @property
    def cpu_only_build(self) -> bool:
        if not self.torch_installed or not self.build_known:
            return False
        if self.torch_cuda or self.torch_hip:
            return False
        if self.torch and "import_error" not in self.torch and self.torch.get("compiled_with_cuda"):
            return False
        conda = " ".join(b or "" for b in self.install.get("conda_builds") or [])
        return "cuda" not in conda

    @property
    def torch_import_error(self) -> str | None:
        return (self.torch or {}).get("import_error")

    @property
    def torch_probe_record(self) -> dict[str, Any]:
        return (self.raw.get("probe") or {}).get("torch") or {}

    # -- the host --------------------------------------------------------------------------------------
    @property
    def nvidia_pci(self) -> list[dict[str, Any]]:
        return [g for g in self.system.get("pci_gpus") or [] if g.get("vendor") == "nvidia"]

    @property
    def amd_pci(self) -> list[dict[str, Any]]:
        return [g for g in self.system.get("pci_gpus") or [] if g.get("vendor") == "amd"]

    @property
    def device_nodes(self) -> dict[str, bool]:
        return {n["path"]: bool(n.get("read_write")) for n in self.system.get("device_nodes") or []}

    @property
    def nvidia_gpu_nodes(self) -> list[str]:
        return [p for p in self.device_nodes if re.fullmatch(r"/dev/nvidia\d+", p)]

    @property
    def driver(self) -> dict[str, Any]:
        return self.system.get("driver") or {}

    @property
    def nvml_ok(self) -> bool:
        return self.nvml.get("status") == "ok"

    @property
    def nvml_error_code(self) -> int | None:
        code = self.nvml.get("error_code")
        return int(code) if code is not None else None

    @cached_property
    def nvml_devices(self) -> list[NvmlDevice]:
        return [NvmlDevice.from_dict(d) for d in self.nvml.get("devices") or []]

    @property
    def driver_version(self) -> str | None:
        return self.nvml.get("driver_version") or self.driver.get("kernel_module_version")

    @property
    def cuda_driver_version(self) -> int | None:
        """The driver's CUDA version as an int (12080 = 12.8): NVML, else torch's "found version" text."""
        if self.nvml.get("cuda_driver_version"):
            return int(self.nvml["cuda_driver_version"])
        for text in self.cuda_messages:
            match = FOUND_VERSION.search(text)
            if match:
                return int(match.group(1))
        return None

    @property
    def nvidia_present(self) -> bool:
        return bool(self.nvidia_pci or self.nvidia_gpu_nodes or self.driver.get("proc_version_text")
                    or (self.nvml_ok and self.nvml_devices) or self.windows_driver_installed
                    or self.wsl_windows_cuda)

    @property
    def wsl_windows_cuda(self) -> bool:
        """WSL 2's bridge to the Windows GPU driver (/dev/dxg) with that driver's libcuda in /usr/lib/wsl/lib: an
        NVIDIA GPU on the Windows side, whatever NVML says from in here."""
        libs = (self.driver.get("libraries") or {}).get("libcuda.so.1") or []
        return bool(self.hosting.get("wsl")) and "/dev/dxg" in self.device_nodes and any(
            str(lib.get("path") or "").startswith("/usr/lib/wsl/") for lib in libs)

    @property
    def windows_driver_installed(self) -> bool:
        """Windows has no /proc or /dev: the NVIDIA driver shows itself by nvcuda.dll in System32."""
        return self.paths.windows and bool((self.driver.get("libraries") or {}).get("nvcuda.dll"))

    @property
    def driver_loaded_on_host(self) -> bool:
        """The kernel module is loaded, as the host's own files say (/proc/driver/nvidia, /sys/module/nvidia),
        whatever this process may or may not open."""
        return bool(self.driver.get("proc_version_text")) and (
            bool(self.driver.get("sys_module_nvidia")) or any(g.get("bound_driver") == "nvidia"
                                                               for g in self.nvidia_pci))

    @cached_property
    def batch_job(self) -> tuple[Scheduler, str] | None:
        """The job scheduler this process runs under and its job's id (snapshot/schedulers.py); None outside a job."""
        return current_job(self.env)

    @property
    def job_gpu_allocation(self) -> dict[str, str]:
        """The variables by which the scheduler gave this job GPUs (empty: it asked for none, or no job)."""
        job = self.batch_job
        return job[0].allocation(self.env) if job is not None else {}

    @property
    def hub_server(self) -> bool:
        """A single-user server a JupyterHub spawned: its spawner, not the user, decides what it was given."""
        return access.in_hub_server(self.env)

    @property
    def pod_gpu_allocation(self) -> str | None:
        """In a Kubernetes pod: the GPUs NVIDIA's device plugin allocated to this container (snapshot/schedulers.py)."""
        return access.plugin_allocation(self.env) if self.hosting.get("kubernetes") else None

    @property
    def gpu_node_withheld(self) -> bool:
        """A container on a machine with NVIDIA GPUs that reached it none: the node's GPU shows through what no
        runtime hides (its PCI device in /sys, the module in /proc and /sys), yet no /dev/nvidiaN is here and NVML
        counts no GPU. Not WSL, whose GPU comes through /dev/dxg."""
        node_gpu = bool(self.nvidia_pci or self.driver.get("proc_version_text"))
        return (self.in_container and node_gpu and not self.nvidia_gpu_nodes and not self.hosting.get("wsl")
                and not (self.nvml_ok and self.nvml_devices))

    @property
    def wsl_generation(self) -> int | None:
        """1 or 2 by WSL's kernel release (4.4.0-19041-Microsoft is WSL 1); None outside WSL or unknown."""
        return access.wsl_generation(self.hosting.get("kernel_release")) if self.hosting.get("wsl") else None

    @property
    def kernel_version(self) -> tuple[int, ...] | None:
        return access.kernel_version(self.hosting.get("kernel_release"))

    @property
    def jetson(self) -> dict[str, Any] | None:
        """A Jetson (L4T's /etc/nv_tegra_release): its integrated GPU has no PCI device and, before JetPack 6, no
        NVML, so none of the discrete-GPU rules applies to it."""
        return self.system.get("jetson")

    @property
    def docker_desktop_vm(self) -> bool:
        """Docker Desktop's Linux VM (macOS, or Windows without the WSL 2 engine): its kernel is a linuxkit one."""
        return "linuxkit" in (self.hosting.get("kernel_release") or "").lower()

    @cached_property
    def gpu_faults(self) -> dict[int, tuple[str, str]]:
        """Each GPU whose NVML queries answered a fault (nvml_classes.FAULTS: lost, reset needed, unknown): its
        class and NVML's own words, the worst of its answers."""
        faults = {}
        for device in self.nvml.get("devices") or []:
            answers: dict[str | None, str] = {}  # each class's first answer
            for message in (device.get("errors") or {}).values():
                answers.setdefault(nvml_classes.class_of_message(message), str(message))
            fault = nvml_classes.worst(list(answers))
            if fault is not None:
                faults[int(device["index"])] = (fault, answers[fault])
        return faults

    @property
    def lost_gpus(self) -> list[int]:
        """GPUs whose NVML handle answers as a GPU off the bus does ("GPU is lost", "Timeout", ...: Xid 79)."""
        return [index for index, (fault, _) in self.gpu_faults.items() if fault == nvml_classes.LOST]

    @property
    def nvml_init_class(self) -> str | None:
        """The class of NVML's init error (nvml_classes), None where it started."""
        return nvml_classes.class_of_code(self.nvml_error_code) if self.nvml.get("status") != "ok" else None

    @property
    def in_container(self) -> bool:
        h = self.hosting
        return bool(h.get("docker") or h.get("podman") or h.get("cgroup_container") or h.get("kubernetes"))

    # -- torch's own CUDA probe ------------------------------------------------------------------------
    @property
    def probe_ran(self) -> bool:
        return self.torch is not None and "import_error" not in self.torch

    @property
    def cuda_messages(self) -> list[str]:
        """Warnings and errors torch printed while initialising CUDA, verbatim."""
        torch = self.torch or {}
        messages = list(torch.get("warnings") or [])
        for key in ("init_error", "cuda_error"):
            if torch.get(key):
                messages.append(torch[key])
        return messages

    @cached_property
    def driver_api(self) -> DriverApiAnswer | None:
        """The probe child's own cuInit: its code, the libcuda the loader gave it and that file's origin."""
        return driver_api_answer((self.torch or {}).get("driver_api"))

    def cuda_error_number(self) -> int | None:
        for text in self.cuda_messages:
            if "cudaGetDeviceCount" in text or "CUDA" in text:
                match = ERROR_NUMBER.search(text)
                if match:
                    return int(match.group(1))
        return None

    def message_containing(self, *needles: str) -> str | None:
        for text in self.cuda_messages:
            if any(n.lower() in text.lower() for n in needles):
                return text
        return None

    @property
    def torch_devices(self) -> list[dict[str, Any]]:
        return list((self.torch or {}).get("devices") or [])

    @property
    def arch_flags(self) -> list[str]:
        return list((self.torch or {}).get("arch_flags") or [])

    # -- visibility ---------------------------------------------------------------------------------------
    @property
    def visibility(self) -> Visibility:
        count = len(self.nvml_devices) if self.nvml_ok else None
        return parse_visible_devices(self.env.get("CUDA_VISIBLE_DEVICES"), count)

    def visible_nvml_devices(self) -> list[NvmlDevice]:
        devices = self.nvml_devices
        vis = self.visibility
        if vis.mode == "all":
            return devices
        if vis.mode == "uuids":
            # A GPU is selected by its UUID or a unique prefix of it, or through one of its MIG instances.
            def selected(d: NvmlDevice) -> bool:
                migs = {m.get("uuid") for m in d.mig_instances or []}
                return any(u in migs or bool(d.uuid and d.uuid.startswith(u)) for u in vis.uuids)

            return [d for d in devices if selected(d)]
        by_index = {d.index: d for d in devices}
        return [by_index[i] for i in vis.indices if i in by_index]

    def cuda_selection_now(self) -> list[CudaDeviceSlot]:
        """The CUDA devices CUDA_VISIBLE_DEVICES selects now, in CUDA's order when `cuda_order_known`."""
        vis = self.visibility
        if vis.mode == "uuids":
            return self._slots_for_uuids(vis.uuids)
        return [self._gpu_slot(d) for d in self.visible_nvml_devices()]

    @property
    def cuda_order_known(self) -> bool:
        """Whether CUDA's device N is NVML's GPU N. By index, CUDA counts GPUs fastest first unless
        CUDA_DEVICE_ORDER=PCI_BUS_ID, while NVML counts them by PCI bus: they agree only then, or when every
        GPU is the same model. A list of UUIDs names the GPUs themselves."""
        if self.visibility.mode == "uuids" or self.env.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID":
            return True
        return len({d.name for d in self.nvml_devices}) <= 1

    def _gpu_slot(self, device: NvmlDevice) -> CudaDeviceSlot:
        # A MIG-enabled GPU shows up in CUDA as one of its instances, so any of their UUIDs stands for it.
        uuids = {canonical_uuid(device.uuid), *(canonical_uuid(m.get("uuid")) for m in device.mig_instances or [])}
        return CudaDeviceSlot(frozenset(u for u in uuids if u), self.describe_gpu(device), bool(device.mig_enabled))

    def _slots_for_uuids(self, tokens: tuple[str, ...]) -> list[CudaDeviceSlot]:
        slots: list[CudaDeviceSlot] = []
        for token in tokens:
            wanted = canonical_uuid(token, partial=True) or ""
            slot = next((s for d in self.nvml_devices for s in self._token_slot(d, wanted)), None)
            if slot is None:
                break  # CUDA stops at the first entry it cannot match
            slots.append(slot)
        if any(s.mig for s in slots):
            # One process gets one MIG instance: the first one listed.
            slots = [next(s for s in slots if s.mig)]
        return slots

    def _token_slot(self, device: NvmlDevice, wanted: str) -> list[CudaDeviceSlot]:
        for instance in device.mig_instances or []:
            if wanted and canonical_uuid(instance.get("uuid")) == wanted:
                label = f"MIG instance {short_uuid(instance.get('uuid'))} of GPU {device.index} ({device.name})"
                return [CudaDeviceSlot(frozenset({wanted}), label, mig=True)]
        own = canonical_uuid(device.uuid)
        if wanted and own and own.startswith(wanted):
            return [self._gpu_slot(device)]
        return []

    def describe_gpu(self, device: NvmlDevice) -> str:
        return f"GPU {device.index} ({device.name}, {short_uuid(device.uuid)})"

    def describe_cuda_device(self, uuid: str | None, name: str | None) -> str:
        """Name a device the kernel's CUDA reports as nvidia-smi would (its NVML index), when NVML knows it."""
        wanted = canonical_uuid(uuid)
        for device in self.nvml_devices:
            if wanted and canonical_uuid(device.uuid) == wanted:
                return self.describe_gpu(device)
            slot = self._token_slot(device, wanted or "")
            if slot and slot[0].mig:
                return slot[0].label
        return f"{name or 'a GPU'} ({short_uuid(uuid)})"

    @property
    def pid(self) -> int | None:
        return (self.raw.get("context") or {}).get("pid")
