"""PyTorch wheel ↔ NVIDIA driver ↔ GPU compatibility tables and the `pip install` recommender.

Pure data and arithmetic (catalogue §4 and §5): no torch or NVML imports, so the diagnosis can run
before torch is importable, and every rule is testable on a CPU-only box.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

INDEX_BASE = "https://download.pytorch.org/whl/"

# §4.1 minor-version compatibility: any driver at or above these runs every wheel of that CUDA major.
MIN_DRIVER_FOR_CUDA_MAJOR: dict[int, str] = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}

# Blackwell (cc 10.x/12.x) first appeared in CUDA 12.8, whose toolkit driver is 570.26 (§4.2); an older
# driver cannot drive the card whatever the wheel, so it raises the floor of a driver-upgrade advice (C3).
_BLACKWELL_DRIVER_FLOOR = "570.26"

# iGPU/Jetson codes are not binary-compatible with the rest of their major (torch's DEVICE_REQUIREMENT).
_EXACT_ONLY_ARCHS = frozenset({"sm_53", "sm_62", "sm_72", "sm_87", "sm_101"})


@dataclass(frozen=True)
class WheelVariant:
    """One CUDA index of one torch release (e.g. cu128) and the sm list compiled into it (§5.2)."""

    suffix: str
    cuda: tuple[int, int]
    arch: tuple[str, ...]
    experimental: bool = False


@dataclass(frozen=True)
class TorchRelease:
    minor: tuple[int, int]
    variants: tuple[WheelVariant, ...]
    pypi_default: str
    rocm: str | None
    # Only where the catalogue/brief pins the newest patch; otherwise we print X.Y.* and let pip choose.
    latest_patch: str | None = None
    released: bool = True

    @property
    def torchvision(self) -> str:
        return torchvision_minor(self.minor)

    def spec(self) -> str:
        return self.latest_patch or f"{self.minor[0]}.{self.minor[1]}.*"


# The packages built against one torch release, paired with it (probe_script.py keeps its own copy: it must
# stay self-contained).
COMPANIONS = ("torchvision", "torchaudio")


def torchvision_minor(torch_minor: tuple[int, int]) -> str:
    # torchvision 0.N pairs with torch 2.(N-15) throughout the table (2.5 -> 0.20 ... 2.14 -> 0.29).
    return f"0.{torch_minor[1] + 15}"


def paired_companion(name: str, torch_version: str) -> str | None:
    """The torchvision or torchaudio release built for this torch: 2.13.0+cpu -> torchvision 0.28.0, torchaudio
    2.13.0 (both keep torch's patch number). None for a torch outside the 2.x line."""
    base = base_version(torch_version)
    minor = release_minor(torch_version)
    if base is None or minor is None or minor[0] != 2:
        return None
    if name == "torchvision":
        return f"{torchvision_minor(minor)}.{base.rsplit('.', 1)[1]}"
    return base if name == "torchaudio" else None


def companion_torch_minor(name: str, version: str) -> tuple[int, int] | None:
    """The torch release a companion version belongs to: torchvision 0.28.x -> (2, 13), torchaudio 2.13.x -> (2, 13)."""
    minor = release_minor(version)
    if minor is None:
        return None
    if name == "torchvision":
        return (2, minor[1] - 15) if minor[0] == 0 and minor[1] >= 15 else None
    return minor


def local_variant(version: str) -> str | None:
    """The wheel index a version's local label names: "2.13.0+cu126" -> "cu126", "+cpu" -> "cpu"; None unlabelled."""
    label = version.partition("+")[2]
    return label or None


def _arch(codes: str, ptx: str | None = None) -> tuple[str, ...]:
    flags = [f"sm_{c}" for c in codes.split()]
    return (*flags, f"compute_{ptx}") if ptx else tuple(flags)


# §5.2 sm lists. Variants without their own row inherit the nearest documented one (see _matrix()).
_A_LEGACY = _arch("50 60 70 75 80 86 90")  # cu118/cu121/cu124 and every cu126
_A_CU128_27 = _arch("50 60 75 80 86 90 100 120")  # (inferred in the catalogue: no Volta in 2.7's cu128)
_A_CU128_28 = _arch("70 75 80 86 90 100 120")  # 2.8-2.10 cu128/cu129: Maxwell/Pascal dropped, Volta back
_A_CU128_211 = _arch("75 80 86 90 100 120")  # 2.11 cu128: Volta removed
_A_CU130 = _arch("75 80 86 90 100 110 120", ptx="120")  # CUDA 13 cannot target Maxwell/Pascal/Volta
_A_CU132 = _arch("75 80 86 90 100 120", ptx="120")


def _v(suffix: str, arch: tuple[str, ...], experimental: bool = False) -> WheelVariant:
    digits = suffix.removeprefix("cu")
    return WheelVariant(suffix, (int(digits[:-1]), int(digits[-1])), arch, experimental)


def _matrix() -> dict[tuple[int, int], TorchRelease]:
    cu126 = _v("cu126", _A_LEGACY)
    cu130, cu130x = _v("cu130", _A_CU130), _v("cu130", _A_CU130, True)
    cu132, cu132x = _v("cu132", _A_CU132), _v("cu132", _A_CU132, True)
    rels = [
        TorchRelease((2, 5), (_v("cu118", _A_LEGACY), _v("cu121", _A_LEGACY), _v("cu124", _A_LEGACY)),
                     "cu124", "rocm6.2"),
        TorchRelease((2, 6), (_v("cu118", _A_LEGACY), _v("cu124", _A_LEGACY), _v("cu126", _A_LEGACY, True)),
                     "cu124", "rocm6.2.4", "2.6.0"),
        # 2.7's cu118 has no §5.2 row; assumed to keep the cu118 list of 2.5-2.6.
        TorchRelease((2, 7), (_v("cu118", _A_LEGACY), cu126, _v("cu128", _A_CU128_27, True)),
                     "cu126", "rocm6.3"),
        TorchRelease((2, 8), (cu126, _v("cu128", _A_CU128_28), _v("cu129", _A_CU128_28, True)),
                     "cu128", "rocm6.4", "2.8.0"),
        # 2.9's cu129 exists for 2.9.0 only, so it is not offered (it would not install as 2.9.1).
        TorchRelease((2, 9), (cu126, _v("cu128", _A_CU128_28), cu130x), "cu128", "rocm6.4", "2.9.1"),
        TorchRelease((2, 10), (cu126, _v("cu128", _A_CU128_28), cu130x), "cu128", "rocm7.1", "2.10.0"),
        TorchRelease((2, 11), (cu126, _v("cu128", _A_CU128_211), cu130), "cu130", "rocm7.2", "2.11.0"),
        TorchRelease((2, 12), (cu126, cu130, cu132x), "cu130", "rocm7.2"),  # no cu128 from 2.12
        TorchRelease((2, 13), (cu126, cu130, cu132x), "cu130", "rocm7.2", "2.13.0"),
        # "rocm7.14" is copied as RELEASE.md writes it (§5.1).
        TorchRelease((2, 14), (cu126, cu130, cu132), "cu132", "rocm7.14", "2.14.1"),
        # Provisional: kept for arch look-ups of pre-release installs, never recommended.
        TorchRelease((2, 15), (cu130, cu132), "cu132", None, released=False),
    ]
    return {r.minor: r for r in rels}


RELEASES: dict[tuple[int, int], TorchRelease] = _matrix()

# Only the cu129 build of 2.9.0 lacks a recommendable row; arch_flags_for still knows it.
_EXTRA_ARCH: dict[tuple[tuple[int, int], tuple[int, int]], tuple[str, ...]] = {((2, 9), (12, 9)): _A_CU128_28}


def cuda_int_to_str(v: int) -> str:
    """12080 -> "12.8": the encoding of cudaDriverGetVersion / nvmlSystemGetCudaDriverVersion (§4.3)."""
    return f"{v // 1000}.{(v % 1000) // 10}"


def parse_cuda_version(s: str) -> tuple[int, int]:
    """"13.0" -> (13, 0); "12" -> (12, 0); "12.8.1" -> (12, 8). Raises ValueError on anything else."""
    m = re.fullmatch(r"\s*(\d+)(?:\.(\d+))?(?:\.\d+)?\s*", s)
    if not m:
        raise ValueError(f"not a CUDA version: {s!r}")
    return int(m.group(1)), int(m.group(2) or 0)


def _parse_arch(code: str) -> tuple[int, int] | None:
    # The last digit is the minor: sm_86 -> 8.6, sm_120 -> 12.0; arch-specific letters (sm_90a) are dropped.
    digits = code.split("_", 1)[-1].rstrip("af")
    return (int(digits[:-1]), int(digits[-1])) if digits.isdigit() and len(digits) >= 2 else None


def arch_supports(arch_flags: list[str], cc: tuple[int, int]) -> bool:
    """Whether a wheel built for `arch_flags` has code that runs on a device of compute capability `cc`."""
    for flag in arch_flags:
        target = _parse_arch(flag)
        if target is None:
            continue
        if flag.startswith("compute_"):
            # PTX is JIT-compiled by the driver for any equal or newer device.
            if cc >= target:
                return True
        elif flag.startswith("sm_"):
            if flag in _EXACT_ONLY_ARCHS or flag.endswith("a"):
                if cc == target:
                    return True
            # SASS is binary-compatible only forward within one major (8.6 code runs on 8.9, not on 9.0).
            elif cc[0] == target[0] and cc[1] >= target[1]:
                return True
    return False


def release_minor(torch_version: str) -> tuple[int, int] | None:
    m = re.match(r"\s*(\d+)\.(\d+)", torch_version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def base_version(torch_version: str) -> str | None:
    # "2.9.1+cpu" -> "2.9.1"; pre-releases ("2.15.0.dev2026...") keep only X.Y.Z.
    m = re.match(r"\s*(\d+\.\d+\.\d+)", torch_version)
    return m.group(1) if m else None


def arch_flags_for(torch_version: str, cuda_version: str) -> list[str] | None:
    """The sm/compute list of the Linux x86_64 wheel, e.g. for ("2.13.0+cu130", "13.0"); None if unknown."""
    minor = release_minor(torch_version)
    try:
        cuda = parse_cuda_version(cuda_version)
    except ValueError:
        return None
    rel = RELEASES.get(minor) if minor else None
    if rel is None or minor is None:
        return None
    for v in rel.variants:
        if v.cuda == cuda:
            return list(v.arch)
    extra = _EXTRA_ARCH.get((minor, cuda))
    return list(extra) if extra else None


def driver_supports_wheel(driver_cuda_int: int, wheel_cuda: str) -> bool:
    """CUDA >= 11 minor-version compatibility: only the major must be covered by the driver (§4.4)."""
    return driver_cuda_int // 1000 >= parse_cuda_version(wheel_cuda)[0]


@dataclass(frozen=True)
class InstallAdvice:
    torch_spec: str
    suffix: str | None
    index_url: str | None
    pip_command: str | None
    driver_alternative: str | None
    reason: str
    # Where no pip command can say it (a Jetson's wheel folder, its container): lines to show beside the command.
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _rank(v: WheelVariant, drv: tuple[int, int]) -> tuple[int, bool, int]:
    # §5.3 order: same major at or below the driver's CUDA (newest first) is native; same major above the
    # driver minor runs under minor-version compatibility (closest first: fewer PTX-JIT surprises, C4);
    # lower majors last (newest first). Inside a group a stable build beats an experimental one even if
    # newer (2.13 on a 13.2 driver gets cu130, its PyPI default, not the experimental cu132).
    cuda = v.cuda[0] * 100 + v.cuda[1]
    if v.cuda[0] == drv[0]:
        return (0, v.experimental, -cuda) if v.cuda <= drv else (1, v.experimental, cuda)
    return (2, v.experimental, -cuda)


def _candidates(rel: TorchRelease, drv_int: int, ccs: list[tuple[int, int]]) -> list[WheelVariant]:
    drv = (drv_int // 1000, (drv_int % 1000) // 10)
    ok = [v for v in rel.variants
          if drv[0] >= v.cuda[0] and all(arch_supports(list(v.arch), cc) for cc in ccs)]
    return sorted(ok, key=lambda v: _rank(v, drv))


def _released_newest_first() -> list[TorchRelease]:
    return sorted((r for r in RELEASES.values() if r.released), key=lambda r: r.minor, reverse=True)


def _pick(drv_int: int, ccs: list[tuple[int, int]], installed: str | None
          ) -> tuple[TorchRelease, str, WheelVariant] | None:
    """(release, torch spec, variant): the installed release when it can work, else the newest that can."""
    minor = release_minor(installed) if installed else None
    rel = RELEASES.get(minor) if minor else None
    base = base_version(installed) if installed else None
    if rel is not None and rel.released and base:
        cands = _candidates(rel, drv_int, ccs)
        if cands:
            return rel, base, cands[0]
    for rel in _released_newest_first():
        cands = _candidates(rel, drv_int, ccs)
        if cands:
            return rel, rel.spec(), cands[0]
    return None


def _newest_cuda_int() -> int:
    newest = max(v.cuda for r in RELEASES.values() if r.released for v in r.variants)
    return newest[0] * 1000 + newest[1] * 10


def _version_key(driver: str) -> tuple[int, ...]:
    return tuple(int(p) for p in driver.split("."))


def _driver_text(major: int, ccs: list[tuple[int, int]], spec: str, v: WheelVariant, prefix: str) -> str:
    need, why = MIN_DRIVER_FOR_CUDA_MAJOR[major], f"CUDA {major}.0"
    if any(cc[0] in (10, 12) for cc in ccs) and _version_key(_BLACKWELL_DRIVER_FLOOR) > _version_key(need):
        need, why = _BLACKWELL_DRIVER_FLOOR, "CUDA 12.8, the first with Blackwell support"
    return f"{prefix} the NVIDIA driver to >= {need} ({why}) to use torch=={spec} from the {v.suffix} index"


def _quote(spec: str) -> str:
    # A bare * would be globbed (or rejected outright by zsh) when pasted into a shell.
    return f'"{spec}"' if "*" in spec else spec


def _advice(rel: TorchRelease, spec: str, suffix: str, companions: tuple[bool, bool], alt: str | None,
            reason: str) -> InstallAdvice:
    # (torchvision, torchaudio): the companions installed beside torch are reinstalled with it, paired.
    with_tv, with_ta = companions
    pkgs = [_quote(f"torch=={spec}")]
    if with_tv:
        pkgs.append(_quote(f"torchvision=={rel.torchvision}.*"))
    if with_ta:
        pkgs.append(_quote(f"torchaudio=={rel.minor[0]}.{rel.minor[1]}.*"))
    url = INDEX_BASE + suffix
    cmd = f"%pip install --force-reinstall {' '.join(pkgs)} --index-url {url}"
    return InstallAdvice(spec, suffix, url, cmd, alt, reason)


def _unsupported_gpus(base: str | None, ccs: list[tuple[int, int]]) -> InstallAdvice:
    # No driver helps: the GPUs predate (or postdate) every variant of every release in the table.
    listed = ", ".join(f"{cc[0]}.{cc[1]}" for cc in ccs)
    rels = _released_newest_first()
    span = f"{rels[-1].minor[0]}.{rels[-1].minor[1]}-{rels[0].minor[0]}.{rels[0].minor[1]}"
    why = f"No PyTorch {span} wheel has code for compute capability {listed}; build from source."
    return InstallAdvice(base or "", None, None, None, None, why)


def recommend_install(*, driver_cuda: int | None, gpu_ccs: list[tuple[int, int]], installed_torch: str | None,
                      with_torchvision: bool = False, with_torchaudio: bool = False, rocm: bool = False,
                      jetson: bool = False, l4t: str | None = None) -> InstallAdvice:
    """The catalogue's §5.3 algorithm: the wheel to install for this driver and these GPUs. On a Jetson (`jetson`,
    with its L4T release when known) none of those wheels runs: NVIDIA's build for its JetPack instead."""
    companions = (with_torchvision, with_torchaudio)
    if jetson:
        return jetson_install(l4t, companions)
    minor = release_minor(installed_torch) if installed_torch else None
    installed_rel = RELEASES.get(minor) if minor else None
    base = base_version(installed_torch) if installed_torch else None
    keep = installed_rel is not None and installed_rel.released and base is not None

    if rocm:
        # AMD: no CUDA driver or sm list to match, only the ROCm index of the release.
        if keep and installed_rel is not None and base is not None and installed_rel.rocm:
            rel, spec, suffix = installed_rel, base, installed_rel.rocm
        else:
            rel, suffix = next((r, r.rocm) for r in _released_newest_first() if r.rocm)
            spec = rel.spec()
        return _advice(rel, spec, suffix, companions, None,
                       f"Torch {spec} for AMD GPUs comes from the {suffix} index.")

    if driver_cuda is None:
        # No driver visible: the PyPI default is what plain `pip install torch` would pick.
        rels = ([installed_rel] if keep and installed_rel else []) + _released_newest_first()
        for rel in rels:
            spec = base if rel is installed_rel and keep and base else rel.spec()
            fits = [v for v in rel.variants if all(arch_supports(list(v.arch), cc) for cc in gpu_ccs)]
            fits.sort(key=lambda v: (v.suffix != rel.pypi_default, v.experimental, -v.cuda[0], -v.cuda[1]))
            if fits:
                v = fits[0]
                return _advice(rel, spec, v.suffix, companions, None,
                               f"The NVIDIA driver version is unknown, so this is torch {spec}'s "
                               f"{'PyPI default' if v.suffix == rel.pypi_default else 'matching'} "
                               f"{v.suffix} variant, which needs a driver >= "
                               f"{MIN_DRIVER_FOR_CUDA_MAJOR[v.cuda[0]]}.")
        return _unsupported_gpus(base, gpu_ccs)

    drv_str, drv_major = cuda_int_to_str(driver_cuda), driver_cuda // 1000
    pick = _pick(driver_cuda, gpu_ccs, installed_torch)

    if pick is None:
        # Nothing runs on this driver: name the smallest CUDA major whose driver would make a wheel fit.
        for major in sorted(MIN_DRIVER_FOR_CUDA_MAJOR):
            if major <= drv_major:
                continue
            hypo = _pick(major * 1000 + 990, gpu_ccs, installed_torch)
            if hypo is not None:
                _, hspec, hv = hypo
                alt = _driver_text(major, gpu_ccs, hspec, hv, "upgrade")
                why = f"No PyTorch wheel runs on both this driver (CUDA {drv_str}) and these GPUs."
                return InstallAdvice(hspec, None, None, None, alt, why)
        return _unsupported_gpus(base, gpu_ccs)

    rel, spec, v = pick
    # §5.3 step 6: what the newest driver would allow; offer it when it means a newer CUDA major.
    alt = None
    best = _pick(_newest_cuda_int(), gpu_ccs, installed_torch)
    if best is not None and best[2].cuda[0] > drv_major:
        alt = _driver_text(best[2].cuda[0], gpu_ccs, best[1], best[2], "or upgrade")

    installed_suffix = installed_torch.partition("+")[2] if installed_torch else ""
    if spec == base and installed_suffix == v.suffix:
        why = f"the installed {installed_torch} already suits this driver (CUDA {drv_str}) and these GPUs"
    elif spec == base:
        why = f"keeps torch {spec}; {v.suffix} is its best build for a CUDA {drv_str} driver and these GPUs"
    elif installed_torch and installed_rel is None:
        why = f"torch {installed_torch} is outside the known wheel matrix; torch {spec} ({v.suffix}) fits"
    elif installed_torch:
        why = (f"no build of the installed torch {installed_torch} runs on a CUDA {drv_str} driver with "
               f"these GPUs; torch {spec} is the newest release with one ({v.suffix})")
    else:
        why = f"torch {spec} is the newest release with a build ({v.suffix}) for a CUDA {drv_str} driver"
    return _advice(rel, spec, v.suffix, companions, alt, why[0].upper() + why[1:] + ".")


# -- Jetson (L4T): torch is built per JetPack, never from the CUDA indexes above --------------------------------------

JETSON_PYTORCH_GUIDE = "https://docs.nvidia.com/deeplearning/frameworks/install-pytorch-jetson-platform/index.html"
JETSON_REDIST = "https://developer.download.nvidia.com/compute/redist/jp/"
JETSON_FORUM = "https://forums.developer.nvidia.com/t/pytorch-for-jetson/72048"
JETSON_AI_LAB = "https://pypi.jetson-ai-lab.io/"
# L4T's major release is JetPack's; a few exact pairs from NVIDIA's JetPack archive, where the minor release matters.
JETPACK_OF_L4T_MAJOR = {"32": "4", "34": "5", "35": "5", "36": "6", "38": "7"}
JETPACK_OF_L4T = {"32.1.0": "4.2", "32.2.1": "4.2.2", "32.3.1": "4.3", "32.4.3": "4.4", "32.4.4": "4.4.1",
                  "32.5.0": "4.5", "32.5.1": "4.5.1", "32.6.1": "4.6", "32.7.1": "4.6.1", "35.1.0": "5.0.2",
                  "35.2.1": "5.1", "35.3.1": "5.1.1", "35.4.1": "5.1.2", "35.5.0": "5.1.3", "35.6.0": "5.1.4",
                  "36.2.0": "6.0 DP", "36.3.0": "6.0", "36.4.0": "6.1", "36.4.3": "6.2", "36.4.4": "6.2.1",
                  "38.2.0": "7.0"}
# The kernel each JetPack boots: inside a container it is still the host's, while /etc/nv_tegra_release is the image's.
L4T_MAJOR_OF_KERNEL = {(4, 9): "32", (5, 10): "35", (5, 15): "36", (6, 8): "38"}
# The GPUs' own code in Jetson builds (TX1/Nano, TX2, Xavier, Orin, Thor under CUDA 12 and 13); x86 and server (SBSA)
# wheels carry none of them, but cu130's sm_110 (Thor's, whose JetPack 7 runs the SBSA userspace).
JETSON_ARCHS = frozenset({"sm_53", "sm_62", "sm_72", "sm_87", "sm_101", "sm_110"})
_MISSING_CUDA_LIBRARY = re.compile(
    r"lib(cudart|cublasLt|cublas|nvrtc|cudnn)\.so\.(\d+)(?:\.(\d+))?: cannot open shared")


@dataclass(frozen=True)
class JetPackStack:
    """What one L4T release ships for CUDA programs: NVIDIA builds torch against exactly this."""

    first_l4t: tuple[int, int]
    cuda: tuple[int, int]
    cudnn: int
    gpus: tuple[tuple[int, int], ...]  # the compute capabilities this JetPack supports
    sbsa: bool = False  # JetPack 7 runs the server (SBSA) CUDA userspace

    @property
    def cuda_text(self) -> str:
        return f"{self.cuda[0]}.{self.cuda[1]}"


# Newest first (NVIDIA's JetPack archive and release notes): JetPack 4.2-4.3 CUDA 10.0/cuDNN 7, 4.4-4.6 CUDA
# 10.2/cuDNN 8, 5.x CUDA 11.4/cuDNN 8, 6.0 CUDA 12.2/cuDNN 8.9, 6.1-6.2 CUDA 12.6/cuDNN 9.3, 7 CUDA 13.0/cuDNN 9.
JETPACK_STACKS = (
    JetPackStack((38, 0), (13, 0), 9, ((11, 0),), sbsa=True),
    JetPackStack((36, 4), (12, 6), 9, ((8, 7),)),
    JetPackStack((36, 0), (12, 2), 8, ((8, 7),)),
    JetPackStack((34, 0), (11, 4), 8, ((7, 2), (8, 7))),
    JetPackStack((32, 4), (10, 2), 8, ((5, 3), (6, 2), (7, 2))),
    JetPackStack((32, 0), (10, 0), 7, ((5, 3), (6, 2), (7, 2))),
)


def _release(l4t: str | None) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", l4t or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def jetpack_stack(l4t: str | None) -> JetPackStack | None:
    """The stack of an L4T release ("36.4.3"); of a major alone ("36": a host known by its kernel), its newest."""
    release = _release(l4t) or (_release(f"{l4t}.99") if (l4t or "").isdigit() else None)
    return next((s for s in JETPACK_STACKS if release and release >= s.first_l4t), None)


def jetpack_name(l4t: str | None) -> str | None:
    return JETPACK_OF_L4T.get(l4t or "") or JETPACK_OF_L4T_MAJOR.get((l4t or "").split(".")[0])


def l4t_major_of_kernel(kernel_release: str | None) -> str | None:
    """The host's L4T major from its kernel ("5.15.148-tegra": 36); None for a kernel that is not L4T's."""
    m = re.match(r"(\d+)\.(\d+)\.\d+.*tegra", kernel_release or "")
    return L4T_MAJOR_OF_KERNEL.get((int(m.group(1)), int(m.group(2)))) if m else None


def jetpack_built_for(cuda: tuple[int, int]) -> str | None:
    """The JetPack whose CUDA a Jetson build's CUDA is: (11, 4) -> "JetPack 5"; None where no JetPack ships it."""
    if cuda[0] == 10:
        return "JetPack 4.2-4.3" if cuda[1] == 0 else "JetPack 4.4-4.6"
    return {11: "JetPack 5", 12: "JetPack 6", 13: "JetPack 7"}.get(cuda[0])


def missing_library_need(import_error: str | None) -> tuple[str, str, tuple[int, int] | int] | None:
    """The CUDA or cuDNN a missing library's soname asks for: ("libcudnn.so.8", "cudnn", 8), ("libcudart.so.10.0",
    "cuda", (10, 0)); libraries whose soname does not follow CUDA's version (cufft, curand...) tell nothing."""
    m = _MISSING_CUDA_LIBRARY.search(import_error or "")
    if m is None:
        return None
    name, major, minor = m.group(1), int(m.group(2)), m.group(3)
    soname = f"lib{name}.so.{major}" + (f".{minor}" if minor else "")
    if name == "cudnn":
        return soname, "cudnn", major
    # Before CUDA 11 the sonames carry the minor (libcudart.so.10.2); from 11 only the major.
    return soname, "cuda", (major, int(minor) if minor and major < 11 else -1)


@dataclass(frozen=True)
class JetsonFit:
    """Whether torch is a build for the JetPack this Jetson runs: fits True, False, or None (cannot tell)."""

    fits: bool | None
    build: str  # the build, in words, for a headline
    why: str  # the evidence that decided it


def _cuda_matches(need: tuple[int, int], have: tuple[int, int]) -> bool:
    # CUDA 10's libraries are versioned by major.minor; from 11 a build needs its major's libraries.
    return need[0] == have[0] and (need[0] >= 11 or need[1] in (-1, have[1]))


def jetson_build_fit(*, l4t: str | None, torch_version: str | None, torch_cuda: str | None,
                     arch_flags: list[str], import_error: str | None, cpu_only: bool) -> JetsonFit:
    """Decide whether this torch is built for this JetPack from what the build says of itself: its CUDA, its GPU code,
    its version's label and, when the import failed, the library it could not load. No guess from the version
    number alone: NVIDIA's own wheels (".nv23.06"), the Jetson AI Lab's ("2.5.0") and source builds all count."""
    if cpu_only:
        return JetsonFit(False, "a CPU-only build", "it has no CUDA at all")
    stack = jetpack_stack(l4t)
    label = local_variant(torch_version or "") or ""
    jetson_code = sorted(JETSON_ARCHS & set(arch_flags))
    sbsa_label = re.fullmatch(r"cu\d+", label) is not None
    if stack is None:
        return JetsonFit(None, "a build", f"L4T release {l4t or 'unknown'} is not in the JetPack table")
    try:
        cuda = parse_cuda_version(torch_cuda) if torch_cuda else None
    except ValueError:
        cuda = None
    if not stack.sbsa and (sbsa_label or (arch_flags and not jetson_code)):
        shown = " ".join(arch_flags) or f"+{label}"
        return JetsonFit(False, f"a server (SBSA) aarch64 CUDA {torch_cuda or ''} build".replace("  ", " "),
                         f"it has no Jetson GPU code ({shown}); its CUDA libraries are SBSA's, not L4T's")
    if cuda is not None and not _cuda_matches(cuda, stack.cuda):
        nvidia = ".nv" in (torch_version or "")
        built_for = jetpack_built_for(cuda) if jetson_code or nvidia else None
        whose = "NVIDIA's Jetson build" if nvidia else "a Jetson build" if jetson_code else "a build"
        return JetsonFit(False, f"{whose} for CUDA {torch_cuda}" + (f" ({built_for})" if built_for else ""),
                         f"this JetPack has CUDA {stack.cuda_text}")
    need = missing_library_need(import_error)
    if need is not None:
        soname, kind, version = need
        wrong = version != stack.cudnn if kind == "cudnn" else not _cuda_matches(version, stack.cuda)  # type: ignore[arg-type]
        if wrong:
            return JetsonFit(False, "a build for another JetPack",
                             f"{soname} is missing: this JetPack has CUDA {stack.cuda_text} and cuDNN {stack.cudnn}")
    if arch_flags and not any(arch_supports(arch_flags, cc) for cc in stack.gpus):
        return JetsonFit(False, f"a build without code for this JetPack's GPUs ({' '.join(arch_flags)})",
                         "no architecture in it runs here")
    if cuda is None:
        return JetsonFit(None, "a build", "its CUDA version is unknown")
    if jetson_code or ".nv" in (torch_version or "") or stack.sbsa:
        return JetsonFit(True, f"a Jetson build for CUDA {torch_cuda}", f"this JetPack has CUDA {stack.cuda_text}")
    return JetsonFit(None, f"a CUDA {torch_cuda} build", "nothing in it says whether it is built for a Jetson")


def _jetson_index(l4t: str | None) -> str | None:
    """The Jetson AI Lab's pip index for this JetPack: JetPack 6 by its CUDA, JetPack 7 (SBSA) cu130."""
    stack = jetpack_stack(l4t)
    if stack is None or stack.cuda[0] < 12:
        return None
    if stack.sbsa:
        return JETSON_AI_LAB + "sbsa/cu130"  # the jp7 index is empty (pollen-robotics/microduck_rl#38)
    return JETSON_AI_LAB + f"jp6/cu{stack.cuda[0]}{stack.cuda[1]}"


def jetson_install(l4t: str | None, companions: tuple[bool, bool] = (False, False)) -> InstallAdvice:
    """NVIDIA's torch for the JetPack of this L4T release: a pip index where NVIDIA keeps one (JetPack 6 and 7),
    else its wheel folder or forum thread, and its container."""
    stack, named = jetpack_stack(l4t), jetpack_name(l4t)
    jetpack = f"JetPack {named}" if named else "this JetPack"
    index = _jetson_index(l4t)
    pkgs = ["torch", *(["torchvision"] if companions[0] else []), *(["torchaudio"] if companions[1] else [])]
    cmd = f"%pip install --force-reinstall {' '.join(pkgs)} --index-url {index}" if index else None
    notes = []
    if stack is not None and stack.cuda[0] == 10:
        notes.append(f"NVIDIA's wheels for {jetpack} (CUDA {stack.cuda_text}, Python 3.6) are listed in {JETSON_FORUM}")
    elif stack is None or stack.cuda[0] == 11 or not index:
        notes.append(f"NVIDIA's wheel for {jetpack} (L4T R{l4t or '?'}) from {JETSON_REDIST}, as "
                     f"{JETSON_PYTORCH_GUIDE} describes.")
    else:
        notes.append(f"Or NVIDIA's wheel for {jetpack} from {JETSON_REDIST}, as {JETSON_PYTORCH_GUIDE} describes.")
    if stack is None or stack.cuda[0] < 12:
        notes.append(f"Or run Jupyter in NVIDIA's container for this release: nvcr.io/nvidia/l4t-pytorch "
                     f"(tag r{l4t or '<L4T>'}-pth*).")
    elif not stack.sbsa:
        notes.append("Or run Jupyter in NVIDIA's container for JetPack 6: nvcr.io/nvidia/pytorch:<yy.mm>-py3-igpu.")
    cuda = f"CUDA {stack.cuda_text}" if stack else "its CUDA"
    why = f"On a Jetson, torch must be NVIDIA's build for {jetpack} ({cuda}); PyPI's and download.pytorch.org's " \
          "aarch64 wheels are CPU-only or built for server (SBSA) GPUs."
    return InstallAdvice("", index.rsplit("/", 2)[-2] + "/" + index.rsplit("/", 1)[-1] if index else None, index,
                         cmd, None, why, tuple(notes))
