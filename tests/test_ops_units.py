"""Small pieces of the operations code: catalogue parsing, durations, log formatting."""

from __future__ import annotations

import io
import json
import logging
import sys
from pathlib import Path

import pytest

from gateway.api.catalogue import CatalogueError, parse_catalogue, read_catalogue
from gateway.cli.cache import parse_duration
from gateway.runtime.logs import JsonFormatter, TextFormatter, configure_logging


def test_txt_catalogue_skips_blanks_and_comments() -> None:
    prompts = parse_catalogue("# header\n\nHello.\n  # indented comment\nGoodbye.\n", "txt")
    assert [p.body for p in prompts] == [{"input": "Hello."}, {"input": "Goodbye."}]
    assert [p.where for p in prompts] == ["line 3", "line 5"]


def test_csv_catalogue_maps_short_names_and_numbers() -> None:
    text = 'text,voice,format,rate,speed\n"Hi, you.",joe,mulaw,8000,1.25\nBye.,,,,\n\n'
    prompts = parse_catalogue(text, "csv")
    assert prompts[0].body == {
        "input": "Hi, you.",
        "voice": "joe",
        "response_format": "mulaw",
        "sample_rate": 8000,
        "speed": 1.25,
    }
    assert prompts[1].body == {"input": "Bye."}  # empty cells take the defaults
    assert prompts[1].where == "line 3"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("text,colour\nHi.,red\n", "unknown field 'colour'"),
        ("text,rate\nHi.,fast\n", "line 2"),
        ("text\nHi.,extra\n", "more cells"),
    ],
)
def test_bad_csv_names_the_line(text: str, fragment: str) -> None:
    with pytest.raises(CatalogueError, match=fragment):
        parse_catalogue(text, "csv")


def test_yaml_catalogue_defaults_and_overrides() -> None:
    text = (
        "defaults: {voice: joe, format: wav}\nprompts:\n  - One.\n  - {text: Two., format: flac}\n"
    )
    prompts = parse_catalogue(text, "yaml")
    assert prompts[0].body == {"voice": "joe", "response_format": "wav", "input": "One."}
    assert prompts[1].body["response_format"] == "flac"
    assert parse_catalogue("- a\n- b\n", "yaml")[1].body == {"input": "b"}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("prompts: 3\n", "list of prompts"), ("- [1, 2]\n", "prompt 1"), ("a: [\n", "not valid YAML")],
)
def test_bad_yaml_is_rejected(text: str, fragment: str) -> None:
    with pytest.raises(CatalogueError, match=fragment):
        parse_catalogue(text, "yaml")


def test_read_catalogue_picks_the_kind_by_suffix(tmp_path: Path) -> None:
    (tmp_path / "a.yml").write_text("- x\n")
    (tmp_path / "a.csv").write_text("text\ny\n")
    (tmp_path / "a.list").write_text("z\n")
    assert read_catalogue(tmp_path / "a.yml")[0].body == {"input": "x"}
    assert read_catalogue(tmp_path / "a.csv")[0].body == {"input": "y"}
    assert read_catalogue(tmp_path / "a.list")[0].body == {"input": "z"}
    with pytest.raises(CatalogueError, match="cannot read"):
        read_catalogue(tmp_path / "missing.txt")


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), ("30s", 30), ("15m", 900), ("12h", 43200), ("7d", 604800)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def _record(msg: str, **fields: object) -> logging.LogRecord:
    record = logging.LogRecord("voxgate.access", logging.INFO, __file__, 1, msg, None, None)
    record.fields = fields
    return record


def test_json_formatter_puts_fields_at_top_level() -> None:
    line = JsonFormatter().format(_record("request", route="/x", status=200, client=None))
    out = json.loads(line)
    assert out["msg"] == "request" and out["route"] == "/x" and out["status"] == 200
    assert out["level"] == "info" and out["logger"] == "voxgate.access" and "pid" in out
    assert out["client"] is None


def test_json_formatter_keeps_tracebacks_on_one_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord(
            "voxgate",
            logging.ERROR,
            __file__,
            1,
            "failed",
            None,
            exc_info=sys.exc_info(),
        )
    line = JsonFormatter().format(record)
    assert "\n" not in line
    assert "ValueError: boom" in json.loads(line)["exc"]


def test_text_formatter_appends_fields() -> None:
    line = TextFormatter().format(_record("request", route="/x", key=None, ms=1.5))
    assert line.endswith("voxgate.access request route=/x ms=1.5")


def test_debug_level_applies_to_voxgate_loggers_only() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, logging.getLogger("voxgate").level)
    try:
        configure_logging("debug", "json", stream)
        logging.getLogger("voxgate.speech").debug("ours")
        logging.getLogger("piper").debug("text=secret")
        logging.getLogger("piper").info("loaded")
        lines = [json.loads(x)["msg"] for x in stream.getvalue().splitlines()]
        assert lines == ["ours", "loaded"]
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved[0]:
            root.addHandler(h)
        root.setLevel(saved[1])
        logging.getLogger("voxgate").setLevel(saved[2])
        logging.captureWarnings(False)
