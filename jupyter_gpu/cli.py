"""The `jupyter-gpu` command line (also `python -m jupyter_gpu`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from jupyter_gpu.options import (
    OptionsError,
    SentenceParser,
    _whole_number,
    add_check_options,
    interval_type,
    seconds_type,
    validate,
)

if TYPE_CHECKING:
    from jupyter_gpu.distributed.links import LinkPeak
    from jupyter_gpu.distributed.report import ReadinessReport
    from jupyter_gpu.gpucheck.report import GpuCheckReport
    from jupyter_gpu.gpucheck.request import CheckRequest

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # Ctrl-C before anything was recorded, as a shell reports SIGINT


def build_parser() -> SentenceParser:
    parser = SentenceParser(prog="jupyter-gpu", description="Is PyTorch really using the GPU?")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=SentenceParser)
    check = commands.add_parser("check", help="diagnose whether PyTorch can use a GPU here, and how to fix it")
    add_check_options(check)
    record = commands.add_parser(
        "record", help="record GPU metrics to a JSON file that JUPYTER_GPU_BACKEND=replay:FILE plays back",
        description="Record GPU metrics (from NVML, or the backend JUPYTER_GPU_BACKEND names) to FILE, so "
                    "behaviour seen on a real GPU can be replayed with JUPYTER_GPU_BACKEND=replay:FILE.")
    record.add_argument("file", metavar="FILE", help="the recording to write (replaced if it exists)")
    record.add_argument("--seconds", type=seconds_type("--seconds"), required=True, metavar="S",
                        help="how long to record")
    record.add_argument("--interval", type=interval_type("--interval"), default=1.0, metavar="I",
                        help="seconds between samples (default 1, at least 0.1)")
    record.add_argument("-q", "--quiet", action="store_true", help="print no progress and no summary")
    autoload = commands.add_parser(
        "autoload", help="check the GPU at every kernel start of this environment (on, off or status)",
        description="Make every new kernel of an environment check, in a background process, whether PyTorch "
                    "can use the GPU, and say so in one line on the first cell only when it cannot. Adds (or "
                    "removes) one marked block in the environment's etc/ipython/ipython_kernel_config.py and "
                    "keeps the rest of that file. JUPYTER_GPU_AUTOLOAD=0 silences it.")
    autoload.add_argument("action", choices=("on", "off", "status"), help="switch it on or off, or show it")
    autoload.add_argument("--prefix", metavar="DIR", default=None,
                          help="the environment whose kernels check (default: this one, sys.prefix)")
    autoload.add_argument("--watch", action="store_true",
                          help="with on: also keep the low-rate GPU sampler running in each kernel")
    add_allreduce_parser(commands)
    add_profile_parser(commands)
    return parser


def add_profile_parser(commands: argparse._SubParsersAction) -> None:
    from jupyter_gpu.gpuprofile.request import DEFAULT_STEPS, DEFAULT_WARMUP  # pure: the defaults the help quotes

    profile = commands.add_parser(
        "profile", help="profile a torchrun training script rank by rank (DDP)",
        description="Profile a distributed training run in every rank: each rank's step and buckets, the all-reduce "
                    "overlapped and exposed, the slowest rank and why, clocks, the classic DDP mistakes, and with "
                    "--scaling the scaling efficiency and what the lost part is made of. Usage: jupyter-gpu profile "
                    "[options] -- torchrun --nproc-per-node 2 train.py [args]")
    profile.add_argument("--steps", type=_whole_number("--steps", 1), default=DEFAULT_STEPS, metavar="N",
                         help=f"optimizer steps profiled in every rank (default {DEFAULT_STEPS})")
    profile.add_argument("--warmup", type=_whole_number("--warmup", 0), default=DEFAULT_WARMUP, metavar="K",
                         help=f"steps run first and not counted (default {DEFAULT_WARMUP})")
    profile.add_argument("--scaling", action="store_true",
                         help="also run with one process per node and report the scaling efficiency")
    profile.add_argument("--apply", action="store_true",
                         help="then run it again with the fixes that need no edit (no_sync for accumulation, "
                              "find_unused_parameters=False, gradient_as_bucket_view, bucket_cap_mb, a "
                              "DistributedSampler) where the first run found them, and show before and after")
    profile.add_argument("--timeout", type=seconds_type("--timeout"), default=120.0, metavar="S",
                         help="call the run hung when no rank finishes a step in S seconds (default 120)")
    profile.add_argument("--json", default=None, metavar="FILE", help="also write the profile as JSON to FILE")
    profile.add_argument("launch", nargs=argparse.REMAINDER, metavar="-- torchrun ...",
                         help="the torchrun command, after --")


def add_allreduce_parser(commands: argparse._SubParsersAction) -> None:
    from jupyter_gpu.distributed.collective import (  # pure and light: the defaults the help quotes
        DEFAULT_ITERATIONS,
        DEFAULT_TIMEOUT_S,
        SIZES_SYNTAX,
    )

    allreduce = commands.add_parser(
        "allreduce", help="run a checked all-reduce across the GPUs (NCCL) or CPU processes (gloo)",
        description="All-reduce float32 tensors of several sizes across one process per GPU with NCCL (or two "
                    "processes on the CPU with gloo), check every element of every result (#wrong, as nccl-tests "
                    "counts it), and report nccl-tests' algorithm and bus bandwidth (busbw = algbw x 2(n-1)/n) "
                    "with its share of the link's nominal peak. With NCCL and two GPUs or more it also copies a "
                    "tensor between every pair of GPUs and checks it (broken P2P can return zeros). The table "
                    "goes to stdout, progress to stderr; exit 0 when every result is correct, 1 when any element "
                    "was wrong or a rank failed or hung, 2 on a usage error.")
    allreduce.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto",
                           help="auto (default): NCCL with one process per GPU when torch has NCCL and sees a GPU, "
                                "else gloo with 2 processes on the CPU")
    allreduce.add_argument("--processes", type=_whole_number("--processes", 1), default=None, metavar="N",
                           help="ranks to start (default: one per GPU with NCCL, 2 with gloo)")
    allreduce.add_argument("--sizes", type=_sizes_type, default=None, metavar="SIZES",
                           help=f"bytes per all-reduce: {SIZES_SYNTAX}; K, M, G are powers of 1024 as in "
                                "nccl-tests, KB, MB, GB powers of 1000 (default 1K:16M:4)")
    allreduce.add_argument("--iterations", type=_whole_number("--iterations", 1), default=DEFAULT_ITERATIONS,
                           metavar="N", help=f"timed all-reduces per size; the median is reported "
                                             f"(default {DEFAULT_ITERATIONS})")
    allreduce.add_argument("--timeout", type=seconds_type("--timeout"), default=DEFAULT_TIMEOUT_S, metavar="S",
                           help=f"limit for the whole run; a hung rank is killed with every other "
                                f"(default {DEFAULT_TIMEOUT_S:g})")
    allreduce.add_argument("--json", action="store_true", help="print the result as JSON")
    allreduce.add_argument("-q", "--quiet", action="store_true", help="print nothing (use the exit status)")


def _sizes_type(text: str) -> list[int]:
    from jupyter_gpu.distributed.collective import parse_sizes

    try:
        return parse_sizes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        options = parser.parse_args(argv)
        if options.command is None:
            raise OptionsError("Name a command, for example: jupyter-gpu check.")
        if options.command == "check":
            validate(options)
        elif options.command == "autoload":
            _validate_autoload(options)
        elif options.command == "record":
            _validate_record(options)
    except OptionsError as exc:
        if str(exc) == "exit 0":  # --help printed its text
            return 0
        print(f"jupyter-gpu: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if options.command == "record":
        return run_record(options)
    if options.command == "autoload":
        return run_autoload(options)
    if options.command == "allreduce":
        return run_allreduce_command(options)
    if options.command == "profile":
        return run_profile_command(options)
    from jupyter_gpu.gpucheck.request import CheckRequest
    from jupyter_gpu.gpucheck.run import run_check  # deferred: `--help` and usage errors stay instant
    from jupyter_gpu.gpucheck.surface import TERMINAL

    if options.distributed:
        return run_check_distributed(options, CheckRequest.from_options(options))
    try:
        report = run_check(CheckRequest.from_options(options))
    except (OSError, ValueError) as exc:  # an unreadable --facts file or an unwritable --save path
        print(f"jupyter-gpu: {exc}", file=sys.stderr)
        return EXIT_USAGE
    # A terminal or a CI log reads it: `python -m pip`, no kernel to restart (gpucheck/surface.py).
    return _print_report(report.worded_for(TERMINAL), options)


def run_check_distributed(options: argparse.Namespace, request: CheckRequest) -> int:
    """`jupyter-gpu check --distributed [--bench]`: the report on stdout, the all-reduce's progress on stderr."""
    from jupyter_gpu.distributed.runner import check_distributed

    def progress(text: str) -> None:
        if text and not options.quiet:
            print(text, file=sys.stderr, flush=True)

    try:
        report = check_distributed(request, bench=options.bench, on_progress=progress)
    except (OSError, ValueError) as exc:
        print(f"jupyter-gpu: {exc}", file=sys.stderr)
        return EXIT_USAGE
    # A terminal reads it: `python -m pip`, `jupyter-gpu check`, no kernel (gpucheck/surface.py). The launch table's
    # "checked from a notebook: `%gpucheck --distributed` there" stays: those launches are only checked there.
    from dataclasses import replace

    from jupyter_gpu.gpucheck.surface import finding_for_terminal

    python = str(report.facts.get("python", {}).get("executable") or sys.executable)
    terminal = replace(report, findings=[finding_for_terminal(f, python) for f in report.findings])
    return _print_report(terminal, options)


def _print_report(report: GpuCheckReport | ReadinessReport, options: argparse.Namespace) -> int:
    if options.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
    elif not options.quiet:
        print(report)
    return report.exit_code


# -- profile -------------------------------------------------------------------------------------------


def run_profile_command(options: argparse.Namespace) -> int:
    """`jupyter-gpu profile -- torchrun ...`: the ranks' output and progress on stderr, the report on stdout; exit 0
    when the profile ran, 1 when a rank failed or the run hung, 2 for a command it cannot run."""
    from jupyter_gpu.ddpprofile.launch import LaunchError
    from jupyter_gpu.ddpprofile.runner import profile_torchrun

    launch = list(options.launch)
    if launch[:1] == ["--"]:
        launch = launch[1:]
    if not launch:
        print("jupyter-gpu: give the torchrun command after --, for example: jupyter-gpu profile -- torchrun "
              "--nproc-per-node 2 train.py", file=sys.stderr)
        return EXIT_USAGE

    def to_stderr(text: str) -> None:
        print(text.rstrip("\n"), file=sys.stderr, flush=True)

    try:
        profile = profile_torchrun(launch, steps=options.steps, warmup=options.warmup, with_scaling=options.scaling,
                                   apply=options.apply, hang_seconds=options.timeout, progress=None, output=to_stderr)
    except LaunchError as exc:
        print(f"jupyter-gpu: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("jupyter-gpu: Stopped (Ctrl-C); every rank was killed.", file=sys.stderr)
        return EXIT_INTERRUPTED
    if options.json:
        Path(options.json).write_text(json.dumps(profile.to_dict(), indent=2, default=str), encoding="utf-8")
    print(profile)
    return 0 if profile.ok else 1


# -- allreduce -----------------------------------------------------------------------------------------


def run_allreduce_command(options: argparse.Namespace) -> int:
    """`jupyter-gpu allreduce`: progress on stderr, the table (or JSON) on stdout, exit 0 only when all correct."""
    from jupyter_gpu.distributed.allreduce import AllReduceError, run_allreduce
    from jupyter_gpu.distributed.collective import DEFAULT_SIZES, DEFAULT_WARMUP

    def progress(text: str) -> None:
        if not options.quiet:
            print(text, file=sys.stderr, flush=True)

    try:
        result = run_allreduce(backend=options.backend, processes=options.processes,
                               sizes=options.sizes or list(DEFAULT_SIZES), iterations=options.iterations,
                               warmup=DEFAULT_WARMUP, timeout_s=options.timeout, peak=_link_peak(),
                               on_progress=progress)
    except ValueError as exc:  # a plan this machine cannot run, e.g. more NCCL processes than GPUs
        print(f"jupyter-gpu: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except AllReduceError as exc:
        print(f"jupyter-gpu: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("jupyter-gpu: Stopped (Ctrl-C); every rank was killed.", file=sys.stderr)
        return EXIT_INTERRUPTED
    if options.json:
        print(json.dumps(result.to_dict(), indent=2))
    elif not options.quiet:
        print(result)
    return result.exit_code


def _link_peak() -> LinkPeak | None:
    """The GPUs' link peak from NVML (or the simulated backend JUPYTER_GPU_BACKEND names); None when unknown."""
    from jupyter_gpu.distributed.nvml_topology import topology_for_backend

    return topology_for_backend().link_peak()


# -- record --------------------------------------------------------------------------------------------


def _validate_record(options: argparse.Namespace) -> None:
    # Checked before recording, so a typo in the folder does not cost the whole recording.
    folder = Path(options.file).parent
    if not folder.is_dir():
        raise OptionsError(f"Cannot write {options.file}: the folder {folder} does not exist.")
    if Path(options.file).is_dir():
        raise OptionsError(f"Cannot write {options.file}: it is a folder; name the recording's file.")


def run_record(options: argparse.Namespace) -> int:
    """`jupyter-gpu record FILE --seconds S`: record the selected backend, then write FILE atomically."""
    from jupyter_gpu.metrics.backends.base import BackendSpecError  # deferred: `--help` stays instant
    from jupyter_gpu.metrics.backends.select import select_backend
    from jupyter_gpu.metrics.recorder import NoDriverError, record
    from jupyter_gpu.metrics.recording import write_recording
    from jupyter_gpu.metrics.sample import Sample

    out = sys.stderr  # progress and messages: stdout stays empty, as for any recorder writing a file
    try:
        backend = select_backend()
    except BackendSpecError as exc:
        print(f"jupyter-gpu: {exc}", file=out)
        return EXIT_USAGE
    if backend.simulated:
        print(f"jupyter-gpu: recording {backend.name}, a simulated backend chosen by JUPYTER_GPU_BACKEND, "
              f"not a real GPU.", file=out)
    seconds = _format_seconds(options.seconds)
    started: list[float] = []  # the first sample's timestamp, once it has arrived

    def progress(sample: Sample) -> None:
        started[:] = started or [sample.timestamp]
        gpus = len(sample.devices)
        print(f"recording {_format_seconds(sample.timestamp - started[0])}/{seconds} s, "
              f"{gpus} GPU{'' if gpus == 1 else 's'}…", file=out, flush=True)

    try:
        recorded = record(backend, options.seconds, options.interval, on_sample=None if options.quiet else progress)
    except NoDriverError as exc:
        print(f"jupyter-gpu: {exc} Nothing was recorded.", file=out)
        return 1
    finally:
        backend.close()
    if not recorded.samples:
        print("jupyter-gpu: Stopped before the first sample; nothing was written.", file=out)
        return EXIT_INTERRUPTED
    try:
        write_recording(options.file, recorded.samples, options.interval, backend.name)
    except OSError as exc:
        print(f"jupyter-gpu: Cannot write {options.file}: {exc.strerror or exc}.", file=out)
        return EXIT_USAGE
    if not options.quiet:
        count = len(recorded.samples)
        gpus = recorded.gpu_count
        stopped = "Stopped early (Ctrl-C). " if recorded.interrupted else ""
        print(f"{stopped}Recorded {count} sample{'' if count == 1 else 's'} of {gpus} GPU{'' if gpus == 1 else 's'} "
              f"over {_format_seconds(recorded.span)} s to {options.file}", file=out)
    return 0


# -- autoload ------------------------------------------------------------------------------------------


def _validate_autoload(options: argparse.Namespace) -> None:
    if options.watch and options.action != "on":
        raise OptionsError(f"--watch is a setting of `autoload on`; `autoload {options.action}` takes no --watch.")


def run_autoload(options: argparse.Namespace) -> int:
    """`jupyter-gpu autoload on|off|status`: switch the start-up check of an environment's kernels."""
    from jupyter_gpu.autoload.config import SILENCE_VARIABLE, WATCH_INTERVAL_S, is_silenced
    from jupyter_gpu.autoload.install import AutoloadError, read_state, switch_off, switch_on

    prefix = options.prefix or sys.prefix
    try:
        if options.action == "status":
            path, state = read_state(prefix)
        else:
            change = switch_on(prefix, watch=options.watch) if options.action == "on" else switch_off(prefix)
            path, state = change.path, change.state
    except AutoloadError as exc:
        print(f"jupyter-gpu: {exc}", file=sys.stderr)
        return EXIT_USAGE
    interval = _format_seconds(WATCH_INTERVAL_S)
    if options.action == "status":
        print(f"autoload: {'on' if state.on else 'off'}")
        print(f"file: {path}{'' if path.exists() else ' (does not exist)'}")
        print(f"watch: {f'on (the GPU sampler runs every {interval} s in each kernel)' if state.watch else 'off'}")
        variable = os.environ.get(SILENCE_VARIABLE)
        if variable is None:
            print(f"{SILENCE_VARIABLE}: not set ({SILENCE_VARIABLE}=0 silences the check)")
        else:
            effect = "silences the check: kernels load the magics only" if is_silenced(os.environ) else \
                "does not silence the check (0 or off does)"
            print(f"{SILENCE_VARIABLE}={variable}: {effect}")
        return 0
    if options.action == "on":
        watching = f", and keeps the GPU sampler running every {interval} s" if state.watch else ""
        if change.changed:
            print(f"Autoload is on: every new kernel of {prefix} checks the GPU in the background{watching} "
                  f"({path}). Running kernels are not affected until restarted.")
        else:
            print(f"Autoload was already on{watching} ({path}); nothing changed.")
    elif not change.changed:
        print(f"Autoload was already off ({path}); nothing changed.")
    elif change.file_removed:
        print(f"Autoload is off: removed {path} (nothing else was in it).")
    else:
        print(f"Autoload is off: removed the jupyter-gpu block from {path}; the rest of it is unchanged.")
    return 0


def _format_seconds(value: float) -> str:
    """0.5 -> "0.5", 3.0 -> "3", 12.345 -> "12.3"."""
    text = f"{value:.1f}"
    return text.removesuffix(".0")


if __name__ == "__main__":
    sys.exit(main())
