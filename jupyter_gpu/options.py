"""The options of `%gpucheck` and `jupyter-gpu check`: one parser, so both take exactly the same flags."""

from __future__ import annotations

import argparse
import functools
import inspect
import math
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from jupyter_gpu.rendering.units import parse_bytes


class OptionsError(ValueError):
    """A bad option, as one sentence a user can act on."""


class HelpRequested(Exception):
    """-h or --help on a magic's line: a request, not an error; the magic shows its help instead of running."""


class SentenceParser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and calling sys.exit (fatal inside a kernel).

    Its help has a fixed width, so `%magic?` and `jupyter-gpu --help` read the same on every terminal.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _fixed_width_formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        sentence = message[0].upper() + message[1:].rstrip(".") + "."
        unrecognized = message.split(":", 1)[1].split() if message.startswith("unrecognized arguments:") else []
        if not self.add_help and {"-h", "--help"} & set(unrecognized):
            # A magic's help is its docstring, generated with this parser (help_from), which shows it.
            raise HelpRequested(self.prog)
        raise OptionsError(sentence)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise OptionsError((message or "").strip() or f"exit {status}")


def _fixed_width_formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.HelpFormatter(prog, width=110, max_help_position=30)


Documented = TypeVar("Documented", bound=Callable[..., Any])


def help_from(parser: Callable[[], argparse.ArgumentParser]) -> Callable[[Documented], Documented]:
    """A magic's `%magic?` help: its docstring's prose, then the usage and options of the parser it parses with;
    `%magic -h` or `--help` prints the same instead of running the magic.

    Generated from the parser, so the help can never leave out an option the magic accepts.
    """
    def document(function: Documented) -> Documented:
        prose = inspect.cleandoc(function.__doc__ or "")
        function.__doc__ = f"{prose}\n\n{parser().format_help().rstrip()}\n"

        @functools.wraps(function)
        def magic(*args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True  # IPython leaves this frame out of a cell error's traceback
            try:
                return function(*args, **kwargs)
            except HelpRequested:  # `%magic --help` shows what `%magic?` shows, instead of running
                print(function.__doc__)
                return None
        return magic  # type: ignore[return-value]
    return document


def add_check_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-v", "--verbose", action="store_true", help="also show every fact gathered")
    parser.add_argument("--json", action="store_true", help="print the report (with facts) as JSON")
    parser.add_argument("--save", metavar="FILE", help="write the facts snapshot to FILE (attach it to a bug report)")
    parser.add_argument("--facts", metavar="FILE", help="diagnose a saved snapshot instead of this machine")
    parser.add_argument("--root", metavar="DIR", help="read system files under DIR instead of / (tests, chroots)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing (use the result or exit status)")
    parser.add_argument("--refresh", action="store_true", help="probe torch again even if nothing changed")
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help="limit for the child process that imports torch (default 60)")
    parser.add_argument("--distributed", action="store_true",
                        help="check multi-GPU readiness instead: NCCL, the GPU topology, /dev/shm, torchrun and NCCL "
                             "variables, InfiniBand, and which launch methods work from here")
    parser.add_argument("--bench", action="store_true",
                        help="with --distributed: also run a checked all-reduce in child processes (NCCL across the "
                             "GPUs, else gloo on the CPU)")


def check_parser(prog: str, *, magic: bool) -> SentenceParser:
    parser = SentenceParser(prog=prog, add_help=not magic,
                            description="Is PyTorch really using the GPU, why not, and the exact fix.")
    add_check_options(parser)
    if magic:
        parser.add_argument("-o", dest="return_result", action="store_true",
                            help="return the GpuCheckReport (.status, .findings, .to_dict())")
        parser.add_argument("names", nargs="*", metavar="NAME", help="audit only these notebook variables")
    return parser


def validate(options: argparse.Namespace) -> None:
    if options.facts and options.root:
        raise OptionsError("--facts replays a saved snapshot, so --root cannot apply to it.")
    if options.timeout is not None and options.timeout <= 0:
        raise OptionsError("--timeout must be a positive number of seconds.")
    if options.bench and not options.distributed:
        raise OptionsError("--bench runs the all-reduce of the multi-GPU check: add --distributed.")
    if options.bench and options.facts:
        raise OptionsError("--bench measures this machine, so it cannot replay a saved snapshot (--facts).")
    if options.distributed and getattr(options, "names", None):
        raise OptionsError("--distributed checks the whole notebook; NAMEs only narrow the usual check.")


def gputime_parser(prog: str = "%gputime") -> SentenceParser:
    parser = SentenceParser(prog=prog, add_help=False,
                            usage="%%%(prog)s [options]  or  %(prog)s [options] STATEMENT",
                            description="Time a cell's GPU work correctly.")
    parser.add_argument("-n", dest="loops", metavar="N", type=_whole_number("-n", 1),
                        help="runs per repeat (each repeat's time is divided by N)")
    parser.add_argument("-r", dest="repeat", metavar="R", type=_whole_number("-r", 1),
                        help="repeats (default 1; 7 with --auto)")
    parser.add_argument("-w", dest="warmup", metavar="W", type=_whole_number("-w", 0), default=0,
                        help="warm-up runs, not counted")
    parser.add_argument("--auto", action="store_true",
                        help="choose N so the timed runs take about --budget seconds (default 2)")
    parser.add_argument("--budget", type=seconds_type("--budget"), default=None, metavar="SECONDS",
                        help="time to spend on timed runs with --auto (default 2)")
    parser.add_argument("--no-ops", dest="count_ops", action="store_false",
                        help="do not count operators (the first run then carries no counting cost)")
    parser.add_argument("-l", "--label", help="the name compare() shows for this result")
    add_result_options(parser, "return the GpuTimeResult (.times, .gpu_times, .median, .ops_by_device); with "
                               "%%%%gputime it is the cell's value, shown once")
    return parser


def validate_gputime(options: argparse.Namespace) -> None:
    if options.auto and options.loops is not None:
        raise OptionsError("--auto chooses the number of runs itself, so it cannot be combined with -n.")
    if options.budget is not None and not options.auto:
        raise OptionsError("--budget sets the time --auto may spend; add --auto or use -n/-r instead.")


def add_result_options(parser: argparse.ArgumentParser, returns: str) -> None:
    """-o (return the result object; `returns` says what it holds) and -q (print nothing), as every probe has them."""
    parser.add_argument("-o", dest="return_result", action="store_true", help=returns)
    parser.add_argument("-q", dest="quiet", action="store_true", help="print nothing")


def split_magic_line(line: str, parser: argparse.ArgumentParser) -> tuple[list[str], str]:
    """Split `-n 10 -r 3 x @ y` into the option tokens and the statement text, kept verbatim.

    Options come first; the statement starts at the first token that is neither an option nor an
    option's value (or after `--`). The statement is not shell-split, so `a - b` or quotes survive.
    Which options take a value is the parser's own knowledge, so a new option cannot be forgotten here.
    """
    value_flags = {flag for action in parser._actions if action.nargs != 0 for flag in action.option_strings}
    tokens: list[str] = []
    position = 0
    expecting_value = False
    while True:
        rest = line[position:]
        stripped = rest.lstrip()
        if not stripped:
            return tokens, ""
        start = position + len(rest) - len(stripped)
        end = start
        while end < len(line) and not line[end].isspace():
            end += 1
        token = line[start:end]
        if expecting_value:
            tokens.append(token)
            expecting_value = False
        elif token == "--":
            return tokens, line[end:].strip()
        elif token.startswith("-") and len(token) > 1 and not (token[1].isdigit() or token[1] in ".("):
            tokens.append(token)
            flag = token.split("=", 1)[0]
            expecting_value = flag in value_flags and "=" not in token  # `-n10` carries its own value
        else:
            return tokens, line[start:].strip()
        position = end


def _whole_number(flag: str, minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} needs a whole number, not {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{flag} must be at least {minimum}, not {value}")
        return value
    return parse


def seconds_type(flag: str) -> Callable[[str], float]:
    """An argparse type for a positive, finite number of seconds (magics and the command line)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} needs a number of seconds, not {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{flag} must be a positive number of seconds, not {text}")
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{flag} must be a finite number of seconds, not {text}")
        return value
    return parse


def batchprobe_parser(prog: str = "%batchprobe") -> SentenceParser:
    parser = SentenceParser(prog=prog, add_help=False, description="Find the largest batch size that fits.",
                            usage="%(prog)s STEP [options]  (STEP(batch_size) runs one training step)  or  "
                                  "%%%(prog)s [options]  (the cell body is the step; it reads `batch_size`)")
    parser.add_argument("--start", metavar="N", type=_whole_number("--start", 1), default=2,
                        help="first and smallest batch size tried (default 2: 1 breaks BatchNorm in training)")
    parser.add_argument("--max", dest="maximum", metavar="N", type=_whole_number("--max", 1), default=None,
                        help="largest batch size worth trying (default 65536)")
    parser.add_argument("--max-memory", type=_memory_size("--max-memory"), default=None, metavar="SIZE",
                        help="budget, e.g. 6GiB: a CUDA allocator cap, or on the CPU a count of live tensor bytes "
                             "(default: the device's free memory)")
    parser.add_argument("--margin", metavar="F", type=_fraction("--margin"), default=0.1,
                        help="share of the budget the recommendation keeps free (default 0.1)")
    parser.add_argument("--steps", metavar="K", type=_whole_number("--steps", 1), default=2,
                        help="steps per trial (default 2)")
    parser.add_argument("--max-seconds", type=seconds_type("--max-seconds"), default=None, metavar="S",
                        help="stop before a trial that would end more than S seconds after the start, and report "
                             "what ran and where the limit lies (default 300)")
    parser.add_argument("--amp", choices=("bf16", "fp16"), default=None, help="run the step under torch.autocast")
    parser.add_argument("--estimate", action="store_true",
                        help="predict with fake tensors, nothing run on a device (with --for)")
    parser.add_argument("--for", dest="memory_sizes", type=_memory_sizes, default=None, metavar="SIZES",
                        help="memory sizes for --estimate, e.g. 24GiB,80GiB")
    add_result_options(parser, "return the BatchProbeResult (.max_batch_size, .recommended, .trials)")
    parser.add_argument("names", nargs="*", metavar="STEP", help="the step function (line magic only)")
    return parser


def validate_batchprobe(options: argparse.Namespace) -> None:
    if options.maximum is not None and options.maximum < options.start:
        raise OptionsError(f"--max ({options.maximum}) must be at least --start ({options.start}).")
    if options.memory_sizes is not None and not options.estimate:
        raise OptionsError("--for names memory sizes for --estimate; add --estimate, or use --max-memory to "
                           "probe for real within one budget.")
    if options.estimate and options.memory_sizes is None and options.max_memory is None:
        raise OptionsError("--estimate needs the memory sizes to answer for, e.g. --for 24GiB,80GiB.")


def _memory_size(flag: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            return parse_bytes(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None  # argparse names the flag itself
    return parse


def _memory_sizes(text: str) -> list[int]:
    parse = _memory_size("--for")
    sizes = [parse(part) for part in text.split(",") if part.strip()]
    if not sizes:
        raise argparse.ArgumentTypeError("--for needs at least one memory size, e.g. --for 24GiB,80GiB")
    return sizes


def _fraction(flag: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"needs a fraction such as 0.1, not {text!r}") from None
        if not 0 <= value < 1:
            raise argparse.ArgumentTypeError(f"must be at least 0 and below 1 (0.1 keeps 10% free), not {text}")
        return value
    return parse


def gpupanel_parser(prog: str = "%gpupanel") -> SentenceParser:
    parser = SentenceParser(prog=prog, add_help=False, description="A live panel of every GPU.")
    parser.add_argument("--interval", type=interval_type("--interval"), default=1.0, metavar="SECONDS",
                        help="seconds between updates (default 1, at least 0.1)")
    parser.add_argument("--history", type=_whole_number("--history", 2), default=60, metavar="N",
                        help="samples kept in the sparklines (default 60)")
    parser.add_argument("--devices", type=_device_indices, default=None, metavar="LIST",
                        help="NVML indices to show, e.g. 0,2 or 0-3 (default: all)")
    parser.add_argument("--close", action="store_true", help="close every panel this kernel shows")
    parser.add_argument("-o", dest="return_result", action="store_true", help="return the panel widget")
    return parser


def interval_type(flag: str) -> Callable[[str], float]:
    """An argparse type for a sampling interval: seconds, at least the sampler's floor."""
    parse_positive = seconds_type(flag)

    def parse(text: str) -> float:
        from jupyter_gpu.metrics.sampler import MIN_INTERVAL

        value = parse_positive(text)
        if not MIN_INTERVAL <= value < math.inf:
            raise argparse.ArgumentTypeError(f"{flag} must be a number of seconds, at least {MIN_INTERVAL}, not {text}")
        return value

    return parse


def _number_list(flag: str, what: str) -> Callable[[str], tuple[int, ...]]:
    """An argparse type for '0,2,4-7' -> (0, 2, 4, 5, 6, 7): whole numbers, listed or as ranges."""
    def parse(text: str) -> tuple[int, ...]:
        numbers: set[int] = set()
        for part in text.split(","):
            low, dash, high = part.strip().partition("-")
            try:
                first = int(low)
                last = int(high) if dash else first
            except ValueError:
                raise argparse.ArgumentTypeError(f"{flag} takes {what} like 0,2 or 0-3, not {text!r}") from None
            if first < 0 or last < first:
                raise argparse.ArgumentTypeError(f"{flag} takes {what} like 0,2 or 0-3, not {text!r}")
            numbers.update(range(first, last + 1))
        return tuple(sorted(numbers))
    return parse


# NVML indices, as nvidia-smi numbers the GPUs.
_device_indices = _number_list("--devices", "GPU indices")


def dataprobe_parser(prog: str = "%dataprobe") -> SentenceParser:
    parser = SentenceParser(prog=prog, add_help=False,
                            description="Is the input pipeline starving the training step, and which DataLoader "
                                        "settings fix it, measured.",
                            usage="%(prog)s LOADER [--step STEP] [options]  (STEP(batch) runs one training step "
                                  "on a batch as LOADER yields it)")
    parser.add_argument("--step", metavar="STEP", default=None,
                        help="a function step(batch) that runs one training step: compares the loader with it")
    parser.add_argument("--workers", type=_number_list("--workers", "worker counts"), default=None, metavar="LIST",
                        help="num_workers values to try, e.g. 0,2,4 or 0-8 (default 0, 1, 2, 4, ... up to the "
                             "CPUs this process may use)")
    parser.add_argument("--seconds", type=seconds_type("--seconds"), default=60.0, metavar="S",
                        help="time budget for the whole probe (default 60)")
    add_result_options(parser, "return the DataProbeResult (.verdict, .recommended, .speedup, .trials)")
    parser.add_argument("names", nargs="*", metavar="LOADER", help="the DataLoader to probe")
    return parser


def _option_names(text: str) -> tuple[str, ...]:
    """An argparse type for '--try amp-bf16,compile': names from the speed-up catalogue, each once, in order."""
    from jupyter_gpu.speedprobe.catalog import OPTION_NAMES

    # torch spells channels_last and cudnn.benchmark: those spellings are taken too.
    names = tuple(dict.fromkeys(part.strip().replace("_", "-").replace(".", "-") for part in text.split(",")
                                if part.strip()))
    unknown = [name for name in names if name not in OPTION_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"--try takes option names separated by commas, such as amp-bf16,compile; "
                                         f"{(unknown or [text])[0]!r} is not one of {', '.join(OPTION_NAMES)}")
    return names


def speedprobe_parser(prog: str = "%speedprobe") -> SentenceParser:
    parser = SentenceParser(prog=prog, add_help=False,
                            description="What AMP, TF32, channels_last, cudnn.benchmark, fused optimizers and "
                                        "torch.compile buy on this training step, measured, with the numbers checked.",
                            usage="%(prog)s STEP [--try LIST] [--steps N] [-o] [-q]  (STEP() runs one training step: "
                                  "its own batch, forward, backward, optimizer step; it may return the loss)")
    from jupyter_gpu.speedprobe.catalog import OPTION_NAMES

    parser.add_argument("--try", dest="options", type=_option_names, default=None, metavar="LIST",
                        help="options to try, e.g. amp-bf16,fused-optimizer (default every one that applies: "
                             f"{', '.join(OPTION_NAMES)})")
    parser.add_argument("--steps", type=_whole_number("--steps", 1), default=20, metavar="N",
                        help="steps each configuration runs; their losses are compared with the baseline's "
                             "(default 20)")
    add_result_options(parser, "return the SpeedProbeResult (.baseline_seconds, .options, .best, .code())")
    parser.add_argument("names", nargs="*", metavar="STEP", help="the training step function")
    return parser


def gpumem_parser(prog: str = "%gpumem") -> SentenceParser:
    parser = SentenceParser(prog=prog, add_help=False,
                            description="Who holds the memory in this notebook, named by the path you would type, "
                                        "reconciled with the allocator; and giving it back without a restart.",
                            usage="%(prog)s [--device D] [--top N] [--free WHAT ...] [--watch [off]] [--history] "
                                  "[-o] [-q]")
    parser.add_argument("--device", default=None, metavar="D",
                        help="cpu, cuda, cuda:N or all (default: the CUDA devices if this kernel uses CUDA, else "
                             "the CPU)")
    parser.add_argument("--top", type=_whole_number("--top", 1), default=20, metavar="N",
                        help="rows the table shows, largest first (default 20); the rest are summed")
    parser.add_argument("--free", nargs="+", default=None, metavar="WHAT",
                        help="give memory back: outputs (Out, _, _N and the hidden _ %%reset out leaves), "
                             "traceback (what the last error keeps), cache (the allocator's cache), or variable "
                             "names (each with IPython's copies of it)")
    parser.add_argument("--watch", nargs="?", const="on", choices=["on", "off"], default=None,
                        help="record memory after every cell (--watch off stops)")
    parser.add_argument("--history", action="store_true",
                        help="per-cell growth since --watch, and the cells that keep growing")
    add_result_options(parser, "return the result (MemoryMap: .entries, .coverage, .remainders; or the release or "
                               "history report)")
    return parser


def gpucells_parser(prog: str = "%gpucells") -> SentenceParser:
    parser = SentenceParser(prog=prog, add_help=False, usage="%(prog)s [-n N] [-o] [-q]",
                            description="Which of your cells used the GPU, for how long, and how much memory: "
                                        "recorded after every cell since jupyter_gpu was loaded.")
    parser.add_argument("-n", dest="shown", type=_whole_number("-n", 1), default=10, metavar="N",
                        help="how many of the last cells to show (default 10)")
    add_result_options(parser, "return the log (CellLog: .rows, each with .flags; .to_dict())")
    return parser


def gpuprofile_parser(prog: str = "%%gpuprofile") -> SentenceParser:
    parser = SentenceParser(prog=prog, add_help=False,
                            usage="%%%%gpuprofile [options]  (on the training cell)  or  %%gpuprofile [options] "
                                  "train_one_epoch(...)",
                            description="Where each step of your own training loop goes, how far it is from the "
                                        "device's limit, and what to fix first.")
    parser.add_argument("--steps", type=_whole_number("--steps", 1), default=None, metavar="N",
                        help="optimizer steps to profile after the warm-up (default 20)")
    parser.add_argument("--warmup", type=_whole_number("--warmup", 0), default=5, metavar="K",
                        help="steps run first and shown apart: compilation, autotuning, workers starting (default 5)")
    parser.add_argument("--seconds", type=seconds_type("--seconds"), default=None, metavar="S",
                        help="profile for S seconds after the warm-up instead of N steps")
    parser.add_argument("--apply", action="store_true",
                        help="then run the loop again with the fixes that need no edit (checked by %%speedprobe and "
                             "%%dataprobe) and show before and after")
    parser.add_argument("--compile", action="store_true", help="with --apply, try torch.compile too")
    parser.add_argument("--data-seconds", type=seconds_type("--data-seconds"), default=None, metavar="S",
                        help="with --apply, how long %%dataprobe may measure DataLoader settings (default 10)")
    parser.add_argument("--keep", action="store_true",
                        help="keep what the steps did to the model, optimizer and RNGs (default: put back bitwise)")
    parser.add_argument("--nproc", type=_whole_number("--nproc", 1), default=None, metavar="N",
                        help="run the cell as a script in N processes (DDP over gloo or NCCL, as torchrun would) and "
                             "profile every rank; the cell holds its own imports and init_process_group()")
    parser.add_argument("--scaling", action="store_true",
                        help="with --nproc, also run it in one process: the scaling efficiency and what is lost")
    parser.add_argument("--timeout", type=seconds_type("--timeout"), default=None, metavar="S",
                        help="with --nproc, call the run hung when no rank finishes a step in S seconds (default 120)")
    add_result_options(parser, "return the ProfileResult (.steps, .breakdown, .syncs, .flops, .mfu, .plan, ...)")
    return parser


def validate_gpuprofile(options: argparse.Namespace) -> None:
    if options.steps is not None and options.seconds is not None:
        raise OptionsError("--steps and --seconds both say when to stop; give one of them.")
    if options.compile and not options.apply:
        raise OptionsError("--compile says what --apply may try; add --apply.")
    if options.data_seconds is not None and not options.apply:
        raise OptionsError("--data-seconds is how long --apply's %dataprobe may take; add --apply.")
    if options.apply and options.keep:
        raise OptionsError("--apply runs the loop twice from the same state, so it cannot --keep what the steps did.")
    if options.nproc is None and (options.scaling or options.timeout is not None):
        raise OptionsError(f"{'--scaling' if options.scaling else '--timeout'} is for a run in several processes; add "
                           "--nproc N.")
    if options.nproc is not None:
        for flag, given in (("--compile", options.compile), ("--data-seconds", options.data_seconds),
                            ("--keep", options.keep), ("--seconds", options.seconds)):
            if given:
                raise OptionsError(f"{flag} is not available with --nproc yet: each rank runs the cell as a script "
                                   "and stops after --warmup and --steps optimizer steps.")
