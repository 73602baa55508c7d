"""Log setup: every line one JSON object (``log_format = "json"``) or plain text for a terminal.

Structured fields travel on the record as ``extra={"fields": {...}}`` (the access log does this), so
the JSON formatter emits them as top-level keys and the text formatter as ``key=value`` pairs. No
caller ever passes request text or credentials here: the access log carries the content key.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any, TextIO


def record_fields(record: logging.LogRecord) -> Mapping[str, Any]:
    """The structured fields attached to ``record`` (empty when none)."""
    value = getattr(record, "fields", None)
    return value if isinstance(value, Mapping) else {}


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ts, level, logger, pid, msg, then the record's structured fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": os.getpid(),
            "msg": record.getMessage(),
        }
        out.update(record_fields(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``time level logger message key=value ...`` for people reading a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = " ".join(f"{k}={v}" for k, v in record_fields(record).items() if v is not None)
        if not extra:
            return line
        head, sep, tail = line.partition("\n")  # keep a traceback below the fields
        return f"{head} {extra}{sep}{tail}"


def configure_logging(level: str, fmt: str, stream: TextIO | None = None) -> None:
    """Send every logger (ours, aiohttp's, libraries') to ``stream`` in one format and level."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    wanted = getattr(logging, level.upper(), logging.INFO)
    # Debug applies to voxgate's own loggers only: libraries log request text at debug (piper
    # logs every input and its phonemes), and request text must never reach a log.
    root.setLevel(max(wanted, logging.INFO))
    logging.getLogger("voxgate").setLevel(wanted)
    # Python warnings (deprecations from libraries) go through logging too, so they are JSON lines.
    logging.captureWarnings(True)
