"""`GpuCheckReport.brief()`: the one "verdict, headline, fix" every panel shows (notebook, server, side panel)."""

from __future__ import annotations

from jupyter_gpu.gpucheck.report import CheckBrief, GpuCheckReport
from jupyter_gpu.models import LAYER_COMPAT, LAYER_USAGE, Finding

DRIVER = Finding("DRIVER_TOO_OLD_FOR_WHEEL", "fail", "The NVIDIA driver 570.124.06 is too old for torch 2.11.0+cu130.",
                 {}, ["%pip install --force-reinstall torch==2.11.0 --index-url https://download.pytorch.org/whl/cu128"],
                 [], LAYER_COMPAT)
BUSY = Finding("GPU_MEMORY_HELD_BY_OTHER_PROCESS", "warn", "Another process holds 70 GiB of GPU 0.", {}, [], [],
               LAYER_USAGE)


def report(verdict: str, *findings: Finding, status: str = "fail") -> GpuCheckReport:
    return GpuCheckReport(status=status, verdict=verdict, gpu_usable=False, devices=[], findings=list(findings),
                          facts={})


def test_a_headline_the_verdict_already_says_is_left_out() -> None:
    brief = report("PyTorch is running on the CPU: the NVIDIA driver 570.124.06 is too old for torch 2.11.0+cu130",
                   DRIVER).brief()
    assert brief.headline is None
    assert brief.fix == DRIVER.fix and brief.code == "DRIVER_TOO_OLD_FOR_WHEEL" and brief.status == "fail"


def test_a_headline_the_verdict_does_not_say_is_kept() -> None:
    brief = report("PyTorch can use 1x NVIDIA H200 (cuda:0)", BUSY, status="warn").brief()
    assert brief.headline == BUSY.headline and brief.code == BUSY.code and brief.fix == []


def test_a_clean_report_briefs_only_its_verdict() -> None:
    brief = report("PyTorch can use 1x NVIDIA H200 (cuda:0)", status="ok").brief()
    assert brief == CheckBrief("ok", "PyTorch can use 1x NVIDIA H200 (cuda:0)", None, [], None)


def test_the_json_carries_the_same_five_keys_for_a_report_and_for_a_check_that_could_not_run() -> None:
    ran = report("PyTorch is running on the CPU", DRIVER).brief().to_dict()
    failed = CheckBrief.could_not_run(OSError("no /proc")).to_dict()
    assert set(ran) == set(failed) == {"status", "verdict", "headline", "fix", "code"}
    assert failed["verdict"] == "%gpucheck could not run: no /proc" and failed["status"] == "fail"
