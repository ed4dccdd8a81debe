"""The jupyter_server extension behind the JupyterLab side panel; `extension` wires it (enabled on install)."""
