"""schemathesis against the live API description: every operation of ``/openapi.json``, as a
running gateway serves it, fuzzed from its own schemas, with the checks ``not_a_server_error``,
``status_code_conformance`` and ``response_schema_conformance``.

One real gateway (the bundled Piper voice, on loopback, shared by the module) answers. Fuzzed text
is really synthesized, so the cost is bounded here: ``max_input_chars`` is small for this server
(the document's ``maxLength`` follows it), a catalogue holds at most 3 prompts, and each operation
gets a fixed number of examples. Examples are derandomized: a run is reproducible, and a failure
found once is found again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode

# (Imported now, before the module's gateway thread starts, not lazily by ``from_url`` while it
# runs: CPython 3.11 keeps one AST recursion counter per interpreter, and two threads compiling
# source at once (a fresh clone has no .pyc files; pytest rewrites what it imports) failed a
# clean-clone run with "SystemError: AST constructor recursion depth mismatch".)
from schemathesis.specs.openapi import schemas as _openapi_schemas  # noqa: F401
from schemathesis.specs.openapi.checks import (
    response_schema_conformance,
    status_code_conformance,
)

from gateway.runtime.settings import Settings
from synth.piper_engine import PiperEngine
from tests.support import CountingEngine, ServerThread

DOCUMENT = Path(__file__).resolve().parents[1] / "docs" / "openapi.json"
METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
# (path, method) of every operation in the committed description; the live one must match it.
_PATHS = json.loads(DOCUMENT.read_text())["paths"]
OPERATIONS = [
    (path, method) for path, item in _PATHS.items() for method in item if method in METHODS
]
CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]
# A deeper local run: VOXGATE_SCHEMATHESIS_EXAMPLES=200 VOXGATE_SCHEMATHESIS_RANDOM=1 (new
# examples each run instead of the same derandomized ones).
EXAMPLES = int(os.environ.get("VOXGATE_SCHEMATHESIS_EXAMPLES", "20"))
DERANDOMIZE = not os.environ.get("VOXGATE_SCHEMATHESIS_RANDOM")


@dataclass(frozen=True)
class Live:
    base_url: str
    schema: Any  # schemathesis' OpenApiSchema
    session: requests.Session


@pytest.fixture(scope="module")
def live(piper_engine: PiperEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    directory = tmp_path_factory.mktemp("schemathesis")
    gateway_settings = Settings.load(
        env={},
        overrides={
            "cache_dir": str(directory / "cache"),
            "port": "0",
            "max_input_chars": "48",
            "max_catalogue_prompts": "3",
            "url_signing_secret": "schemathesis-signing-secret",
        },
    )
    server = ServerThread(gateway_settings, CountingEngine(piper_engine))
    server.start()
    base_url = f"http://127.0.0.1:{server.port}"
    session = requests.Session()
    try:
        schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json", wait_for_schema=60)
        yield Live(base_url, schema, session)
    finally:
        session.close()
        server.stop()


def test_the_live_description_has_the_documented_operations(live: Live) -> None:
    served = live.session.get(f"{live.base_url}/openapi.json", timeout=30).json()
    operations = [(p, m) for p, item in served["paths"].items() for m in item if m in METHODS]
    assert sorted(operations) == sorted(OPERATIONS)


def _takes_input(path: str, method: str) -> bool:
    operation = _PATHS[path][method]
    return bool(operation.get("parameters") or operation.get("requestBody"))


# Negative data only where there is input to make negative (else it is unsatisfiable).
RUNS = [
    (path, method, mode)
    for path, method in OPERATIONS
    for mode in ("examples", "positive", "negative")
    if mode != "negative" or _takes_input(path, method)
]


@pytest.mark.parametrize(
    ("path", "method", "mode"), RUNS, ids=[f"{m.upper()} {p} {mode}" for p, m, mode in RUNS]
)
def test_operation_conforms_to_its_description(
    live: Live, path: str, method: str, mode: str
) -> None:
    """``examples``: the document's own examples (they reach a 200 where random names would
    not: a served model and voice); ``positive``: data its schemas allow; ``negative``: data
    they refuse (answered with a documented 4xx)."""
    operation = live.schema[path][method.upper()]
    if mode == "examples":
        strategies = operation.get_strategies_from_examples()
        if not strategies:  # (no examples: generated data, as the positive run)
            strategies = [operation.as_strategy(GenerationMode.POSITIVE)]
        strategy = st.one_of(strategies)
    else:
        strategy = operation.as_strategy(GenerationMode(mode))

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=DERANDOMIZE,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def conforms(case: Any) -> None:
        response = case.call(base_url=live.base_url, session=live.session, timeout=60)
        case.validate_response(response, checks=CHECKS)

    conforms()
