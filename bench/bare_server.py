"""A bare aiohttp server answering requests with stored bytes: the baseline a gateway hit is
measured against.

    python -m bench.bare_server PORT FILE CONTENT_TYPE [EVENT_LOOP]
    python -m bench.bare_server PORT TABLE.pickle CONTENT_TYPE [EVENT_LOOP] --by-body

The first form answers every request with the bytes of FILE. With ``--by-body`` TABLE.pickle
holds ``{request body bytes: response bytes}`` and each request gets the bytes stored for its
exact body (404 for any other): the least a server must do to serve many prompts, one dict
lookup, with no eviction.

EVENT_LOOP (auto, uvloop or asyncio; default auto) is resolved as the gateway resolves its
``--event-loop``, so both sides of a comparison run on the same loop.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

from aiohttp import web

from gateway.http.hits import lift_writelines_skip
from gateway.runtime.eventloop import factory


def main() -> None:
    argv = [a for a in sys.argv[1:] if a != "--by-body"]
    by_body = len(argv) < len(sys.argv) - 1
    port, path, content_type = int(argv[0]), Path(argv[1]), argv[2]
    loop_choice = argv[3] if len(argv) > 3 else "auto"

    if by_body:
        table: dict[bytes, bytes] = pickle.loads(path.read_bytes())

        async def handler(request: web.Request) -> web.Response:
            found = table.get(await request.read())
            if found is None:
                raise web.HTTPNotFound()
            return web.Response(body=found, content_type=content_type)

    else:
        data = path.read_bytes()

        async def handler(request: web.Request) -> web.Response:
            await request.read()  # a fair baseline reads the request body too
            return web.Response(body=data, content_type=content_type)

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_route("*", "/readyz", ok)
    app.router.add_route("*", "/{tail:.*}", handler)
    loop = factory(loop_choice)()
    lift_writelines_skip(loop)  # as the gateway's serve does
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None, loop=loop)


if __name__ == "__main__":
    main()
