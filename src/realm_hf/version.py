"""
The version of realm-hf. A module of its own, below every package, so that what records the version (a saved
retriever's manifest, `realm-hf --version`) needs no import of the package root; `realm_hf.__version__` is this one.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
