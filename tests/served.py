"""``voxgate serve`` as a user starts it: no topology flags.

On this machine (and in CI) that is one gateway process per core on one port (SO_REUSEPORT),
uvloop, and the host's one synthesis pool process; the start log says what ``auto`` became. Tests
of anything a process boundary can change (key budgets, pinned prompts, Wyoming, jambonz, say URLs,
SSE, streaming, readiness, metrics) run against this. A test that needs one process passes
``one_process_because`` and says why; any other topology flag is refused here, so the default is
what a test gets unless it argues otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from gateway.http.app import create_app
from gateway.runtime.settings import Settings
from tests.conformance import Document, Recorder
from tests.ops_support import ServerProcess, clean_env

# Flags that change the process topology or the event loop.
TOPOLOGY_FLAGS = frozenset(
    {"--workers", "--synth-workers", "--intra-op-threads", "--synth-threads", "--event-loop"}
)
_TOPOLOGY_LINE = re.compile(r"topology: (\d+) gateway process")


class DefaultServer(ServerProcess):
    """``voxgate serve`` with only the given non-topology flags, on a free loopback port."""

    def __init__(
        self,
        directory: Path,
        *args: str,
        env: Mapping[str, str] | None = None,
        one_process_because: str = "",
    ) -> None:
        flags = {a.split("=", 1)[0] for a in args if a.startswith("--")}
        if flags & TOPOLOGY_FLAGS and not one_process_because:
            raise AssertionError(
                f"{sorted(flags & TOPOLOGY_FLAGS)}: the default topology is what users run; "
                "pass one_process_because to say why this test needs another"
            )
        extra = ("--workers", "1") if one_process_because and "--workers" not in flags else ()
        super().__init__(directory, *args, *extra, env=clean_env(**(env or {})))
        self.gateways = 1
        self.recorder = Recorder()

    def wait_ready(self, workers: int | None = None, timeout: float = 180) -> None:
        """Until every gateway process the start log announced is ready."""
        deadline = time.monotonic() + timeout
        found = None
        while found is None:
            found = _TOPOLOGY_LINE.search(self.logs())
            if found is None:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"no topology line in the start log:\n{self.logs()}")
                time.sleep(0.05)
        self.gateways = int(found.group(1))
        super().wait_ready(
            workers=self.gateways if workers is None else workers,
            timeout=max(1.0, deadline - time.monotonic()),
        )

    @contextlib.contextmanager
    def serving(self) -> Iterator[DefaultServer]:
        """The server, ready, for a module's tests (its fixture yields inside); once they are
        done, every answer they received is checked against the document it serves, and it is
        closed."""
        try:
            self.wait_ready()
            yield self
            assert asyncio.run(self.conformance_failures()) == []
        finally:
            self.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str] | None = None,
        json: Any = None,
        data: bytes | None = None,
    ) -> tuple[int, Mapping[str, str], bytes]:
        """One request on a new connection (so the kernel picks a gateway process for it, as it
        does for clients that do not keep connections): status, headers, body."""
        connector = aiohttp.TCPConnector(force_close=True)
        traced = [self.recorder.trace_config]
        async with (
            aiohttp.ClientSession(connector=connector, trace_configs=traced) as session,
            session.request(method, self.url + path, headers=headers, json=json, data=data) as resp,
        ):
            return resp.status, dict(resp.headers), await resp.read()

    async def conformance_failures(self) -> list[str]:
        """Every way an answer :meth:`request` received departs from the OpenAPI document this
        server serves (tests/conformance.py); call it while the server runs."""
        async with aiohttp.ClientSession() as session, session.get(self.url + "/openapi.json") as r:
            document = Document(await r.json())
        return await self.recorder.failures(document, routing_app())


@functools.cache
def routing_app() -> web.Application:
    """An app with the gateway's routes (never started), to route requests as the server did."""
    return create_app(Settings.load(env={}), engines={})
