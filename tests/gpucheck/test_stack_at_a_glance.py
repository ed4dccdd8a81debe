"""The stack at a glance: after the verdict, always, the versions and GPUs a bug report needs, in text, HTML, JSON."""

from __future__ import annotations

import json

from fake_machine import H100, Machine, nvml_gpu

from jupyter_gpu.gpucheck.diagnose.stack import cudnn_text

GIB = 1 << 30
A100_MIG = nvml_gpu("NVIDIA A100-SXM4-80GB", "GPU-a100", (8, 0), 80 * GIB, memory_used=20 * GIB, mig_mode=1,
                    mig_devices=[{"uuid": f"MIG-{n}", "memory_total": 40 * GIB, "memory_used": 0} for n in (1, 2)])


def block(report) -> list[str]:
    """The lines between the verdict and the first finding."""
    lines = str(report).splitlines()[1:]
    return lines[: lines.index("")] if "" in lines else lines


def test_a_healthy_gpu_machine_shows_every_version_and_each_gpu(check_machine):
    machine = Machine().nvidia_host(devices=[dict(H100), dict(H100, uuid="GPU-second", memory_used=40 * GIB)])
    machine.cuda_torch().companion("torchvision", "0.24.1+cu128", requires_torch="2.9.1")
    machine.companion("torchaudio", "2.9.1+cu128", requires_torch="2.9.1")
    report = check_machine(machine)
    assert report.status == "ok", str(report)
    rows = block(report)
    assert rows[0].split() == ["torch", "2.9.1+cu128", "·", "CUDA", "12.8", "build", "·", "cuDNN", "9.10.2", "·",
                               "NCCL", "2.27.3"]
    assert rows[1].split() == ["torchvision", "0.24.1+cu128"]
    assert rows[2].split() == ["torchaudio", "2.9.1+cu128"]
    assert rows[3].split()[0] == "Python" and " on Linux " in rows[3]
    assert rows[4].split() == ["driver", "570.124.06", "·", "supports", "CUDA", "12.8"]
    assert rows[5].split() == ["GPU", "0", "NVIDIA", "H100", "80GB", "HBM3", "·", "79.6", "GiB", "(78.7", "GiB",
                               "free)", "·", "compute", "9.0", "·", "MIG", "off"]
    assert "(39.6 GiB free)" in rows[6]  # 79.6 GiB less the 40 GiB in use
    assert len(rows) == 7


def test_the_stack_is_in_the_json_with_raw_numbers(check_machine):
    report = check_machine(Machine().nvidia_host().cuda_torch())
    stack = json.loads(json.dumps(report.to_dict(include_facts=False)))["stack"]
    assert stack["torch"] == "2.9.1+cu128" and stack["build"] == "CUDA 12.8"
    assert stack["cudnn"] == "9.10.2" and stack["nccl"] == "2.27.3"
    assert stack["driver"] == "570.124.06" and stack["driver_cuda"] == "12.8"
    (gpu,) = stack["gpus"]
    assert gpu["memory_total"] == H100["memory_total"]
    assert gpu["memory_free"] == H100["memory_total"] - H100["memory_used"]
    assert gpu["capability"] == "9.0" and gpu["mig_enabled"] is False and gpu["uuid"] == H100["uuid"]


def test_the_html_shows_the_same_rows_escaped(check_machine):
    report = check_machine(Machine().nvidia_host().cuda_torch())
    html = report._repr_html_()
    assert "NCCL 2.27.3" in html and "NVIDIA H100 80GB HBM3 · 79.6 GiB (78.7 GiB free)" in html
    assert html.index("NCCL 2.27.3") < html.index("</table>")


def test_a_mig_gpu_shows_its_instances(check_machine):
    report = check_machine(Machine().nvidia_host(devices=[A100_MIG]).cuda_torch(devices=[]))
    gpu_row = next(line for line in block(report) if line.split()[:2] == ["GPU", "0"])
    assert gpu_row.endswith("compute 8.0 · MIG on, 2 instances")
    assert "(60.0 GiB free)" in gpu_row


def test_a_cpu_machine_still_shows_the_block_and_says_what_is_missing(check_machine):
    report = check_machine(Machine().cpu_torch().companion("torchvision", "0.28.0+cpu", requires_torch="2.13.0"))
    rows = [line.split() for line in block(report)]
    assert rows[0] == ["torch", "2.13.0+cpu", "·", "CPU", "build"]  # no cuDNN or NCCL claimed for a CPU build
    assert rows[1] == ["torchvision", "0.28.0+cpu"]
    assert ["driver", "none", "found"] in rows and ["GPUs", "none", "visible"] in rows


def test_without_torch_the_block_says_so(check_machine):
    rows = [line.split() for line in block(check_machine(Machine().nvidia_host()))]
    assert rows[0] == ["torch", "not", "installed"]
    assert rows[-1][:2] == ["GPU", "0"]  # NVML still lists the GPU


def test_cudnn_versions_read_as_cudnn_writes_them():
    assert cudnn_text(91002) == "9.10.2"
    assert cudnn_text(90100) == "9.1.0"
    assert cudnn_text(8902) == "8.9.2"
    assert cudnn_text(None) is None
