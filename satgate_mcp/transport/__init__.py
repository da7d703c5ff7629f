"""HTTP transports: aiohttp handlers that turn requests into gateway decisions and back."""
