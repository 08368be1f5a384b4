"""The `realm-hf` command line run in-process, quietly."""

from realm_hf.cli import main


def run(*argv):
    return main(["-q", *map(str, argv)])


QUESTIONS = ["what is the capital of france?", "which country is paris in?", "where is the capital of england?"]
