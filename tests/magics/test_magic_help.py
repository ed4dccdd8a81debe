"""`%magic?` shows help generated from the parser the magic parses with, so no accepted option goes unlisted."""

from __future__ import annotations

import pytest

from jupyter_gpu.options import (
    batchprobe_parser,
    check_parser,
    dataprobe_parser,
    gpucells_parser,
    gpumem_parser,
    gpupanel_parser,
    gpuprofile_parser,
    gputime_parser,
    speedprobe_parser,
)

PARSERS = {
    "gpucheck": lambda: check_parser("%gpucheck", magic=True),
    "gputime": gputime_parser,
    "batchprobe": batchprobe_parser,
    "gpupanel": gpupanel_parser,
    "dataprobe": dataprobe_parser,
    "speedprobe": speedprobe_parser,
    "gpumem": gpumem_parser,
    "gpucells": gpucells_parser,
    "gpuprofile": gpuprofile_parser,
}


def shown_help(ip, name: str) -> str:
    # What `%gpucheck?` pages in a notebook: IPython's inspector on the registered magic.
    return ip.object_inspect(f"%{name}")["docstring"]


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_every_option_the_magic_accepts_is_in_its_help(ip, name: str) -> None:
    help_text = shown_help(ip, name)
    flags = [flag for action in PARSERS[name]()._actions for flag in action.option_strings]
    assert flags and [flag for flag in flags if flag not in help_text] == []


def test_gpucheck_help_lists_timeout_which_it_accepts(ip) -> None:
    help_text = shown_help(ip, "gpucheck")
    assert "--timeout SECONDS" in help_text and "limit for the child process that imports torch" in help_text
    assert help_text.startswith("Is PyTorch in this kernel really able to use the GPU?")


def test_the_cell_and_line_forms_are_both_in_the_usage(ip) -> None:
    assert "%%gputime [options]  or  %gputime [options] STATEMENT" in shown_help(ip, "gputime")
    usage = shown_help(ip, "batchprobe")
    assert "%batchprobe STEP [options]" in usage and "%%batchprobe [options]" in usage


@pytest.mark.parametrize("name", sorted(PARSERS))
@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_asking_a_magic_for_help_with_a_flag_shows_its_help_and_runs_nothing(ip, name: str, flag: str) -> None:
    from IPython.utils.capture import capture_output

    with capture_output() as captured:
        returned = ip.run_line_magic(name, flag)
    assert returned is None
    assert captured.stdout.strip() == shown_help(ip, name).strip()  # what `%magic?` shows


def test_help_on_a_cell_magic_runs_no_cell(ip) -> None:
    from IPython.utils.capture import capture_output

    with capture_output() as captured:
        ip.run_cell_magic("gputime", "--help", "raise SystemExit('the cell ran')")
    assert "%%gputime [options]" in captured.stdout
