"""A bare aiohttp server answering every request with the bytes of one file: the baseline a
gateway hit is measured against."""

from __future__ import annotations

import sys
from pathlib import Path

from aiohttp import web


def main() -> None:
    port, path, content_type = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    data = path.read_bytes()

    async def handler(request: web.Request) -> web.Response:
        await request.read()  # a fair baseline reads the request body too
        return web.Response(body=data, content_type=content_type)

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_route("*", "/readyz", ok)
    app.router.add_route("*", "/{tail:.*}", handler)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


if __name__ == "__main__":
    main()
