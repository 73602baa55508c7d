"""The voxgate HTTP gateway (aiohttp): routes, validation, errors, CLI."""
