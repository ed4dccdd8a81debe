"""A real IPython shell with the extension loaded, as a notebook kernel would run it."""

from __future__ import annotations

import pytest
from IPython.core.interactiveshell import InteractiveShell


@pytest.fixture(scope="module")
def shell(shell: InteractiveShell) -> InteractiveShell:
    # The global test shell (tests/conftest.py). A notebook kernel asks for HTML too; the terminal test shell
    # only formats text unless told.
    if "text/html" not in shell.display_formatter.active_types:
        shell.display_formatter.active_types.append("text/html")
    shell.display_formatter.formatters["text/html"].enabled = True
    return shell


