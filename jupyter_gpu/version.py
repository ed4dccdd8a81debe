"""The package version, apart from the package API so any module can read it without importing that API."""

__version__ = "0.1.0"
