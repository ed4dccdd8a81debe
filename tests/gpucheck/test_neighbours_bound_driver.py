"""Neighbours of the nouveau case (issue 49): the GPU's PCI function bound to a driver other than nvidia, which the
NVIDIA driver cannot take while it holds it. Each situation comes from public reports, cited beside it.

The rule these check is about the layer, not one driver's name: the PCI device's bound driver answers first; a GPU
bound to vfio-pci, pci-stub or any driver but nvidia and nouveau is reserved for something else (a virtual machine,
usually), and `modprobe nvidia` or DKMS cannot help until it is released. Written before the rules changed: the
note of issue 49 says how many failed first.
"""

from __future__ import annotations

from fake_machine import Machine

NVML_DRIVER_NOT_LOADED = 9


def bound_to(driver: str, *, nvidia_loaded: bool = False) -> Machine:
    """A host whose one GPU is bound to `driver`; the nvidia module loaded or not."""
    machine = Machine().nvidia_host()
    machine.pci[0]["driver"] = driver
    if nvidia_loaded:
        machine.nvml["devices"] = []  # the module is up, but this GPU is not its: "No devices were found"
    else:
        del machine.files["/proc/driver/nvidia/version"], machine.files["/sys/module/nvidia/version"]
        machine.nvml["init_error"] = NVML_DRIVER_NOT_LOADED
    return machine.cuda_torch(devices=[], device_count=0)


def fixes(report) -> str:
    return "\n".join(line for finding in report.findings for line in finding.fix)


def test_a_gpu_reserved_for_vfio_passthrough_is_named_not_modprobed(check_machine):
    # vfio_pci.ids=10de:2504 on the kernel command line binds an RTX 3060 to vfio-pci for a VM
    # (HikariKnight/quickpassthrough#22; NVIDIA/kubevirt-gpu-device-plugin#45: `options vfio-pci ids=10de:21c4`).
    report = check_machine(bound_to("vfio-pci"))
    primary = report.primary
    assert primary.code == "GPU_BOUND_TO_OTHER_DRIVER", (primary.code, primary.headline)
    assert "vfio-pci" in primary.headline and "0000:01:00.0" in primary.headline
    text = fixes(report)
    assert "vfio" in "\n".join(primary.fix) and "modprobe nvidia" not in text and "dkms" not in text


def test_a_gpu_held_by_pci_stub_is_named_not_modprobed(check_machine):
    # `echo 0000:01:00.0 > /sys/bus/pci/drivers/pci-stub/bind` before passing it to a VM
    # (NVIDIA/kubevirt-gpu-device-plugin#27).
    report = check_machine(bound_to("pci-stub"))
    assert report.primary.code == "GPU_BOUND_TO_OTHER_DRIVER" and "pci-stub" in report.primary.headline
    assert "modprobe nvidia" not in fixes(report) and "dkms" not in fixes(report)


def test_a_gpu_bound_to_vfio_beside_a_loaded_nvidia_module_is_named(check_machine):
    # A Proxmox or libvirt host with two GPUs keeps one for itself and one on vfio-pci for a VM: nvidia is loaded,
    # and this GPU is not its (nvidia-smi: "No devices were found"; cloud-hypervisor/cloud-hypervisor#4353).
    report = check_machine(bound_to("vfio-pci", nvidia_loaded=True))
    assert report.primary.code == "GPU_BOUND_TO_OTHER_DRIVER" and "vfio-pci" in report.primary.headline
    assert "modprobe nvidia" not in fixes(report)


def test_nouveau_still_gets_its_blacklist(check_machine):
    # The guard: nouveau is the case the rule was written for; its fix stays.
    report = check_machine(bound_to("nouveau"))
    assert "blacklist nouveau" in fixes(report)
