"""docker/Dockerfile, checked on paper: there is no container engine here.

A small parser reads the Dockerfile's instructions; they are checked against the run line documented in
docs/containers.md, the package's entry points in pyproject.toml and the real `jupyter-gpu` parser.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from jupyter_gpu.cli import build_parser
from jupyter_gpu.facts.context import DEFAULT_PROBE_TIMEOUT_S
from jupyter_gpu.options import OptionsError

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
DOCS = ROOT / "docs" / "containers.md"
KNOWN = {"FROM", "ARG", "RUN", "ENV", "USER", "EXPOSE", "HEALTHCHECK", "COPY"}
SHELL_OPERATORS = {"&&", "||", ";", "|", ">", ">>", "<", "2>", "2>&1"}
DURATION = re.compile(r"^(\d+)(s|m|h)$")


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str
    line: int  # where it starts, for messages


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions with their continuation lines joined; comment lines are dropped, also inside continuations
    (as Docker does)."""
    instructions: list[Instruction] = []
    parts: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not parts):
            continue
        if not parts:
            start = number
        continued = stripped.endswith("\\")
        parts.append(stripped[:-1].strip() if continued else stripped)
        if not continued:
            keyword, _, arguments = " ".join(p for p in parts if p).partition(" ")
            instructions.append(Instruction(keyword.upper(), arguments.strip(), start))
            parts = []
    assert not parts, "the Dockerfile ends inside a line continuation"
    return instructions


def flags(arguments: str) -> tuple[dict[str, str], str]:
    """`--interval=5m --timeout=90s CMD ...` -> ({"interval": "5m", "timeout": "90s"}, "CMD ...")."""
    found = {}
    rest = arguments
    while match := re.match(r"--([\w-]+)=(\S+)\s+", rest):
        found[match.group(1)] = match.group(2)
        rest = rest[match.end():]
    return found, rest


def substitute(text: str, values: dict[str, str]) -> str:
    """${NAME}, ${NAME:-default} and $NAME as Docker expands them from ARG and ENV."""
    def value(match: re.Match) -> str:
        name, default = match.group(1) or match.group(3), match.group(2)
        return values.get(name, default if default is not None else match.group(0))
    return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)", value, text)


def commands(shell: str) -> list[list[str]]:
    """The simple commands of a shell line: `a x && b > f || exit 1` -> [["a", "x"], ["b"], ["exit", "1"]]."""
    lexer = shlex.shlex(shell, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    result: list[list[str]] = [[]]
    redirected = False
    for token in lexer:
        if token in SHELL_OPERATORS:
            redirected = token in (">", ">>", "<", "2>")
            if not redirected:
                result.append([])
            continue
        if redirected:  # the redirection's target, not an argument
            redirected = False
            continue
        result[-1].append(token)
    return [c for c in result if c]


def seconds(duration: str) -> int:
    match = DURATION.match(duration)
    assert match, f"not a Docker duration: {duration}"
    return int(match.group(1)) * {"s": 1, "m": 60, "h": 3600}[match.group(2)]


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    return parse_dockerfile(DOCKERFILE.read_text())


def of(instructions: list[Instruction], keyword: str) -> list[Instruction]:
    return [i for i in instructions if i.keyword == keyword]


def run_commands(instructions: list[Instruction]) -> list[list[str]]:
    return [c for i in of(instructions, "RUN") for c in commands(i.arguments)]


@pytest.fixture(scope="module")
def run_line() -> list[str]:
    """The documented `docker run ... --gpus all ...` line of docs/containers.md, as arguments."""
    text = DOCS.read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("docker run ")]
    full = [line for line in lines if "--gpus all" in line and "-p " in line]
    assert len(full) == 1, full
    return shlex.split(full[0])


def documented_build_tag() -> str:
    match = re.search(r"^docker build -f (\S+) -t (\S+) \.$", DOCS.read_text(), re.M)
    assert match and (ROOT / match.group(1)) == DOCKERFILE
    return match.group(2)


# --- the parser itself ----------------------------------------------------------------------------------


def test_the_parser_joins_continuations_and_skips_comments():
    text = ("# a comment\nARG BASE=img:1\nFROM ${BASE}\n\nRUN a && \\\n    # inside\n    b \\\n    c\n"
            "HEALTHCHECK --interval=5m CMD x --y || exit 1\n")
    parsed = parse_dockerfile(text)
    assert [(i.keyword, i.arguments, i.line) for i in parsed] == [
        ("ARG", "BASE=img:1", 2), ("FROM", "${BASE}", 3), ("RUN", "a && b c", 5),
        ("HEALTHCHECK", "--interval=5m CMD x --y || exit 1", 9),
    ]
    assert flags(parsed[3].arguments) == ({"interval": "5m"}, "CMD x --y || exit 1")
    assert commands("x --y > /tmp/f || exit 1") == [["x", "--y"], ["exit", "1"]]
    assert substitute("${BASE} $U ${V:-d}", {"BASE": "img:1", "U": "u"}) == "img:1 u d"


def test_only_known_instructions(instructions):
    assert instructions and {i.keyword for i in instructions} <= KNOWN, [i.keyword for i in instructions]


# --- the image ------------------------------------------------------------------------------------------


def test_the_base_is_a_pinned_jupyter_pytorch_cuda_image(instructions):
    assert instructions[0].keyword == "ARG" and instructions[1].keyword == "FROM"
    args = dict(i.arguments.split("=", 1) for i in of(instructions, "ARG") if "=" in i.arguments)
    (base,) = [substitute(i.arguments, args) for i in of(instructions, "FROM")]
    image, _, tag = base.rpartition(":")
    assert image == "quay.io/jupyter/pytorch-notebook"
    assert re.fullmatch(r"cuda1[2-9]-\d{4}-\d{2}-\d{2}", tag), f"{tag} is not a pinned date tag"
    assert "latest" not in base


def test_the_final_user_is_not_root(instructions):
    users = of(instructions, "USER")
    assert users, "the image must say which user it runs as"
    last = users[-1].arguments.split(":")[0]
    assert last not in ("root", "0", "")
    # Docker Stacks' ${NB_UID} is 1000 (jovyan); a literal must be a non-root name or uid.
    assert last == "${NB_UID}" or re.fullmatch(r"[1-9]\d*|[a-z_][a-z0-9_-]*", last)
    # Nothing is installed as root after it: every RUN comes after the first USER.
    assert users[0].line < min(i.line for i in of(instructions, "RUN"))


def test_jupyter_gpu_is_installed_from_the_wheel_without_node(instructions):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (copy,) = of(instructions, "COPY")
    _, rest = flags(copy.arguments)
    source, target = rest.split()
    wheel = f"{project['name'].replace('-', '_')}-"
    assert source == "dist/*.whl"  # what the documented `pip wheel -w dist .` writes
    installs = [c for c in run_commands(instructions) if c[:2] == ["pip", "install"]]
    assert any("--no-cache-dir" in c and any(a.startswith(target + wheel) for a in c) for c in installs), installs
    build_step = "pip wheel --no-deps -w dist ."
    assert build_step in DOCS.read_text() and build_step in DOCKERFILE.read_text()
    used = {c[0] for c in run_commands(instructions)}
    assert not used & {"node", "npm", "npx", "yarn", "jlpm"}


def jupyter_gpu_calls(instructions: list[Instruction], entry_point: str) -> list[list[str]]:
    return [c[1:] for c in run_commands(instructions) if c[0] == entry_point]


def test_autoload_is_switched_on_with_the_real_subcommand(instructions):
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["jupyter-gpu"] == "jupyter_gpu.cli:main"
    calls = jupyter_gpu_calls(instructions, "jupyter-gpu")
    parsed = []
    for call in calls:
        try:
            parsed.append(build_parser().parse_args(call))
        except OptionsError as exc:
            pytest.fail(f"`jupyter-gpu {' '.join(call)}` in the Dockerfile is not a real command: {exc}")
    assert any(p.command == "autoload" and p.action == "on" for p in parsed), calls


def test_the_environment_keeps_cuda_out_of_forked_workers(instructions):
    env = dict(i.arguments.split("=", 1) for i in of(instructions, "ENV"))
    assert env.get("PYTORCH_NVML_BASED_CUDA_CHECK") == "1"


def test_the_healthcheck_is_a_real_jupyter_gpu_check(instructions):
    (health,) = of(instructions, "HEALTHCHECK")
    options, rest = flags(health.arguments)
    form, _, shell = rest.partition(" ")
    assert form == "CMD"
    first, *others = commands(shell)
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert first[0] in scripts
    parsed = build_parser().parse_args(first[1:])
    assert parsed.command == "check" and parsed.json
    # Docker reads exit status 2 as reserved; jupyter-gpu exits 2 on a usage error, so it is mapped to 1.
    assert others == [["exit", "1"]]
    # The check imports torch in a child that may take DEFAULT_PROBE_TIMEOUT_S: Docker must wait longer.
    limit = parsed.timeout if parsed.timeout is not None else DEFAULT_PROBE_TIMEOUT_S
    assert seconds(options["timeout"]) > limit


# --- the documented run line -----------------------------------------------------------------------------


def test_the_run_line_publishes_the_exposed_port_of_the_documented_image(instructions, run_line):
    (expose,) = of(instructions, "EXPOSE")
    container_port = expose.arguments.split("/")[0]
    ports = [run_line[i + 1] for i, a in enumerate(run_line) if a == "-p"]
    assert [p.split(":")[-1] for p in ports] == [container_port]
    assert run_line[-1] == documented_build_tag()


def test_the_run_line_has_the_gpus_shared_memory_and_the_users_home(run_line):
    assert run_line[:2] == ["docker", "run"] and "--gpus" in run_line
    assert run_line[run_line.index("--gpus") + 1] == "all"
    shm = [a for a in run_line if a.startswith("--shm-size=")]
    assert shm and re.fullmatch(r"--shm-size=\d+g", shm[0])
    mounts = [run_line[i + 1] for i, a in enumerate(run_line) if a == "-v"]
    assert mounts and all(m.split(":")[1].startswith("/home/jovyan/") for m in mounts)
