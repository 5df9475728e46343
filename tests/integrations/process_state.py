"""Undo what a library changes in the whole process on import: logging and `warnings.warn`.

praisonaiagents, on import, adds a handler to the root logger, sets a dozen loggers
(httpx, openai, pydantic, …) to CRITICAL and replaces `warnings.warn`; left alone, that
changes what every later test in the session sees (it also adds warning filters).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class _LoggerState:
    level: int
    handlers: tuple[logging.Handler, ...]
    disabled: bool
    propagate: bool


def _loggers() -> dict[str, logging.Logger]:
    loggers = {
        name: logger
        for name, logger in logging.Logger.manager.loggerDict.items()
        if isinstance(logger, logging.Logger)
    }
    loggers[""] = logging.getLogger()
    return loggers


def _state(logger: logging.Logger) -> _LoggerState:
    return _LoggerState(logger.level, tuple(logger.handlers), logger.disabled, logger.propagate)


_UNTOUCHED = _LoggerState(logging.NOTSET, (), False, True)


@contextmanager
def process_state_kept() -> Iterator[None]:
    """Put logging and `warnings.warn` back as they were when the block began."""
    before = {name: _state(logger) for name, logger in _loggers().items()}
    warn, disable = warnings.warn, logging.root.manager.disable
    try:
        with warnings.catch_warnings():  # puts the filters back
            yield
    finally:
        for name, logger in _loggers().items():
            state = before.get(name, _UNTOUCHED)
            logger.setLevel(state.level)
            logger.handlers[:] = state.handlers
            logger.disabled = state.disabled
            logger.propagate = state.propagate
        warnings.warn = warn
        logging.disable(disable)
