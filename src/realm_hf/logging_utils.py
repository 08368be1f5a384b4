"""realm-hf's loggers and warnings, governed by transformers' verbosity switch (`transformers.logging.set_verbosity_*`).

A Hugging Face user silences (or opens up) a run with one switch, `transformers.logging.set_verbosity_error()` or
`TRANSFORMERS_VERBOSITY=error`; realm-hf's messages are part of that run. Its loggers (`realm_hf.*`, from
[`get_logger`]) let a record through when its level reaches transformers' verbosity, unless a level was set on the
`realm_hf` logger (`logging.getLogger("realm_hf").setLevel(...)`) or on a module's logger, which then governs alone.
Records that pass go to your handlers as usual (`logging.basicConfig`, pytest's caplog, ...); without any handler
Python prints warnings and errors. Nothing global is changed at import: no handler, no root logger level.
"""

from __future__ import annotations

import logging
import warnings

#: The logger above every realm-hf logger: a level set on it overrides transformers' verbosity for realm-hf.
PACKAGE_LOGGER = "realm_hf"


# The level `get_logger` gives realm-hf's module loggers so that their records reach the filter, which then applies
# the verbosity; distinct from every named level, so that a level a user sets (DEBUG included) is told apart from it.
_OPEN = logging.DEBUG - 1


def verbosity(name: str = PACKAGE_LOGGER) -> int:
    """
    The level from which the records of realm-hf's logger `name` show: the first level set by hand on it or a logger
    above it up to `realm_hf` (e.g. `logging.getLogger("realm_hf").setLevel(logging.INFO)`), else transformers'
    verbosity.
    """
    while True:
        level = logging.getLogger(name).level
        if level not in (logging.NOTSET, _OPEN):
            return level
        if name == PACKAGE_LOGGER or "." not in name:
            break
        name = name.rsplit(".", 1)[0]
    # Imported here: light modules (`io/`, the CLI's) log through this module without importing transformers.
    from transformers.utils import logging as transformers_logging

    return transformers_logging.get_verbosity()


class _FollowVerbosity(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= verbosity(record.name)


_FILTER = _FollowVerbosity()


def get_logger(name: str) -> logging.Logger:
    """
    The logger `name` (a `realm_hf.*` module name) whose records follow [`verbosity`]: a plain `logging.getLogger`,
    as transformers' own `get_logger` is (without importing transformers here: light modules use it too), with a
    filter that applies the verbosity, and an open level (below `DEBUG`) so that `set_verbosity_info()` /
    `set_verbosity_debug()` reach it (the root logger's `WARNING` would stop the records first). A level you set on the
    logger yourself replaces the open one and governs it.
    """
    logger = logging.getLogger(name)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
        if logger.level == logging.NOTSET:
            logger.setLevel(_OPEN)
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
