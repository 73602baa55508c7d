"""A bare aiohttp server answering every request with the bytes of one file: the baseline a
gateway hit is measured against.

    bare_server.py PORT FILE CONTENT_TYPE [EVENT_LOOP]

EVENT_LOOP (auto, uvloop or asyncio; default auto) is resolved as the gateway resolves its
``--event-loop``, so both sides of a comparison run on the same loop.
"""

from __future__ import annotations

import sys
from pathlib import Path

from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.runtime.eventloop import factory  # noqa: E402


def main() -> None:
    port, path, content_type = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    loop_choice = sys.argv[4] if len(sys.argv) > 4 else "auto"
    data = path.read_bytes()

    async def handler(request: web.Request) -> web.Response:
        await request.read()  # a fair baseline reads the request body too
        return web.Response(body=data, content_type=content_type)

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_route("*", "/readyz", ok)
    app.router.add_route("*", "/{tail:.*}", handler)
    web.run_app(
        app, host="127.0.0.1", port=port, access_log=None, print=None, loop=factory(loop_choice)()
    )


if __name__ == "__main__":
    main()
