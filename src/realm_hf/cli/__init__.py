"""
`realm-hf`: the command-line interface of realm-hf.

Subcommands: `index` (build a corpus + FAISS index), `ask` (answer questions), `train` (Open-QA fine-tuning or
REALM pre-training from a config file), `evaluate` (EM, F1, recall@k), `convert` (legacy checkpoint to this format),
`push` (publish to the Hub) and `serve` (a web page and API). `realm-hf <command> --help` shows each command's options
and examples; the full reference is docs/cli.md.

Layout: the entry point and the parser live in the top-level modules `realm_hf_cli` (the console script
`realm-hf = realm_hf_cli:main`) and `realm_hf_cli_parser`, outside this package, so that `--help` imports neither torch nor transformers.
Here: one module per command (`index`, `ask`, `train` with its config file, `evaluate`, `convert`, `push`, `serve`;
each exposes `run(args) -> int`), `common` (what they share: running a parsed command and reporting errors, loading
models, atomic output directories) and `readers` (input files). The modules import nothing heavy at module level:
torch, transformers, datasets and faiss are imported by the command that runs.
"""

from realm_hf_cli import main

from .train_config import load_train_config

__all__ = ["load_train_config", "main"]
