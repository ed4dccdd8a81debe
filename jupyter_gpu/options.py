"""The options of `%gpucheck` and `jupyter-gpu check`: one parser, so both take exactly the same flags."""

from __future__ import annotations

import argparse
from typing import NoReturn


class OptionsError(ValueError):
    """A bad option, as one sentence a user can act on."""


class SentenceParser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and calling sys.exit (fatal inside a kernel)."""

    def error(self, message: str) -> NoReturn:
        raise OptionsError(message[0].upper() + message[1:].rstrip(".") + ".")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise OptionsError((message or "").strip() or f"exit {status}")


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


def check_parser(prog: str, *, magic: bool) -> SentenceParser:
    parser = SentenceParser(prog=prog, add_help=not magic,
                            description="Is PyTorch really using the GPU, why not, and the exact fix.")
    add_check_options(parser)
    if magic:
        parser.add_argument("-o", dest="return_result", action="store_true", help="return the GpuCheckReport")
        parser.add_argument("names", nargs="*", metavar="NAME", help="audit only these notebook variables")
    return parser


def validate(options: argparse.Namespace) -> None:
    if options.facts and options.root:
        raise OptionsError("--facts replays a saved snapshot, so --root cannot apply to it.")
    if options.timeout is not None and options.timeout <= 0:
        raise OptionsError("--timeout must be a positive number of seconds.")
