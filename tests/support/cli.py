"""The `realm-hf` command line run in-process, quietly."""

from realm_hf.cli import main


def run(*argv):
    return main(["-q", *map(str, argv)])
