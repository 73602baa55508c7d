"""schemathesis against the live API description: every operation of ``/openapi.json``, as a
running gateway serves it (built here with the server's settings, and checked equal to what it
serves), through schemathesis' own pytest integration: its phases (the
document's examples; coverage: boundary, missing and wrong values of each parameter, positive
and negative; fuzzing: data the schemas allow and data they refuse) and all its checks, as
schemathesis enables them by default (server errors, status codes, Content-Types, headers and
bodies against the document, schema-valid data accepted, schema-invalid data refused, methods
the document does not list answered 405...).

One real gateway (the bundled Piper voice, on loopback, shared by the module) answers. Fuzzed text
is really synthesized, so the cost is bounded here: ``max_input_chars`` is small for this server
(the document's ``maxLength`` follows it), a catalogue holds at most 3 prompts, and each operation
gets a fixed number of fuzzed examples. Examples are derandomized: a run is reproducible, and a
failure found once is found again.

Three facts no schema can state are given to schemathesis here, and only here:

- Which models, voices and languages a server serves is its configuration (the document's
  descriptions point at ``GET /v1/voices``): a request schemathesis makes to be valid names ones
  this server serves (read from ``GET /v1/voices`` and put in before the request is sent);
  requests it makes to be invalid keep their names.
- What a text says: which characters a voice has sounds for (text of only characters it cannot
  say is refused, ``nothing_to_speak``), whether SSML is well-formed and within the SSML limits
  (``invalid_ssml``, ``ssml_*``); and that prompt ids are unique within a catalogue
  (``duplicate_id``). Such a 400 is exempt from "schema-valid data is accepted" (every other
  check still runs on it: :data:`CONTENT_REFUSALS`).
- ``GET /v1/jambonz/stream`` is a WebSocket: an HTTP request never completes its handshake, so
  it is answered 400 whatever the query; every check but "schema-valid data is accepted" runs on
  it (tests/test_telephony_jambonz.py drives it with a WebSocket client).
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings

# (Imported now, before the module's gateway thread starts, not lazily by ``from_url`` while it
# runs: CPython 3.11 keeps one AST recursion counter per interpreter, and two threads compiling
# source at once (a fresh clone has no .pyc files; pytest rewrites what it imports) failed a
# clean-clone run with "SystemError: AST constructor recursion depth mismatch".)
from schemathesis.specs.openapi import schemas as _openapi_schemas  # noqa: F401
from schemathesis.specs.openapi.checks import positive_data_acceptance

from gateway.http.openapi import render
from gateway.runtime.settings import Settings
from synth.piper_engine import PiperEngine
from tests.canary import canary
from tests.support import CountingEngine, ServerThread

# One pytest-xdist worker runs the whole module: its tests share one module-scoped gateway.
pytestmark = pytest.mark.xdist_group("schemathesis")

# The live server's settings (but its cache directory): fuzzed text is really synthesized, so
# the longest input is short, and a catalogue small.
SERVER_SETTINGS = Settings.load(
    env={},
    overrides={
        "port": "0",
        "max_input_chars": "48",
        "max_catalogue_prompts": "3",
        "url_signing_secret": canary("schemathesis-signing"),
    },
)
# What that server serves at /openapi.json (test_the_live_description_is_the_one_tested).
DOCUMENT = json.loads(render(SERVER_SETTINGS))
METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
# A deeper local run: VOXGATE_SCHEMATHESIS_EXAMPLES=200 VOXGATE_SCHEMATHESIS_RANDOM=1 (new
# examples each run instead of the same derandomized ones).
EXAMPLES = int(os.environ.get("VOXGATE_SCHEMATHESIS_EXAMPLES", "20"))
DERANDOMIZE = not os.environ.get("VOXGATE_SCHEMATHESIS_RANDOM")
WEBSOCKET = "/v1/jambonz/stream"

# Where a request names a model, a voice or a language, by operation and location.
NAMES: dict[tuple[str, str], dict[str, dict[str, str]]] = {
    ("POST", "/v1/audio/speech"): {"body": {"model": "model", "voice": "voice"}},
    ("POST", "/v1/ssml/explain"): {"body": {"model": "model", "voice": "voice"}},
    ("POST", "/v1/audio/speech/with-timestamps"): {"body": {"model": "model", "voice": "voice"}},
    ("GET", "/synthesize"): {"query": {"model": "model", "speaker": "voice"}},
    ("GET", "/api/tts"): {"query": {"speaker_id": "voice", "language_id": "language"}},
    ("POST", "/api/tts"): {
        "query": {"speaker_id": "voice", "language_id": "language"},
        "body": {"speaker_id": "voice", "language_id": "language"},
    },
    ("POST", "/"): {"body": {"voice": "voice"}},
    ("POST", "/v1/say/sign"): {"body": {"voice": "voice"}},
    ("POST", "/v1/jambonz/tts"): {"body": {"voice": "voice"}},
    ("GET", "/v1/say/{voice}/{text}.{ext}"): {"path_parameters": {"voice": "voice"}},
    ("GET", "/v1/say/s/{token}/{voice}/{text}.{ext}"): {"path_parameters": {"voice": "voice"}},
}
PROMPT_NAMES = {"model": "model", "voice": "voice"}  # in each prompt object and the defaults


@dataclass(frozen=True)
class Live:
    base_url: str
    session: requests.Session
    names: dict[str, list[str]]  # served names by kind (served_names)


def served_names(listing: dict[str, Any]) -> dict[str, list[str]]:
    """The names a request may give, by kind, from ``GET /v1/voices``."""
    models = [m["id"] for m in listing["models"]] + sorted(listing["model_aliases"])
    voices = [v["id"] for m in listing["models"] for v in m["voices"]]
    languages = {v["language"] for m in listing["models"] for v in m["voices"]}
    return {
        "model": models,
        "voice": voices + sorted(listing["voice_aliases"]),
        "language": ["", *sorted(languages | {lang.split("_")[0] for lang in languages})],
    }


def _pick(choices: list[str], value: Any) -> str:
    """One of ``choices``, chosen by ``value`` (so a derandomized run is the same run)."""
    return choices[zlib.crc32(repr(value).encode()) % len(choices)]


def _rename(container: Any, fields: dict[str, str], names: dict[str, list[str]]) -> None:
    if isinstance(container, dict):
        for field, kind in fields.items():
            if isinstance(container.get(field), str):
                container[field] = _pick(names[kind], container[field])


def with_served_names(case: Any, names: dict[str, list[str]]) -> Any:
    """``case`` with the names it gives replaced by served ones, if schemathesis made it valid."""
    meta = case.meta
    if meta is None or meta.generation.mode.name != "POSITIVE":
        return case
    key = (case.method.upper(), case.operation.path)
    for location, fields in NAMES.get(key, {}).items():
        _rename(getattr(case, location), fields, names)
    if key == ("POST", "/v1/prompts") and isinstance(case.body, dict):
        for prompt in [*(case.body.get("prompts") or []), case.body.get("defaults")]:
            _rename(prompt, PROMPT_NAMES, names)
    return case


@pytest.fixture(scope="module")
def live(piper_engine: PiperEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    directory = tmp_path_factory.mktemp("schemathesis")
    gateway_settings = SERVER_SETTINGS.replace(cache_dir=str(directory / "cache"))
    server = ServerThread(gateway_settings, CountingEngine(piper_engine))
    server.start()
    base_url = f"http://127.0.0.1:{server.port}"
    session = requests.Session()
    try:
        names = served_names(session.get(f"{base_url}/v1/voices", timeout=30).json())
        yield Live(base_url, session, names)
    finally:
        session.close()
        server.stop()


def test_the_live_description_is_the_one_tested(live: Live) -> None:
    served = live.session.get(f"{live.base_url}/openapi.json", timeout=30).json()
    assert served == DOCUMENT


def test_served_names_come_from_the_listing() -> None:
    listing = {
        "models": [{"id": "piper", "voices": [{"id": "joe", "language": "en_US"}]}],
        "model_aliases": {"tts-1": "piper"},
        "voice_aliases": {"alloy": "joe"},
    }
    assert served_names(listing) == {
        "model": ["piper", "tts-1"],
        "voice": ["joe", "alloy"],
        "language": ["", "en", "en_US"],
    }


schema = schemathesis.openapi.from_dict(DOCUMENT)


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=DERANDOMIZE,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_operation_conforms_to_its_description(case: Any, live: Live) -> None:
    case = with_served_names(case, live.names)
    if case.operation.path == WEBSOCKET:
        # A fresh connection each time: a request that does complete the handshake must not
        # leave a WebSocket in the shared session's pool.
        with requests.Session() as session:
            response = case.call(base_url=live.base_url, session=session, timeout=60)
        case.validate_response(response, excluded_checks=[positive_data_acceptance])
        return
    response = case.call(base_url=live.base_url, session=live.session, timeout=60)
    if refused_for_content(response):
        case.validate_response(response, excluded_checks=[positive_data_acceptance])
    else:
        case.validate_response(response)


# The answers schema-valid requests may get for what no schema can state: what the text says
# (characters a voice has no sound for; SSML that is not well-formed or breaks an SSML limit),
# and prompt ids unique within a catalogue.
CONTENT_REFUSALS = {"nothing_to_speak", "invalid_ssml", "duplicate_id"}


def refused_for_content(response: requests.Response) -> bool:
    """Whether ``response`` is a 400 for one of :data:`CONTENT_REFUSALS` (or an SSML limit)."""
    if response.status_code != 400:
        return False
    code = response.json()["error"]["code"] or ""
    return code in CONTENT_REFUSALS or code.startswith("ssml_")
