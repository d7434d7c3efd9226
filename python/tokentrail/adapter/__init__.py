"""The HTTP adapter a harness talks to: the aiohttp server, its sessions, its error middleware,
the wire protocols and the Prometheus metrics."""
