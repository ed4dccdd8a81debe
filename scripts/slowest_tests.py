"""Print the slowest tests of one `./dev test` run, read from the JUnit XML files its pytest runs wrote.

`./dev test` runs the suite in three pytest runs (the parallel part, the waiting lane beside it, then the timing
tests), so pytest's own `--durations` would print three lists; this prints one, each test's time being its setup,
call and teardown.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path


def slowest(paths: list[Path], count: int) -> list[tuple[float, str]]:
    found: list[tuple[float, str]] = []
    for path in paths:
        if not path.is_file():
            continue  # that run collected nothing or was stopped before writing its report
        for case in ElementTree.parse(path).iter("testcase"):
            # xunit1 reports (`-o junit_family=xunit1`) name the file: notebooks' cells have no module path.
            name = f"{case.get('file') or case.get('classname')}::{case.get('name')}"
            found.append((float(case.get("time") or 0.0), name))
    return sorted(found, reverse=True)[:count]


def main(argv: list[str]) -> int:
    count, paths = int(argv[0]), [Path(arg) for arg in argv[1:]]
    rows = slowest(paths, count)
    if rows:
        print(f"{f' slowest {len(rows)} tests (setup + call + teardown) ':=^100}")
        for seconds, name in rows:
            print(f"{seconds:7.2f}s  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
