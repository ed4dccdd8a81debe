"""What scripts/gpu-wheels.sh and scripts/gpu-check.sh do in Python: check the wheelhouse's requirements, gather the
machine's facts, read pytest's junit XML and write the GPU check's JSON summary.

    python3 scripts/gpu_support.py closure .whl --provided "jinja2 ..." --require "ipython>=8" ...
    python3 scripts/gpu_support.py installed --require "ipython>=8" ...
    python3 scripts/gpu_support.py facts
    python3 scripts/gpu_support.py summary WORK OUT_JSON --started EPOCH --budget SECONDS

Plain standard library (plus `packaging`, or pip's copy of it), so it runs on this machine's python3 and on the GPU
machine's, before anything from the wheelhouse is importable.
"""

from __future__ import annotations

import argparse
import email.parser
import json
import os
import platform
import re
import sys
import time
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.version import InvalidVersion, Version
except ImportError:  # a bare interpreter: pip always carries its own copy
    from pip._vendor.packaging.markers import default_environment  # type: ignore[no-redef]
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.version import InvalidVersion, Version  # type: ignore[no-redef]

# The GPU machine's interpreter (Python 3.12.3 on x86-64 Linux, KINDS.md): requirement markers are evaluated for it,
# not for whichever Python runs gpu-wheels.sh here.
TARGET_MARKERS = {
    "python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython",
    "implementation_version": "3.12.3", "platform_python_implementation": "CPython", "os_name": "posix",
    "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "platform_release": "",
    "platform_version": "",
}


def normalise(name: str) -> str:
    """PEP 503: `Jinja2`, `jinja2` and `jinja_2` name one project."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Distribution:
    """A wheel in the wheelhouse, or a distribution installed in this environment."""

    name: str  # normalised
    version: str
    requires: tuple[str, ...]
    where: str  # the wheel's file name, or "installed"


def read_wheel(path: Path) -> Distribution:
    with zipfile.ZipFile(path) as wheel:
        metadata = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        message = email.parser.BytesParser().parsebytes(wheel.read(metadata))
    return Distribution(normalise(message["Name"]), message["Version"], tuple(message.get_all("Requires-Dist") or ()),
                        path.name)


def read_wheelhouse(folder: Path) -> tuple[dict[str, Distribution], list[str]]:
    """The wheels by project name, and the problems: more than one version of a project stops the whole install."""
    found: dict[str, list[Distribution]] = {}
    for path in sorted(folder.glob("*.whl")):
        wheel = read_wheel(path)
        found.setdefault(wheel.name, []).append(wheel)
    problems = [f"{name}: {len(wheels)} wheels ({', '.join(w.where for w in wheels)}); keep one"
                for name, wheels in found.items() if len(wheels) > 1]
    return {name: wheels[0] for name, wheels in found.items()}, problems


def _applies(requirement: Requirement, extras: Iterable[str], markers: dict[str, str]) -> bool:
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({**markers, "extra": extra}) for extra in ("", *extras))


def _satisfies(version: str, requirement: Requirement) -> bool:
    try:
        return requirement.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def walk_requirements(top: Iterable[str], find: Callable[[str], Distribution | None], provided: set[str],
                      markers: dict[str, str]) -> tuple[set[str], set[str], list[str]]:
    """Follow `top` and every requirement of what satisfies it, extras included, as pip would resolve them.

    `find(name)` gives the distribution that satisfies a project name; a name in `provided` is the image's and is
    taken as satisfied without a version (its version is only known there: `installed` checks it). Returns the
    names `find` satisfied, the provided names asked for, and one line per requirement nothing satisfies.
    """
    reached: set[str] = set()
    from_image: set[str] = set()
    problems: list[str] = []
    seen: set[tuple[str, frozenset[str]]] = set()
    queue: list[tuple[Requirement, str]] = [(Requirement(text), "the GPU check") for text in top]
    while queue:
        requirement, wanted_by = queue.pop(0)
        name = normalise(requirement.name)
        extras = frozenset(normalise(extra) for extra in requirement.extras)
        found = find(name)
        if found is None:
            if name in provided:
                from_image.add(name)
            else:
                problems.append(f"{requirement} (wanted by {wanted_by}): not in the wheelhouse, not in the image")
            continue
        if not _satisfies(found.version, requirement):
            problems.append(f"{requirement} (wanted by {wanted_by}): {found.where} has {found.version}")
        reached.add(name)
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        for text in found.requires:
            needed = Requirement(text)
            if _applies(needed, extras, markers):
                queue.append((needed, f"{found.name} {found.version}"))
    return reached, from_image, problems


def closure(folder: Path, top: list[str], provided: set[str]) -> dict[str, Any]:
    """Here, before the GPU run: every requirement is met by one wheel or by the image, and every wheel is needed."""
    wheels, problems = read_wheelhouse(folder)
    # A wheel of a project the image has would shadow the image's copy (the target folder comes first on the path).
    problems += [f"{name}: the image has it; its wheel would shadow the image's copy"
                 for name in sorted(set(wheels) & provided)]
    reached, from_image, unmet = walk_requirements(
        top, lambda name: None if name in provided else wheels.get(name), provided, TARGET_MARKERS)
    problems += unmet
    problems += [f"{name}: {wheels[name].where} is not needed by anything" for name in sorted(set(wheels) - reached)]
    size = sum((folder / wheel.where).stat().st_size for wheel in wheels.values())
    return {"ok": not problems, "problems": problems, "wheels": len(wheels), "bytes": size,
            "from_image": sorted(from_image)}


def installed(top: list[str]) -> dict[str, Any]:
    """There, after the install: every requirement is met by what this interpreter imports, at a fitting version."""
    from importlib import metadata

    def find(name: str) -> Distribution | None:
        try:
            dist = metadata.distribution(name)  # the first on sys.path: the one `import` finds too
        except metadata.PackageNotFoundError:
            return None
        return Distribution(name, dist.version, tuple(dist.requires or ()), "installed")

    reached, _, problems = walk_requirements(top, find, set(), dict(default_environment()))
    return {"ok": not problems, "problems": problems, "distributions": len(reached)}


# -- the machine ------------------------------------------------------------------------------------------------


def machine_facts() -> dict[str, Any]:
    """What the summary says about the machine: Python, torch and its CUDA, the GPU, the driver, the runtime.

    Asking `torch.cuda.is_available()` here is harmless: this is a process of its own.
    """
    facts: dict[str, Any] = {"python": platform.python_version(), "executable": sys.executable,
                             "kernel": platform.release()}
    # gVisor reports a fixed 4.4.0 kernel: the runtime hides host PIDs from NVML's process lists there.
    facts["runtime"] = "gVisor" if platform.release() == "4.4.0" else None
    try:
        import torch
    except ImportError as exc:
        facts["torch"] = f"not importable: {exc}"
        return facts
    facts["torch"] = torch.__version__
    facts["torch_cuda"] = torch.version.cuda
    facts["cuda_available"] = torch.cuda.is_available()
    if facts["cuda_available"]:
        facts["devices"] = []
        for index in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(index)
            facts["devices"].append(f"{torch.cuda.get_device_name(index)} (sm_{major}{minor})")
    try:
        import pynvml

        pynvml.nvmlInit()
        facts["driver"] = pynvml.nvmlSystemGetDriverVersion()
        pynvml.nvmlShutdown()
    except Exception as exc:  # no driver, no library: the summary says so instead of stopping
        facts["driver"] = f"NVML: {exc}"
    return facts


# -- pytest's junit XML -----------------------------------------------------------------------------------------


def read_junit(path: Path) -> list[dict[str, Any]]:
    """One record per test case: its node id, outcome (passed, failed, error, skipped), seconds and message.

    pytest writes a collection failure as a test case whose classname is empty and whose name is the module.
    """
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        module = classname.replace(".", "/") + ".py" if classname else name.replace(".", "/") + ".py"
        outcome, message = "passed", ""
        # A failure and a teardown error on one case: the failure is the news.
        verdicts = {child.tag: child for child in case if child.tag in ("failure", "error", "skipped")}
        for tag, name_of in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            if tag in verdicts:
                child = verdicts[tag]
                lines = (child.get("message") or child.text or "").strip().splitlines()
                outcome, message = name_of, (lines[0][:300] if lines else "")
                break
        node = f"{module}::{name}" if classname else module
        collection = outcome == "error" and not classname
        cases.append({"id": node, "outcome": outcome, "seconds": round(float(case.get("time") or 0), 2),
                      "message": message, "collection_error": collection})
    return cases


def count(cases: Iterable[dict[str, Any]]) -> dict[str, int]:
    totals = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    for case in cases:
        totals[case["outcome"]] += 1
    return totals


# -- the summary ------------------------------------------------------------------------------------------------


def read_steps(path: Path) -> list[dict[str, Any]]:
    """gpu-check.sh's record of its steps: one tab-separated line each (name, status, rc, seconds, limit, output)."""
    steps = []
    for line in path.read_text().splitlines() if path.exists() else []:
        name, status, rc, seconds, limit, output = line.split("\t")
        steps.append({"name": name, "status": status, "rc": None if rc == "" else int(rc),
                      "seconds": float(seconds), "limit_s": int(limit), "output": output})
    return steps


def _first_lines(path: str, lines: int = 8) -> list[str]:
    if not path or not Path(path).exists():
        return []
    text = Path(path).read_text(errors="replace").splitlines()
    return [line[:300] for line in text[:lines]]


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def summarize(work: Path, started: float, budget: int) -> dict[str, Any]:
    steps = read_steps(work / "steps.tsv")
    summary: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "wall_s": round(time.time() - started, 1), "budget_s": budget,
        "machine": _load_json(work / "machine.json"),
        "wheelhouse": {"install": next(({k: s[k] for k in ("status", "rc", "seconds")} for s in steps
                                        if s["name"] == "install-wheels"), None),
                       "requirements": _load_json(work / "requirements.json")},
    }
    files = []
    cases: list[dict[str, Any]] = []
    for step in steps:
        if not step["name"].startswith("pytest:"):
            continue
        junit = work / "junit" / (step["name"].removeprefix("pytest:").replace("/", "__") + ".xml")
        found = read_junit(junit) if junit.exists() else []
        cases += found
        files.append({"file": step["name"].removeprefix("pytest:"), "status": step["status"], "rc": step["rc"],
                      "seconds": step["seconds"], "totals": count(found),
                      "note": None if found or step["status"] == "skipped" else
                      "no junit XML: pytest was stopped before it wrote one"})
    summary["tests"] = {"totals": count(cases), "collection_errors": sum(c["collection_error"] for c in cases),
                        "files": files, "cases": cases}
    summary["magics"] = _load_json(work / "magics.json")
    summary["trials"] = _load_json(work / "trials.json")  # scripts/gpu_trials.py writes the same format
    summary["cli"] = [{"command": step["name"].removeprefix("cli:"), "status": step["status"], "rc": step["rc"],
                       "seconds": step["seconds"], "first_lines": _first_lines(step["output"])}
                      for step in steps if step["name"].startswith("cli:")]
    summary["steps"] = [{k: s[k] for k in ("name", "status", "rc", "seconds", "limit_s")} for s in steps]
    return summary


def print_summary(summary: dict[str, Any]) -> None:
    """The few lines the device tool's output tail must show even if the files do not come back."""
    machine = summary.get("machine") or {}
    print(f"GPU check summary: {summary['wall_s']} s of {summary['budget_s']} s; python {machine.get('python')}, "
          f"torch {machine.get('torch')}, CUDA available: {machine.get('cuda_available')}, "
          f"devices: {machine.get('devices')}")
    requirements = (summary["wheelhouse"] or {}).get("requirements") or {}
    print(f"  wheelhouse: {summary['wheelhouse']['install']}; requirements met: {requirements.get('ok')} "
          f"{requirements.get('problems') or ''}")
    tests = summary["tests"]
    print(f"  tests: {tests['totals']}, collection errors: {tests['collection_errors']}")
    for file in tests["files"]:
        print(f"    {file['file']}: {file['status']} rc={file['rc']} {file['seconds']} s {file['totals']}"
              + (f" ({file['note']})" if file["note"] else ""))
    for case in tests["cases"]:
        if case["outcome"] in ("failed", "error"):
            print(f"    {case['outcome'].upper()} {case['id']}: {case['message']}")
    for kind in ("magics", "trials"):
        record = summary.get(kind) or {}
        print(f"  {kind} on {record.get('device')} ({record.get('gpu') or 'no GPU'})"
              + (f": {record['note']}" if record.get("note") else ""))
        for magic in record.get("magics", []):
            print(f"  {magic['magic']}: {magic['status']} ({magic['seconds']} s) {magic['headline']}")
    for cli in summary["cli"]:
        print(f"  {cli['command']}: {cli['status']} rc={cli['rc']}: {(cli['first_lines'] or [''])[0]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    closure_parser = commands.add_parser("closure", help="check the wheelhouse's requirements (here)")
    closure_parser.add_argument("folder", type=Path)
    closure_parser.add_argument("--provided", default="", help="the image's projects, separated by spaces")
    closure_parser.add_argument("--require", action="append", default=[], help="what the GPU check imports")
    closure_parser.add_argument("--pyproject", type=Path, help="also require this project's dependencies")
    installed_parser = commands.add_parser("installed", help="check the requirements in this environment (there)")
    installed_parser.add_argument("--require", action="append", default=[])
    installed_parser.add_argument("--pyproject", type=Path)
    installed_parser.add_argument("--json", type=Path, help="also write the result here")
    facts_parser = commands.add_parser("facts", help="print the machine's facts as JSON")
    facts_parser.add_argument("--json", type=Path, help="also write them here")
    summary_parser = commands.add_parser("summary", help="write the JSON summary from gpu-check.sh's work folder")
    summary_parser.add_argument("work", type=Path)
    summary_parser.add_argument("out", type=Path)
    summary_parser.add_argument("--started", type=float, required=True)
    summary_parser.add_argument("--budget", type=int, required=True)
    options = parser.parse_args(argv)

    if options.command == "facts":
        facts = machine_facts()
        print(json.dumps(facts, indent=1))
        if options.json is not None:
            options.json.write_text(json.dumps(facts) + "\n")
        return 0
    if options.command == "summary":
        summary = summarize(options.work, options.started, options.budget)
        options.out.write_text(json.dumps(summary, indent=1) + "\n")
        print_summary(summary)
        return 0
    top = list(options.require)
    if options.pyproject is not None:
        import tomllib

        top += tomllib.loads(options.pyproject.read_text())["project"]["dependencies"]
    if options.command == "closure":
        result = closure(options.folder, top, {normalise(name) for name in options.provided.split()})
    else:
        result = installed(top)
        if options.json is not None:
            options.json.write_text(json.dumps(result) + "\n")
    print(json.dumps(result, indent=1))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
