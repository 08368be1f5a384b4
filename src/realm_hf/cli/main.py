"""Entry point of `realm-hf`: parse the arguments, run the command, turn bad input into `error: ...` and status 2."""

from __future__ import annotations

import importlib
import logging
import sys
import traceback
from collections.abc import Sequence

from .common import EXIT_ERROR, State, library_progress_bars
from .parser import build_parser


def _command(name: str):
    # Only the chosen command's module is imported: the others stay unread.
    return importlib.import_module(f"{__package__}.commands.{name}")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `realm-hf`. Returns the exit status (0 on success, 2 on bad input)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help, --version and argparse's own usage errors
        return int(exit_.code or 0) if not isinstance(exit_.code, str) else EXIT_ERROR
    if getattr(args, "command", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_ERROR
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
