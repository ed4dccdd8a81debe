"""The `jupyter-gpu` command line (also `python -m jupyter_gpu`)."""

from __future__ import annotations

import json
import sys

from jupyter_gpu.options import OptionsError, SentenceParser, add_check_options, validate

EXIT_USAGE = 2


def build_parser() -> SentenceParser:
    parser = SentenceParser(prog="jupyter-gpu", description="Is PyTorch really using the GPU?")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=SentenceParser)
    check = commands.add_parser("check", help="diagnose whether PyTorch can use a GPU here, and how to fix it")
    add_check_options(check)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        options = parser.parse_args(argv)
        if options.command is None:
            raise OptionsError("Name a command, for example: jupyter-gpu check.")
        validate(options)
    except OptionsError as exc:
        if str(exc) == "exit 0":  # --help printed its text
            return 0
        print(f"jupyter-gpu: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from jupyter_gpu.check import run_check  # deferred: `--help` and usage errors stay instant

    try:
        report = run_check(options)
    except (OSError, ValueError) as exc:  # an unreadable --facts file or an unwritable --save path
        print(f"jupyter-gpu: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if options.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
    elif not options.quiet:
        print(report)
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
