"""The live ipywidgets panel of `%gpupanel` (plain ipywidgets: JupyterLab, Notebook 7 and VS Code)."""
