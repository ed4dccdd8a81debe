"""The wheel/driver/GPU tables and the `%pip install` recommendation (catalogue §4-§5)."""

from __future__ import annotations

import pytest

from jupyter_gpu.gpucheck.diagnose.wheels import (
    MIN_DRIVER_FOR_CUDA_MAJOR,
    arch_flags_for,
    arch_supports,
    cuda_int_to_str,
    driver_supports_wheel,
    parse_cuda_version,
    recommend_install,
)

# The six worked examples closing catalogue §5: (installed, driver CUDA int, GPU cc) -> (torch, suffix).
WORKED_EXAMPLES = [
    ("2.9.1+cpu", 12080, (8, 6), "2.9.1", "cu128"),  # RTX 3080, CPU wheel installed
    ("2.11.0+cu130", 12080, (8, 9), "2.11.0", "cu128"),  # RTX 4090, cu13 wheel on a 570 driver
    ("2.12.0+cu130", 12060, (8, 6), "2.12.0", "cu126"),  # RTX 3090: 2.12 has no cu128
    ("2.7.1+cu126", 11040, (7, 5), "2.7.1", "cu118"),  # T4 on a 470 driver
    ("2.6.0+cu124", 12090, (12, 0), "2.11.0", "cu128"),  # RTX 5090: no 2.6 build has sm_120
    ("2.8.0+cu128", 12060, (6, 0), "2.8.0", "cu126"),  # P100 dropped from cu128
]


@pytest.mark.parametrize(("installed", "driver", "cc", "torch", "suffix"), WORKED_EXAMPLES)
def test_catalogue_worked_examples(installed, driver, cc, torch, suffix):
    advice = recommend_install(driver_cuda=driver, gpu_ccs=[cc], installed_torch=installed)
    assert (advice.torch_spec, advice.suffix) == (torch, suffix)
    assert advice.index_url == f"https://download.pytorch.org/whl/{suffix}"
    assert f"torch=={torch} " in advice.pip_command
    assert advice.reason


def test_worked_examples_name_the_driver_upgrade_the_catalogue_mentions():
    rtx4090 = recommend_install(driver_cuda=12080, gpu_ccs=[(8, 9)], installed_torch="2.11.0+cu130")
    assert "580.65.06" in rtx4090.driver_alternative
    t4 = recommend_install(driver_cuda=11040, gpu_ccs=[(7, 5)], installed_torch="2.7.1+cu126")
    assert "525.60.13" in t4.driver_alternative
    # No newer driver brings a P100 a newer CUDA build, so there is nothing to offer.
    p100 = recommend_install(driver_cuda=12060, gpu_ccs=[(6, 0)], installed_torch="2.8.0+cu128")
    assert p100.driver_alternative is None


def test_pip_command_is_copy_pasteable_in_a_notebook():
    advice = recommend_install(driver_cuda=12080, gpu_ccs=[(8, 6)], installed_torch="2.9.1+cpu")
    assert advice.pip_command == (
        "%pip install --force-reinstall torch==2.9.1 --index-url https://download.pytorch.org/whl/cu128"
    )
    assert advice.to_dict()["pip_command"] == advice.pip_command


def test_torchvision_is_paired_only_when_asked():
    kwargs = {"driver_cuda": 12060, "gpu_ccs": [(8, 6)], "installed_torch": "2.13.0+cu130"}
    with_tv = recommend_install(**kwargs, with_torchvision=True)
    assert with_tv.torch_spec == "2.13.0"
    assert "torchvision==0.28.*" in with_tv.pip_command
    assert with_tv.pip_command.startswith("%pip install")
    assert "--index-url https://download.pytorch.org/whl/cu126" in with_tv.pip_command
    assert "torchvision" not in recommend_install(**kwargs).pip_command


def test_walk_prints_the_known_latest_patch_of_the_newest_release():
    advice = recommend_install(driver_cuda=13020, gpu_ccs=[(9, 0)], installed_torch=None)
    assert (advice.torch_spec, advice.suffix) == ("2.14.1", "cu132")
    assert advice.driver_alternative is None


def test_stable_variant_preferred_over_experimental_at_the_same_driver():
    # 2.13's cu132 is experimental; its stable cu130 runs natively on a 13.2 driver.
    advice = recommend_install(driver_cuda=13020, gpu_ccs=[(8, 6)], installed_torch="2.13.0+cpu")
    assert advice.suffix == "cu130"


def test_unreleased_and_unknown_installs_fall_back_to_newest_release():
    for installed in ("2.15.0.dev20261001+cu130", "1.13.1+cu117"):
        advice = recommend_install(driver_cuda=13000, gpu_ccs=[(8, 0)], installed_torch=installed)
        assert (advice.torch_spec, advice.suffix) == ("2.14.1", "cu130")


def test_unknown_driver_uses_the_pypi_default_and_says_so():
    advice = recommend_install(driver_cuda=None, gpu_ccs=[], installed_torch="2.11.0+cpu")
    assert (advice.torch_spec, advice.suffix) == ("2.11.0", "cu130")
    assert "unknown" in advice.reason and "PyPI default" in advice.reason
    fresh = recommend_install(driver_cuda=None, gpu_ccs=[], installed_torch=None)
    assert (fresh.torch_spec, fresh.suffix) == ("2.14.1", "cu132")


def test_nothing_fits_asks_for_a_driver_upgrade():
    # An sm_110 device only has code in cu130 builds, which a CUDA 12.8 driver cannot run.
    advice = recommend_install(driver_cuda=12080, gpu_ccs=[(11, 0)], installed_torch="2.14.1+cu126")
    assert advice.suffix is None and advice.pip_command is None and advice.index_url is None
    assert ">= 580.65.06" in advice.driver_alternative
    assert "cu130" in advice.driver_alternative


def test_blackwell_on_a_cuda_11_driver_needs_at_least_the_570_branch():
    advice = recommend_install(driver_cuda=11040, gpu_ccs=[(12, 0)], installed_torch=None)
    assert advice.pip_command is None
    assert ">= 570.26" in advice.driver_alternative


def test_gpu_older_than_every_wheel_gets_no_command_and_no_driver_advice():
    advice = recommend_install(driver_cuda=13000, gpu_ccs=[(3, 5)], installed_torch=None)
    assert advice.pip_command is None and advice.driver_alternative is None
    assert "3.5" in advice.reason


def test_every_gpu_must_be_covered():
    # A P100 next to an RTX 5090: only 2.7's cu128 carries both sm_60 and sm_120.
    advice = recommend_install(driver_cuda=12080, gpu_ccs=[(6, 0), (12, 0)], installed_torch=None)
    assert (advice.torch_spec, advice.suffix) == ("2.7.*", "cu128")
    assert '"torch==2.7.*"' in advice.pip_command  # quoted so the shell does not glob it


def test_rocm_uses_the_release_rocm_index():
    advice = recommend_install(driver_cuda=None, gpu_ccs=[], installed_torch="2.12.0+cpu", rocm=True)
    assert (advice.torch_spec, advice.suffix) == ("2.12.0", "rocm7.2")
    assert advice.index_url == "https://download.pytorch.org/whl/rocm7.2"


@pytest.mark.parametrize(
    ("flags", "cc", "ok"),
    [
        (["sm_80", "sm_86"], (8, 9), True),  # RTX 4090 runs sm_86 code
        (["sm_75", "sm_80", "sm_86", "sm_90", "sm_100"], (12, 0), False),  # RTX 5090 needs sm_120
        (["sm_90", "sm_120"], (12, 0), True),
        (["sm_120"], (12, 1), True),  # GB10
        (["sm_50", "sm_60", "sm_70"], (6, 1), True),  # GTX 1080 on sm_60
        (["sm_61"], (6, 0), False),  # never backwards within a major
        (["sm_86"], (9, 0), False),  # never across majors
        (["sm_75", "compute_120"], (12, 1), True),  # PTX JITs forward
        (["sm_75", "compute_90"], (12, 0), True),
        (["compute_120"], (8, 6), False),  # but never backward
        (["sm_87"], (8, 7), True),  # Jetson Orin code: exactly itself
        (["sm_87"], (8, 9), False),
        (["sm_72"], (7, 5), False),
        (["sm_90a"], (9, 0), True),  # arch-specific: exact only
        ([], (8, 0), False),
    ],
)
def test_arch_rule(flags, cc, ok):
    assert arch_supports(flags, cc) is ok


def test_arch_flags_for_known_and_unknown_wheels():
    cu130 = arch_flags_for("2.13.0+cu130", "13.0")
    assert cu130 == ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_110", "sm_120", "compute_120"]
    assert arch_flags_for("2.8.0+cu128", "12.8")[0] == "sm_70"
    assert "sm_70" not in arch_flags_for("2.11.0+cu128", "12.8")
    assert "sm_60" in arch_flags_for("2.14.0+cu126", "12.6")
    assert arch_flags_for("2.9.0+cu129", "12.9") is not None
    assert arch_flags_for("2.12.0+cu128", "12.8") is None  # 2.12 has no cu128
    assert arch_flags_for("1.13.1", "11.7") is None
    assert arch_flags_for("2.13.0", "garbage") is None


def test_driver_too_old_for_wheel():
    # "found version 12080": a 570 driver cannot load a cu130 wheel, but runs any 12.x one.
    assert not driver_supports_wheel(12080, "13.0")
    assert driver_supports_wheel(12020, "12.9")  # minor-version compatibility
    assert driver_supports_wheel(13000, "12.6")
    assert not driver_supports_wheel(11040, "12.1")


def test_version_helpers():
    assert cuda_int_to_str(12080) == "12.8"
    assert cuda_int_to_str(13020) == "13.2"
    assert cuda_int_to_str(11040) == "11.4"
    assert parse_cuda_version("13.0") == (13, 0)
    assert parse_cuda_version("12.8") == (12, 8)
    assert parse_cuda_version("12.8.1") == (12, 8)
    with pytest.raises(ValueError):
        parse_cuda_version("cuda")
    assert MIN_DRIVER_FOR_CUDA_MAJOR == {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
