"""The ``--log-level`` of the commands that run for long (``store run``, ``store train``), and the one rule they
share: HTTP clients, file locks and agent frameworks log a line per request or message at INFO or DEBUG, which is
noise below DEBUG."""

from __future__ import annotations

import enum
import logging

CHATTY_LOGGERS = (
    "httpx",
    "httpx2",
    "httpcore",
    "httpcore2",
    "urllib3",
    "filelock",
    "huggingface_hub",
    "autogen_core",
    "autogen_agentchat",
)
"""Libraries that log a line per HTTP request (httpx2 is the OpenAI SDK's), per file lock, or per message (AutoGen
logs every LLM call and every event of a run at INFO, as JSON)."""


class LogLevel(enum.StrEnum):
    """A ``--log-level`` value."""

    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"

    @property
    def number(self) -> int:
        return int(logging.getLevelName(self.value.upper()))


def quiet_chatty_loggers(level: int) -> None:
    """Below DEBUG, only the warnings of :data:`CHATTY_LOGGERS` are shown; at DEBUG, all they log."""
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if level <= logging.DEBUG else max(level, logging.WARNING))
