"""The option parsers shared by the magics and the CLI (here `%%gputime`'s)."""

from __future__ import annotations

import pytest

from jupyter_gpu.options import (
    OptionsError,
    gputime_parser,
    split_magic_line,
    validate_gputime,
)


@pytest.mark.parametrize(("line", "tokens", "statement"), [
    ("-n 10 -r 3 x = a - b", ["-n", "10", "-r", "3"], "x = a - b"),
    ("-n 3 -- -x + 1", ["-n", "3"], "-x + 1"),
    ("-n10 -q y = f(x)", ["-n10", "-q"], "y = f(x)"),
    ("-1 + x", [], "-1 + x"),
    ("-n 2 -.5 * x", ["-n", "2"], "-.5 * x"),
    ("-l fast model(x)", ["-l", "fast"], "model(x)"),
    ("--label=fast model(x)", ["--label=fast"], "model(x)"),
    ("-o print('a  -n 3',  \"b\")", ["-o"], "print('a  -n 3',  \"b\")"),
    ("  x @ y  ", [], "x @ y"),
    ("-n 5 -o", ["-n", "5", "-o"], ""),
    ("", [], ""),
])
def test_split_magic_line(line: str, tokens: list[str], statement: str) -> None:
    assert split_magic_line(line, gputime_parser()) == (tokens, statement)


def parse(*argv: str) -> object:
    options = gputime_parser().parse_args(list(argv))
    validate_gputime(options)
    return options


def test_parser_reads_flags() -> None:
    options = parse("-n", "10", "-r", "3", "-w", "2", "-l", "fast", "-o", "--no-ops")
    assert (options.loops, options.repeat, options.warmup, options.label) == (10, 3, 2, "fast")
    assert options.return_result and not options.count_ops


def test_parser_reads_attached_value() -> None:
    assert parse("-n10").loops == 10


def test_auto_with_budget() -> None:
    options = parse("--auto", "--budget", "0.5")
    assert options.auto and options.budget == 0.5


@pytest.mark.parametrize(("argv", "message"), [
    (["-n", "0"], "-n must be at least 1"),
    (["-r", "0"], "-r must be at least 1"),
    (["-w", "-1"], "-w must be at least 0"),
    (["-n", "ten"], "-n needs a whole number"),
    (["--auto", "--budget", "0"], "--budget must be a positive number"),
    (["--budget", "2"], "add --auto"),
    (["--auto", "-n", "5"], "cannot be combined with -n"),
    (["--bogus"], "nrecognized arguments"),
])
def test_bad_options_raise(argv: list[str], message: str) -> None:
    with pytest.raises(OptionsError, match=message):
        parse(*argv)
