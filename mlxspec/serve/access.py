"""Who may call the server: an API key sent as a Bearer token (``--api-key``), and the browser
origins whose pages may read its answers (``--allowed-origins``, CORS)."""

from __future__ import annotations

import hmac
from dataclasses import dataclass

OPEN_PATHS = ("/health",)  # a load balancer's probe needs no key
METHODS = "GET, POST, OPTIONS"
PREFLIGHT_MAX_AGE_S = 600


@dataclass(frozen=True)
class Access:
    api_key: str | None = None  # None: anyone who can reach the port
    origins: tuple[str, ...] = ()  # "*": any origin; empty: no cross-origin reads

    def allows(self, method: str, path: str, authorization: str | None) -> bool:
        """Whether a request may go on: no key set, an open path, a CORS preflight (browsers send
        it without credentials), or ``Authorization: Bearer KEY`` with the key (compared in
        constant time)."""
        if self.api_key is None or path in OPEN_PATHS or method == "OPTIONS":
            return True
        scheme, _, token = (authorization or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.api_key.encode())

    def allows_origin(self, origin: str | None) -> bool:
        return origin is not None and ("*" in self.origins or origin.rstrip("/") in self.origins)

    def cors_headers(self, origin: str | None, preflight: bool, requested_headers: str | None) -> dict[str, str]:
        """The CORS headers of an answer to a request from ``origin``: none for an origin not
        allowed (the browser then withholds the answer from the page); for a preflight, the
        methods and the headers the page asked to send too."""
        if not self.allows_origin(origin):
            return {}
        headers = {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}
        if preflight:
            headers |= {"Access-Control-Allow-Methods": METHODS,
                        "Access-Control-Allow-Headers": requested_headers or "Authorization, Content-Type",
                        "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_S)}
        return headers


def parse_origins(values: list[str] | None) -> tuple[str, ...]:
    """``--allowed-origins`` values (repeatable, or comma-separated) as origins without a
    trailing slash, as browsers send them."""
    from mlxspec.errors import MlxspecError

    out = []
    for value in values or ():
        for origin in filter(None, (v.strip().rstrip("/") for v in value.split(","))):
            if origin != "*" and "://" not in origin:
                raise MlxspecError(f"--allowed-origins takes origins such as http://localhost:3000 (or *), got {origin!r}")
            out.append(origin)
    return tuple(out)
