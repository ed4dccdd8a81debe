"""The documentation's shape: one page per feature under docs/, every page with the same seven headings, every
option each magic and each `jupyter-gpu` command accepts on its page, a README that stays a front door (at most
15 KB, linking every page), and relative links and anchors that resolve.

The options come from the parsers the magics and the CLI parse with (as tests/magics/test_magic_help.py does for
`%magic?`), so an option added to a parser without its line on the page fails here.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_gpu import options
from jupyter_gpu.cli import build_parser
from jupyter_gpu.magics import MAGIC_NAMES

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
README_LIMIT_BYTES = 15 * 1024

FEATURE_PAGES = ("gpucheck", "gputime", "batchprobe", "dataprobe", "speedprobe", "gpumem", "gpuprofile", "gpucells",
                 "gpupanel", "side-panel", "distributed", "distributed-profile", "cli")
HEADINGS = ("The question it answers", "A real output", "Every option", "The result object", "What it never does",
            "Known limits", "Speed")
README_SECTIONS = ("Quick start", "Which question, which tool", "Install into your own Jupyter", "Requirements",
                   "Troubleshooting", "Speed", "Development", "License")
# Every `jupyter-gpu` command is documented on cli.md; these are also on their feature's page.
CLI_FEATURE_PAGES = {"check": ("gpucheck",), "allreduce": ("distributed",), "profile": ("distributed-profile",)}


# -- reading markdown ----------------------------------------------------------------------------------------

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"`([^`]+)`")  # may wrap onto the next line, as in markdown
LINK = re.compile(r"!?\[(?:[^\]\n]|\n(?!\n))*\]\(([^)\s]+)\)")


def page(name: str) -> Path:
    return DOCS / f"{name}.md"


def without_fences(text: str) -> str:
    return FENCE.sub("", text)


def h2_headings(text: str) -> list[str]:
    return re.findall(r"^## (.+?)[ \t]*$", without_fences(text), re.M)


def section(text: str, heading: str) -> str:
    """The text under `## heading`, up to the next `## ` heading outside a code block."""
    blanked = FENCE.sub(lambda block: re.sub(r"[^\n]", " ", block.group(0)), text)  # same offsets, no headings
    starts = list(re.finditer(r"^## (.+?)[ \t]*$", blanked, re.M))
    for index, match in enumerate(starts):
        if match.group(1) == heading:
            end = starts[index + 1].start() if index + 1 < len(starts) else len(text)
            return text[match.end():end]
    raise AssertionError(f"no '## {heading}' section")


def code_texts(text: str) -> list[str]:
    """Every piece of code in a markdown text: fenced blocks, then inline code spans."""
    blocks = [match.group(0) for match in FENCE.finditer(text)]
    return blocks + CODE_SPAN.findall(without_fences(text))


def shown_as_code(token: str, text: str) -> bool:
    """Whether `token` appears as a whole word (not inside `--max-memory` for `--max`) in the text's code."""
    word = re.compile(rf"(?<![\w-]){re.escape(token)}(?![\w-])")
    return any(word.search(code) for code in code_texts(text))


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} (.+?)[ \t]*$", without_fences(path.read_text()), re.M):
        slug = github_slug(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links(path: Path) -> Iterator[str]:
    text = CODE_SPAN.sub("", without_fences(path.read_text()))
    for target in LINK.findall(text):
        if not re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: are not checked here
            yield target


# -- what the code accepts -----------------------------------------------------------------------------------


def magic_parsers() -> dict[str, argparse.ArgumentParser]:
    """Every line magic `%load_ext jupyter_gpu` registers, with the parser it parses with.

    jupyter_gpu/options.py names each `<magic>_parser`; `%gpucheck` parses with the parser it shares with
    `jupyter-gpu check`, in its magic form (with -o and NAME).
    """
    parsers = {}
    for name in MAGIC_NAMES["line"]:
        if name == "gpucheck":
            parsers[name] = options.check_parser("%gpucheck", magic=True)
        else:
            factory = getattr(options, f"{name}_parser", None)
            assert factory is not None, f"%{name} has no {name}_parser in jupyter_gpu/options.py to read its options"
            parsers[name] = factory()
    return parsers


def cli_parsers() -> dict[str, argparse.ArgumentParser]:
    """Every `jupyter-gpu` command, with its argparse parser, as `jupyter-gpu --help` lists them."""
    commands = next(action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction))
    return dict(commands.choices)


def accepted(parser: argparse.ArgumentParser) -> list[str]:
    """What a user types: every option string (but -h/--help), each choice, and each positional's name."""
    tokens: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        tokens += action.option_strings
        if not action.option_strings and isinstance(action.metavar, str):
            tokens.append(action.metavar)
        tokens += [str(choice) for choice in action.choices or ()]
    return tokens


def missing_on(name: str, parser: argparse.ArgumentParser) -> list[str]:
    options_text = section(page(name).read_text(), "Every option")
    return [token for token in accepted(parser) if not shown_as_code(token, options_text)]


# -- the pages ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", FEATURE_PAGES)
def test_every_feature_page_has_the_same_seven_headings_in_order(name: str) -> None:
    assert page(name).is_file(), f"docs/{name}.md is missing"
    assert tuple(h2_headings(page(name).read_text())) == HEADINGS


@pytest.mark.parametrize("name", FEATURE_PAGES)
def test_every_feature_page_shows_a_real_output(name: str) -> None:
    # Output is a fenced block or a screenshot; the prose around it says where and how it was produced.
    output = section(page(name).read_text(), "A real output")
    assert FENCE.search(output) or re.search(r"!\[[^\]]*\]\([^)]+\.png\)", output)


def test_every_magic_has_a_page_and_the_cli_has_one() -> None:
    assert set(magic_parsers()) <= set(FEATURE_PAGES) and "cli" in FEATURE_PAGES


@pytest.mark.parametrize("name", sorted(MAGIC_NAMES["line"]))
def test_every_option_the_magic_accepts_is_on_its_page(name: str) -> None:
    parser = magic_parsers()[name]
    assert accepted(parser), f"%{name}'s parser lists no options: this test would check nothing"
    assert missing_on(name, parser) == []


@pytest.mark.parametrize("command", sorted(cli_parsers()))
def test_every_option_of_each_cli_command_is_on_its_pages(command: str) -> None:
    parser = cli_parsers()[command]
    assert accepted(parser)
    missing = {f"docs/{name}.md": missing_on(name, parser) for name in ("cli", *CLI_FEATURE_PAGES.get(command, ()))}
    assert {path: tokens for path, tokens in missing.items() if tokens} == {}


def test_every_cli_command_has_its_own_section_on_the_cli_page() -> None:
    text = page("cli").read_text()
    for command in cli_parsers():
        assert shown_as_code(f"jupyter-gpu {command}", text), command
    assert shown_as_code("--help", section(text, "Every option"))


def test_every_speedprobe_option_name_is_on_its_page() -> None:
    from jupyter_gpu.speedprobe.catalog import OPTION_NAMES

    options_text = section(page("speedprobe").read_text(), "Every option")
    assert [name for name in OPTION_NAMES if not shown_as_code(name, options_text)] == []


def test_the_option_check_fails_when_an_option_is_left_out() -> None:
    # The check above, on a page without one option: it must name what is missing.
    text = section(page("batchprobe").read_text(), "Every option")
    assert shown_as_code("--max", text) and shown_as_code("--max-memory", text)
    without = text.replace("`--margin F`", "the margin")
    assert not shown_as_code("--margin", without)
    assert not shown_as_code("--max", "`--max-memory SIZE`")


# -- the README -----------------------------------------------------------------------------------------------


def test_the_readme_is_at_most_15_kb() -> None:
    size = len(README.read_bytes())
    assert size <= README_LIMIT_BYTES, (f"README.md is {size:,} bytes, over {README_LIMIT_BYTES:,}: move the detail "
                                        f"to its page under docs/ and keep one table row")


def test_the_readme_sections_are_the_front_door_in_order() -> None:
    assert tuple(h2_headings(README.read_text())) == README_SECTIONS


def test_the_readme_links_every_feature_page() -> None:
    linked = {target.split("#")[0] for target in relative_links(README)}
    assert [name for name in FEATURE_PAGES if f"docs/{name}.md" not in linked] == []


def test_every_row_of_the_which_question_table_links_to_its_page() -> None:
    table = section(README.read_text(), "Which question, which tool")
    rows = [line for line in table.splitlines() if line.startswith("|")][2:]  # past the header and its rule
    assert rows
    assert [row for row in rows if not re.search(r"\]\(docs/[\w./-]+(#[\w-]+)?\)", row)] == []


def test_the_readme_starts_with_the_verdict_block() -> None:
    text = README.read_text()
    first_block = FENCE.search(text)
    assert first_block and text.index("## ") > first_block.start()
    assert "PyTorch is running on the CPU" in first_block.group(0)


# -- links ----------------------------------------------------------------------------------------------------


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda path: str(path.relative_to(ROOT)))
def test_relative_links_and_their_anchors_resolve(path: Path) -> None:
    broken = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with that anchor")
    assert broken == []


def test_the_slugs_are_github_s() -> None:
    assert github_slug("`%gpucheck --distributed` and `jupyter-gpu check --distributed`") == \
        "gpucheck---distributed-and-jupyter-gpu-check---distributed"
    assert github_slug("The side panel's server API against a per-client loop") == \
        "the-side-panels-server-api-against-a-per-client-loop"
    assert github_slug("`require_gpu()`") == "require_gpu"


def test_findings_page_gives_every_fix_kinds_preconditions_as_the_gate_holds_them():
    from jupyter_gpu.gpucheck.diagnose.fix_gate import FIX_KINDS

    page = (DOCS / "findings.md").read_text()
    for kind in FIX_KINDS:
        row = f"| {kind.name} | " + "; ".join(p.needs for p in kind.preconditions) + " |"
        assert row in page, f"docs/findings.md#fix-preconditions lacks or misstates: {row}"
