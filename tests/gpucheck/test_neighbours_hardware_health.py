"""Neighbours of the lost-GPU case from every source the hardware's health shows in (issue 49): NVRM Xid lines in the
kernel log (dmesg, or the journal where dmesg is denied) and each GPU's PCIe link in sysfs. Each situation comes
from a public report, cited beside it; the log lines are the reports' own (journal lines in journalctl's
short-monotonic form, which the gathering asks for).

The rules these check are about the family: every Xid is read by NVIDIA's catalogue (the application's, the memory's,
the hardware's, with the catalogue's action), per GPU; a link down or trained narrower is named; hardware outranks
software, so a failing health finding is the headline; a GPU that NVML already reads as lost or faulted keeps that
finding, with its Xid lines and link in the evidence; a log that cannot be read is said in evidence, never a failure.
Written before the rules changed: the issue's note says how many failed first.
"""

from __future__ import annotations

from fake_machine import H100, Machine

# torch's own warning when cudaGetDeviceCount answers 999 (c10/cuda/CUDAFunctions.cpp).
CUDA_UNKNOWN_ERROR = ("CUDA initialization: CUDA unknown error - this may be due to an incorrectly set up environment, "
                      "e.g. changing env variable CUDA_VISIBLE_DEVICES after program start. Setting the available "
                      "devices to be zero. (Triggered internally at /pytorch/c10/cuda/CUDAFunctions.cpp:109.)")
NVML_GPU_IS_LOST, NVML_UNKNOWN = 15, 999
HEALTH_CODES = {"GPU_XID", "PCIE_LINK_DOWN", "PCIE_LINK_DEGRADED"}


def host(addresses: list[str], uuids: list[str] | None = None, **device: object) -> Machine:
    """NVIDIA GPUs at these PCI addresses (NVML numbers them in this order); `device` overrides every GPU's NVML."""
    uuids = uuids or [f"GPU-00000000-0000-0000-0000-00000000000{i}" for i in range(len(addresses))]
    machine = Machine().nvidia_host(devices=[dict(H100, uuid=u, **device) for u in uuids])
    for entry, address in zip(machine.pci, addresses, strict=True):
        entry["address"] = address
    return machine


def unusable(machine: Machine) -> Machine:
    """torch's CUDA initialisation fails as it does on a GPU in trouble: "unknown error", no device."""
    return machine.cuda_torch(devices=[], device_count=0, warnings=[CUDA_UNKNOWN_ERROR])


def codes(report) -> list[str]:
    return [f.code for f in report.findings]


def fixes(finding) -> str:
    return "\n".join(finding.fix)


# -- the Xid in dmesg ----------------------------------------------------------------------------------------------
POP_OS_3363 = (  # pop-os/pop#3363: the slot's link went down, then the GPU fell off the bus
    "[   34.193735] pcieport 0000:00:01.1: pciehp: Slot(0): Link Down\n"
    "[   34.193743] pcieport 0000:00:01.1: pciehp: Slot(0): Card not present\n"
    "[   34.193750] NVRM: GPU at PCI:0000:01:00: GPU-f8600eb8-f1df-acfb-fad9-d24be732714f\n"
    "[   34.193759] NVRM: Xid (PCI:0000:01:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
    "[   34.193770] NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.")


def test_xid_79_in_dmesg_names_the_fall_off_the_bus_where_nvml_says_only_unknown_error(check_machine):
    # pop-os/pop#3363: Xid 79 in the kernel log; nvidia-smi then answers "Unable to determine the device handle for
    # GPU 0000:01:00.0: Unknown Error" (rwth-i6/returnn#1486 quotes the same answer), NVML's 999, not 15.
    machine = host(["0000:01:00.0"], ["GPU-f8600eb8-f1df-acfb-fad9-d24be732714f"], handle_error=NVML_UNKNOWN)
    machine.dmesg = POP_OS_3363
    report = check_machine(unusable(machine))
    primary = report.primary
    assert "Xid 79" in primary.headline and "fallen off the bus" in primary.headline, primary.headline
    assert primary.fix[0].startswith("Reboot") or "Reboot" in fixes(primary), primary.fix
    assert "seating" in fixes(primary) and "modprobe" not in fixes(primary)


def test_xid_119_gsp_timeout_in_dmesg_is_the_headline_over_cudas_unknown_error(check_machine):
    # leptonai/gpud#500: "NVRM: Xid (PCI:0000:9b:00): 119, pid=4071838, name=python, Timeout after 45s of waiting
    # for RPC response from GPU4 GSP! Expected function 76 (GSP_RM_CONTROL)": the GPU's firmware stopped answering.
    machine = host(["0000:9b:00.0"])
    machine.dmesg = ("[ 9921.100113] NVRM: Xid (PCI:0000:9b:00): 119, pid=4071838, name=python, Timeout after 45s of "
                     "waiting for RPC response from GPU4 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20801702 0x4).")
    report = check_machine(unusable(machine))
    primary = report.primary
    assert primary.code == "GPU_XID" and primary.severity == "fail", (primary.code, primary.headline)
    assert "Xid 119" in primary.headline and "GSP" in primary.headline
    assert primary.fix[0].startswith("sudo nvidia-smi -r -i 0")


def test_xids_on_a_working_machine_are_read_by_kind_not_all_as_failures(check_machine):
    # akash-network/support#244 (dmesg -T on a node of three GPUs): Xid 43 from pt_main_thread on one, Xid 31 (an MMU
    # fault of python3.10) on another, Xid 94 (contained ECC error) on the third; PyTorch still runs on all three.
    uuids = ["GPU-efbdfde9-5798-a6e7-4c46-12518fa15375", "GPU-3b6ec030-5adc-1847-e155-79f635584b4e",
             "GPU-c24840ec-8de1-83d5-b126-08000173ae32"]
    machine = host(["0000:00:05.0", "0000:00:07.0", "0000:00:08.0"], uuids)
    machine.dmesg = (
        "[Wed Jul 31 23:14:18 2024] NVRM: GPU at PCI:0000:00:05: GPU-efbdfde9-5798-a6e7-4c46-12518fa15375\n"
        "[Wed Jul 31 23:14:18 2024] NVRM: Xid (PCI:0000:00:05): 43, pid=1045242, name=pt_main_thread, Ch 00000008\n"
        "[Mon Aug  5 03:54:13 2024] NVRM: GPU at PCI:0000:00:07: GPU-3b6ec030-5adc-1847-e155-79f635584b4e\n"
        "[Mon Aug  5 03:54:13 2024] NVRM: Xid (PCI:0000:00:07): 31, pid=2512125, name=python3.10, Ch 00000008, intr "
        "00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_8 faulted @ 0x73ac_1c000000. Fault is of type FAULT_PDE "
        "ACCESS_TYPE_VIRT_WRITE\n"
        "[Fri Aug  9 13:32:56 2024] NVRM: GPU at PCI:0000:00:08: GPU-c24840ec-8de1-83d5-b126-08000173ae32\n"
        "[Fri Aug  9 13:32:56 2024] NVRM: Xid (PCI:0000:00:08): 94, pid='<unknown>', name=<unknown>, Contained: SM "
        "(0x1). RST: No, D-RST: No")
    report = check_machine(machine.cuda_torch())
    assert report.gpu_usable and report.status == "warn", (report.status, codes(report))
    xids = {f.evidence["address"]: f for f in report.findings if f.code == "GPU_XID"}
    assert xids["0000:00:08"].severity == "warn" and "Xid 94" in xids["0000:00:08"].headline
    assert "sudo nvidia-smi -r -i 2" in fixes(xids["0000:00:08"])
    assert xids["0000:00:05"].severity == "info" and "pt_main_thread" in xids["0000:00:05"].headline
    assert xids["0000:00:07"].severity == "info" and "RESTART_APP" in fixes(xids["0000:00:07"])


def test_guard_application_xids_leave_a_working_gpu_ok(check_machine):
    # leptonai/gpud#46: Xid 13 (Graphics SM Warp Exception) and 109 (CTX SWITCH TIMEOUT) from pt_main_thread: the
    # program's fault, the GPU stays usable. The verdict stays "PyTorch can use" with no warning or failure.
    machine = host(["0000:cb:00.0"])
    machine.dmesg = (
        "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM "
        "Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter\n"
        "[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, "
        "errorString CTX SWITCH TIMEOUT, Info 0x58005")
    report = check_machine(machine.cuda_torch())
    assert report.gpu_usable and report.status == "ok", (report.status, codes(report))


# -- the Xid only in the journal, dmesg denied -----------------------------------------------------------------------
# virt-s1/rhel-edge#5955: with kernel.dmesg_restrict = 1 (Fedora's default since 2023, Ubuntu's since 20.10) a user
# reads "dmesg: read kernel buffer failed: Operation not permitted"; systemd/systemd#12112: journalctl -k still
# shows the same kernel lines to a user in the journal's groups.
def test_xid_48_and_64_only_in_the_journal_are_found_and_named(check_machine):
    # NVIDIA/gpu-operator#1146: the node's syslog holds Xid 48 (DBE) and Xid 64 (page retirement failed) for
    # PCI:0000:07:00 while the validator pods crashed.
    machine = host(["0000:07:00.0"])
    machine.dmesg_denied = True
    machine.journal = (
        "[  219.470994] worker4 kernel: NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An "
        "uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fffa8860 "
        "partition 7, subpartition 1.\n"
        "[  219.471050] worker4 kernel: NVRM: Xid (PCI:0000:07:00): 64, pid='<unknown>', name=<unknown>, Dynamic Page "
        "Retirement: Blacklisting failed.  Page should have been blacklisted on boot(0x00000000007fffa8).")
    report = check_machine(unusable(machine))
    primary = report.primary
    assert primary.code == "GPU_XID" and primary.severity == "fail", (primary.code, primary.headline)
    assert "GPU 0 (0000:07:00)" in primary.headline and ("Xid 64" in primary.headline or "Xid 48" in primary.headline)
    assert primary.evidence["Xids"] == {48: 1, 64: 1} and "journalctl" in primary.evidence["kernel log"]
    assert "ROW_REMAPPER" in fixes(primary)


def test_xid_79_only_in_the_journal_joins_the_lost_gpus_evidence(check_machine):
    # NVIDIA/open-gpu-kernel-modules#1151: journalctl's "NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus."
    # on an RTX 5080; NVML then reads the GPU as lost. One finding, the lost GPU, with the Xid line as its evidence.
    machine = host(["0000:2b:00.0"], ["GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae"], lost=True)
    machine.dmesg_denied = True
    machine.journal = (
        "[32459.118522] host kernel: NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae\n"
        "[32459.118530] host kernel: NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.\n"
        "[32459.118541] host kernel: NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus.")
    report = check_machine(unusable(machine))
    primary = report.primary
    assert primary.code == "GPU_LOST_OR_XID", (primary.code, primary.headline)
    assert any("79, GPU has fallen off the bus" in line for line in primary.evidence["Xid lines"])
    assert "journalctl" in primary.evidence["kernel log"] and "GPU_XID" not in codes(report)


def test_guard_an_unreadable_kernel_log_is_said_in_evidence_never_a_failure(check_machine):
    # leahneukirchen/xtools#148 (a user's dmesg denied) and NVIDIA/NemoClaw#3700 (a report that printed the raw
    # denial without context): neither dmesg nor, outside the journal's groups, journalctl shows the kernel's lines.
    # A lost GPU stays the one failure; the evidence says the log could not be read and why.
    machine = host(["0000:01:00.0"], lost=True)
    machine.dmesg_denied = machine.journal_denied = True
    report = check_machine(unusable(machine))
    assert report.primary.code == "GPU_LOST_OR_XID"
    said = report.primary.evidence["kernel log"]
    assert "unreadable" in said and "Operation not permitted" in said, said
    assert not HEALTH_CODES & set(codes(report))


def test_guard_a_healthy_machine_gets_no_health_finding(check_machine):
    # The healthy case: a readable log without Xids, a full-width link idling at a low speed.
    machine = host(["0000:01:00.0"]).pcie_link(0, "16", speed="2.5 GT/s PCIe")
    machine.dmesg = "[    4.120000] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  570.124.06"
    report = check_machine(machine.cuda_torch())
    assert report.gpu_usable and report.status == "ok" and not HEALTH_CODES & set(codes(report)), codes(report)


# -- the PCIe link ---------------------------------------------------------------------------------------------------
def test_a_gpu_trained_at_x1_of_x16_is_named(check_machine):
    # geerlingguy/raspberry-pi-pcie-devices#480: a Quadro RTX 8000 (x16) behind an x1 link: "LnkSta: Speed 5GT/s
    # (downgraded), Width x1 (downgraded)". It works, slowly: a warning, not a failure.
    machine = host(["0000:01:00.0"], name="Quadro RTX 8000").pcie_link(0, "1", speed="5.0 GT/s PCIe",
                                                                      max_speed="8.0 GT/s PCIe")
    report = check_machine(machine.cuda_torch())
    found = [f for f in report.findings if f.code == "PCIE_LINK_DEGRADED"]
    assert report.gpu_usable and found and found[0].severity == "warn", codes(report)
    assert "x1 of x16" in found[0].headline and "GPU 0" in found[0].headline


def test_a_link_down_beside_a_lost_gpu_is_the_lost_findings_evidence(check_machine):
    # pop-os/pop#3363: "pciehp: Slot(0): Link Down", then Xid 79. NVML reads the GPU as lost; sysfs reads its link
    # as a link that is down (width 0, speed Unknown). One finding, the lost GPU, carrying both.
    machine = host(["0000:01:00.0"], ["GPU-f8600eb8-f1df-acfb-fad9-d24be732714f"], lost=True)
    machine.pcie_link(0, "0", speed="Unknown")
    machine.dmesg = POP_OS_3363
    report = check_machine(unusable(machine))
    primary = report.primary
    assert primary.code == "GPU_LOST_OR_XID", (primary.code, primary.headline)
    assert primary.evidence["PCIe link"]["0000:01:00.0"].startswith("down")
    assert not {"PCIE_LINK_DOWN", "GPU_XID"} & set(codes(report))


def test_a_link_down_explains_nvmls_unknown_error(check_machine):
    # rwth-i6/returnn#1486: "Unable to determine the device handle for GPU0000:03:00.0: Unknown Error", and dmesg
    # full of "PCIe Bus Error: severity=Corrected, type=Data Link Layer" from the GPU's root port: the link failing.
    machine = host(["0000:03:00.0"], handle_error=NVML_UNKNOWN).pcie_link(0, "0", speed="Unknown")
    machine.dmesg = ("[  +0.000005] pcieport 0000:00:03.0: PCIe Bus Error: severity=Corrected, type=Data Link Layer, "
                     "(Transmitter ID)\n"
                     "[  +0.000004] pcieport 0000:00:03.0:    [12] Timeout")
    report = check_machine(unusable(machine))
    primary = report.primary
    assert primary.code == "GPU_FAULT" and "PCIe link is down" in primary.headline, primary.headline
    assert primary.evidence["PCIe link"]["0000:03:00.0"].startswith("down")


def test_a_link_down_without_nvml_is_the_headline(check_machine):
    # pop-os/pop#3363 again ("Link Down", "Card not present"), in a kernel whose environment has no nvidia-ml-py:
    # only sysfs says what happened, and the log is denied. The link is the headline, not CUDA's unknown error.
    machine = host(["0000:01:00.0"]).pcie_link(0, "0", speed="Unknown")
    machine.nvml = None
    machine.dmesg_denied = True
    report = check_machine(unusable(machine))
    primary = report.primary
    assert primary.code == "PCIE_LINK_DOWN" and primary.severity == "fail", (primary.code, primary.headline)
    assert "0000:01:00" in primary.headline and "seating" in fixes(primary)


def test_guard_an_idle_gpus_lower_link_speed_is_not_a_fault(check_machine):
    # janhq/jan#183 ("LnkSta: Speed 2.5GT/s (downgraded), Width x16 (ok)": power saving) and Syllo/nvtop#6 ("If the
    # GPU is idle it may use a lower link generation"): full width at a low speed is an idle GPU, not a finding.
    machine = host(["0000:01:00.0"], name="NVIDIA GeForce RTX 4090").pcie_link(0, "16", speed="2.5 GT/s PCIe")
    report = check_machine(machine.cuda_torch())
    assert report.gpu_usable and report.status == "ok", codes(report)

