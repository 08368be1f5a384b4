"""Running a parsed `realm-hf` command: its settings, its module, and bad input turned into `error: ...` and status 2.

The entry point, `main`, parses the arguments in the top-level `realm_hf_cli` module (without torch, with the parser of
`realm_hf_cli_parser`) and calls [`run_command`] (`realm_hf.cli.main(argv)` is that entry point, re-exported by the
package). Named `running`, not `main`: a submodule `realm_hf.cli.main`, once imported, would replace the package's
`main` function with itself.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import traceback

from .common import EXIT_ERROR, State, library_progress_bars


def _command(name: str):
    # Only the chosen command's module is imported: the others stay unread.
    return importlib.import_module(f"{__package__}.commands.{name}")


def run_command(args: argparse.Namespace) -> int:
    """Run the command `args.command` with the parsed `args`. Returns the exit status (0 on success, 2 on bad input)."""
    State.quiet = bool(args.quiet)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s", stream=sys.stderr)
    try:
        with library_progress_bars(enabled=not State.quiet):
            return _command(args.command).run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, KeyError, ImportError) as err:
        if args.debug:
            traceback.print_exc()
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"error: {message}", file=sys.stderr)
        return EXIT_ERROR


__all__ = ["run_command"]
