"""The `realm-hf` subcommands, one module each; each exposes `run(args) -> int`."""
