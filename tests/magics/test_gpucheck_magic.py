"""%gpucheck in a real IPython shell."""

from __future__ import annotations

import json

import pytest
import torch
from fake_machine import Machine, nvml_gpu
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output


def magics_instance(shell: InteractiveShell):
    return shell.magics_manager.registry["GpuCheckMagics"]


def test_load_reload_unload(shell):
    shell.run_line_magic("load_ext", "jupyter_gpu")
    assert "gpucheck" in shell.magics_manager.magics["line"]
    assert {"gputime", "batchprobe"} <= set(shell.magics_manager.magics["cell"])
    assert {"gputime", "batchprobe", "gpupanel"} <= set(shell.magics_manager.magics["line"])
    shell.run_line_magic("reload_ext", "jupyter_gpu")
    assert "gpucheck" in shell.magics_manager.magics["line"]
    shell.run_line_magic("unload_ext", "jupyter_gpu")
    assert not {"gpucheck", "gputime", "batchprobe", "gpupanel"} & set(shell.magics_manager.magics["line"])
    with pytest.raises(UsageError):
        shell.run_line_magic("gpucheck", "")


def test_real_machine_cpu_only_torch(ip):
    with capture_output() as captured:
        report = ip.run_line_magic("gpucheck", "-o")
    assert report.status == "fail" and not report.gpu_usable
    assert report.verdict.startswith("PyTorch is running on the CPU")
    assert "CPU_ONLY_BUILD" in report.codes  # this machine's torch is 2.13.0+cpu
    shown = captured.outputs[0].data  # what a notebook front-end receives
    assert shown["text/plain"].splitlines()[0].endswith(report.verdict)
    assert "PyTorch is running on the CPU" in shown["text/html"]
    assert not torch.cuda.is_initialized()


def test_quiet_prints_nothing_and_returns_with_o(ip):
    with capture_output() as captured:
        result = ip.run_line_magic("gpucheck", "-q")
    assert captured.stdout == "" and not captured.outputs and result is None


def test_json_output_is_the_report(ip):
    with capture_output() as captured:
        ip.run_line_magic("gpucheck", "--json")
    data = json.loads(captured.stdout)
    assert data["status"] == "fail" and data["facts"]["schema"] == "jupyter-gpu/facts"
    assert {f["code"] for f in data["findings"]} >= {"CPU_ONLY_BUILD"}


@pytest.mark.parametrize(("line", "words"), [
    ("--bogus", "Unrecognized arguments: --bogus."),
    ("--timeout -3", "--timeout must be a positive number of seconds."),
    ("--facts a.json --root /", "--facts replays a saved snapshot"),
    ("--facts /nonexistent/facts.json", "--facts /nonexistent/facts.json cannot be read: No such file or directory"),
    ("-q --save /nonexistent/x.json", "--save /nonexistent/x.json cannot be written: No such file or directory"),
    ('--root "unclosed', "No closing quotation"),
])
def test_bad_options_are_one_sentence_usage_errors(ip, line, words):
    with pytest.raises(UsageError, match=r"^%gpucheck: ") as error:
        ip.run_line_magic("gpucheck", line)
    assert words in str(error.value)
    assert "\n" not in str(error.value) and "[Errno" not in str(error.value)


def test_save_then_replay_gives_the_same_diagnosis(ip, tmp_path):
    path = tmp_path / "facts.json"
    first = ip.run_line_magic("gpucheck", f"-q -o --save {path}")
    replay = ip.run_line_magic("gpucheck", f"-q -o --facts {path}")
    assert replay.to_dict(include_facts=False) == first.to_dict(include_facts=False)


@pytest.mark.timing
def test_repeated_check_is_fast_and_refresh_reprobes(ip, lay_out):
    import time

    magics_instance(ip).context = lay_out(Machine().nvidia_host().cuda_torch())
    first = ip.run_line_magic("gpucheck", "-q -o")
    started = time.perf_counter()
    second = ip.run_line_magic("gpucheck", "-q -o")
    elapsed = time.perf_counter() - started
    assert elapsed < 0.3, f"repeated %gpucheck took {elapsed:.3f} s"
    assert second.facts["probe"]["torch"]["cached"] and second.verdict == first.verdict
    refreshed = ip.run_line_magic("gpucheck", "-q -o --refresh")
    assert refreshed.facts["probe"]["torch"]["ran"] and not refreshed.facts["probe"]["torch"]["cached"]


def test_model_left_on_cpu_while_gpu_usable(ip, lay_out):
    magics_instance(ip).context = lay_out(Machine().nvidia_host().cuda_torch())
    ip.run_cell("import torch\nmodel = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), "
                "torch.nn.Linear(256, 10))")
    report = ip.run_line_magic("gpucheck", "-q -o")
    assert report.gpu_usable and report.status == "warn"
    finding = next(f for f in report.findings if f.code == "MODEL_ON_CPU")
    assert "model" in finding.headline and 'model = model.to("cuda")' in "\n".join(finding.fix)


def test_audit_restricted_to_named_objects(ip, lay_out):
    magics_instance(ip).context = lay_out(Machine().nvidia_host().cuda_torch())
    ip.run_cell("import torch\nbig = torch.nn.Linear(512, 512)\nother = torch.nn.Linear(512, 512).double()")
    report = ip.run_line_magic("gpucheck", "-q -o other")
    audited = json.dumps([f.evidence for f in report.findings if f.code in ("MODEL_ON_CPU", "FP64_MODEL")])
    assert "other" in audited and "big" not in audited


def test_a_name_that_is_not_in_the_notebook_is_said_not_audited_silently(ip, lay_out):
    magics_instance(ip).context = lay_out(Machine().nvidia_host().cuda_torch())
    ip.run_cell("import torch\nmodel = torch.nn.Linear(8, 8)")
    with pytest.raises(UsageError, match=r"^%gpucheck: there is no variable 'modle' in the notebook to audit"):
        ip.run_line_magic("gpucheck", "-q -o modle")
    with pytest.raises(UsageError, match=r"no variables 'opt' or 'loader' in the notebook"):
        ip.run_line_magic("gpucheck", "-q -o model opt loader")
    assert ip.run_line_magic("gpucheck", "-q -o model").gpu_usable


def test_last_cell_device_mismatch_is_explained(ip, lay_out):
    magics_instance(ip).context = lay_out(Machine().nvidia_host().cuda_torch())
    ip.run_cell('raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, '
                'cuda:0 and cpu! (when checking argument for argument mat1 in method wrapper_CUDA_addmm)")')
    report = ip.run_line_magic("gpucheck", "-q -o")
    finding = next(f for f in report.findings if f.code == "DEVICE_MISMATCH_ERROR")
    assert "cuda:0" in str(finding.evidence) and "cpu" in str(finding.evidence)


def test_html_escapes_hostile_names(ip, lay_out):
    hostile = "<img src=x onerror=alert(1)>"
    gpu = nvml_gpu(hostile, "GPU-x", (9, 0), 80 << 30, processes=[{"pid": 4242, "used": 60 << 30}])
    magics_instance(ip).context = lay_out(Machine().nvidia_host(devices=[gpu]).cuda_torch())
    ip.run_cell(f"raise RuntimeError('CUDA out of memory. Tried to allocate 2.00 GiB {hostile}')")
    report = ip.run_line_magic("gpucheck", "-q -o")
    assert hostile in report.verdict  # the text form keeps the real name
    assert hostile in str(report.to_dict(include_facts=False))
    html = report._repr_html_()
    assert "<img" not in html
    assert html.count("&lt;img src=x onerror=alert(1)&gt;") >= 2  # the verdict and the exception evidence


@pytest.fixture
def small_shm(tmp_path):
    """A real 64 MiB tmpfs as the fake machine's /dev/shm (Docker's default size)."""
    import subprocess

    target = tmp_path / "root" / "dev" / "shm"
    target.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(target)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield target
    subprocess.run(["umount", str(target)], check=True)


def test_small_shared_memory_with_dataloader_workers(ip, lay_out, small_shm):
    magics_instance(ip).context = lay_out(Machine(files={"/.dockerenv": ""}).nvidia_host().cuda_torch())
    ip.run_cell("import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n"
                "loader = DataLoader(TensorDataset(torch.zeros(64, 3)), batch_size=8, num_workers=2)")
    report = ip.run_line_magic("gpucheck", "-q -o")
    finding = next(f for f in report.findings if f.code == "SHM_TOO_SMALL")
    assert "64 MiB" in finding.headline and "--shm-size" in "\n".join(finding.fix)
