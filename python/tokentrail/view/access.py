"""Who may read the viewer: the security headers every viewer response carries, and the
standalone viewer's token and Host allow-list (`tokentrail view`).

The token is printed at start in the URL to open, as Jupyter does; a request shows it as the
`token` query parameter (the page's first load, which then sets a cookie), the cookie, or
`Authorization: Bearer TOKEN`. The Host allow-list refuses a request whose `Host` is a name
the viewer was not opened under: a page on `attacker.example` that rebinds its name to
127.0.0.1 (DNS rebinding) reaches the port, but its requests still say `attacker.example`.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import socket
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web

from tokentrail.errors import AuthenticationError, PermissionDenied

__all__ = [
    "COOKIE",
    "SECURITY_HEADERS",
    "ViewAccess",
    "is_loopback",
    "new_token",
    "with_security_headers",
]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

COOKIE = "tokentrail_view"
# The page loads only its own script and style, is never framed, and names no referrer (a
# token in the URL must not leave in a `Referer`).
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
_LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def new_token() -> str:
    return secrets.token_urlsafe(24)


def is_loopback(host: str) -> bool:
    """Whether `host` (an address to listen on) is reachable from this machine only."""
    if host.lower() in _LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def with_security_headers(response: web.StreamResponse) -> web.StreamResponse:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


class ViewAccess:
    """The standalone viewer's checks: the Host allow-list, then the token (None: no token,
    which `tokentrail view` allows on a loopback address only)."""

    def __init__(self, token: str | None, allowed_hosts: Iterable[str] = ()) -> None:
        self.token = token
        names = {socket.gethostname(), socket.getfqdn(), *_LOCAL_NAMES, *allowed_hosts}
        self.allowed_hosts = frozenset(n.lower() for n in names if n)

    def host_allowed(self, header: str | None) -> bool:
        """An IP literal (a rebinding needs a name) or a name on the allow-list, any port."""
        if not header:
            return False
        host = header.rsplit(":", 1)[0] if not header.endswith("]") else header
        if header.startswith("[") and "]" in header:
            host = header[1 : header.index("]")]
        try:
            ipaddress.ip_address(host)
            return True
        except ValueError:
            return host.lower().rstrip(".") in self.allowed_hosts

    def given_token(self, request: web.Request) -> tuple[str | None, bool]:
        """The token the request shows, and whether it came in the query (to set the cookie)."""
        if "token" in request.query:
            return request.query["token"], True
        cookie = request.cookies.get(COOKIE)
        if cookie:
            return cookie, False
        auth = request.headers.get("Authorization", "")
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value:
            return value.strip(), False
        return None, False

    def check(self, request: web.Request) -> bool:
        """Raise for a request that may not read; True when its token came in the query."""
        if not self.host_allowed(request.headers.get("Host")):
            raise PermissionDenied(
                f"Host {request.headers.get('Host')!r} is not a name this viewer is served "
                "under (a DNS rebinding guard); open it by address or localhost, or start "
                "it with --allow-host NAME"
            )
        if self.token is None:
            return False
        given, in_query = self.given_token(request)
        if given is None or not hmac.compare_digest(
            given.encode("utf-8", "replace"), self.token.encode()
        ):
            raise AuthenticationError(
                "this viewer needs its token: open the URL `tokentrail view` printed at start "
                "(…/?token=TOKEN), or send Authorization: Bearer TOKEN"
            )
        return in_query

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        in_query = self.check(request)
        response = await handler(request)
        if in_query and self.token is not None:
            response.set_cookie(COOKIE, self.token, httponly=True, samesite="Strict", path="/")
        return response
