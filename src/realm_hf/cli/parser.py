"""
The `realm-hf` argument parser, kept under its module name: it is defined in the top-level `realm_hf_cli_parser` module
so that `realm-hf --help` runs without importing torch (see that module's docstring).
"""

from realm_hf_cli_parser import build_parser

__all__ = ["build_parser"]
