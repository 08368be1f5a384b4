"""realm-hf's loggers and warnings, governed by transformers' verbosity switch (`transformers.logging.set_verbosity_*`).

A Hugging Face user silences (or opens up) a run with one switch, `transformers.logging.set_verbosity_error()` or
`TRANSFORMERS_VERBOSITY=error`; realm-hf's messages are part of that run. Its loggers (`realm_hf.*`, from
[`get_logger`]) let a record through when its level reaches transformers' verbosity, unless a level was set on the
`realm_hf` logger itself (`logging.getLogger("realm_hf").setLevel(...)`), which then governs realm-hf alone. Records
that pass go to your handlers as usual (`logging.basicConfig`, pytest's caplog, ...); without any handler Python prints
warnings and errors. Nothing global is changed at import: no handler, no root logger level.
"""

from __future__ import annotations

import logging
import warnings

#: The logger above every realm-hf logger: a level set on it overrides transformers' verbosity for realm-hf.
PACKAGE_LOGGER = "realm_hf"


def verbosity() -> int:
    """The level from which realm-hf's records show: the `realm_hf` logger's own level if set, else transformers'."""
    own = logging.getLogger(PACKAGE_LOGGER).level
    if own != logging.NOTSET:
        return own
    # Imported here: light modules (file_utils, the CLI's) log through this module without importing transformers.
    from transformers.utils import logging as transformers_logging

    return transformers_logging.get_verbosity()


class _FollowVerbosity(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= verbosity()


_FILTER = _FollowVerbosity()


def get_logger(name: str) -> logging.Logger:
    """
    The logger `name` (a `realm_hf.*` module name) whose records follow [`verbosity`] (a plain `logging.getLogger`,
    as transformers' own `get_logger` is, without importing transformers here: light modules use it too). Its own level is set to `DEBUG` so that `set_verbosity_info()` / `set_verbosity_debug()` reach it
    (the root logger's `WARNING` would stop them first); the filter then applies the verbosity. A level you set on the
    module logger itself is kept.
    """
    logger = logging.getLogger(name)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.DEBUG)
    return logger


def warn(message: str, category: type[Warning] = UserWarning, stacklevel: int = 2) -> None:
    """
    `warnings.warn`, unless realm-hf's [`verbosity`] is above `WARNING` (e.g. after
    `transformers.logging.set_verbosity_error()`); `stacklevel` counts from the caller of this function.
    """
    if verbosity() > logging.WARNING:
        return
    warnings.warn(message, category, stacklevel=stacklevel + 1)


__all__ = ["PACKAGE_LOGGER", "get_logger", "verbosity", "warn"]
