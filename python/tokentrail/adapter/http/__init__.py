"""The adapter's HTTP layer, where a request arrives and its answer leaves: the aiohttp server,
the connection guard, the memory budget's admission, the error middleware, the access log and
the admin routes."""
