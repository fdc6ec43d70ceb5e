"""The package's version: the one place it lives (pyproject.toml and minisgl.__version__ read it)."""
__version__ = "0.1.0"
