"""Who may see the dashboard: the holder of the server's bearer token, as for the API.

A browser cannot send an ``Authorization`` header on a plain page load, so the dashboard trades the token once
for a cookie: the login page posts it as JSON (typed into a prompt, or read by the page's script from the URL
fragment ``#token=…``, which browsers never send to a server), and the server answers with an HttpOnly,
SameSite=Strict cookie scoped to ``/dashboard``. The cookie holds an HMAC of the token, not the token, so it is
worth nothing outside this server and changes when the token does. The token never appears in a URL the server
sees, so never in an access log. Without a configured token the dashboard is open, like the API.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

PREFIX = "/dashboard"
LOGIN_PATH = f"{PREFIX}/login"
STATIC_PREFIX = f"{PREFIX}/static/"
COOKIE = "lightning_store_dashboard"
OPEN_PATHS = (LOGIN_PATH, f"{PREFIX}/logout")
"""Dashboard paths served without the token: the login page (and its JSON post) and logging out."""


def cookie_value(token: str) -> str:
    """What the cookie holds for ``token``: a keyed hash, so that the cookie does not reveal the token."""
    return hmac.new(token.encode(), b"lightning-store dashboard session", hashlib.sha256).hexdigest()


def is_dashboard(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def is_open(path: str) -> bool:
    """Paths that need no token: the login page, logging out, and the static files (scripts, styles: no data)."""
    return path in OPEN_PATHS or path.startswith(STATIC_PREFIX)


def cookie_matches(cookie_header: str | None, token: str) -> bool:
    """Whether a ``Cookie`` request header carries the session cookie for ``token``."""
    if not cookie_header:
        return False
    expected = cookie_value(token).encode()
    for part in cookie_header.split(";"):
        name, _, value = part.strip().partition("=")
        if name == COOKIE and secrets.compare_digest(value.encode(), expected):
            return True
    return False


def safe_next(target: str | None) -> str:
    """Where to go after logging in: a dashboard path on this server, never another site."""
    if target and is_dashboard(target.split("?")[0]) and not target.startswith("//"):
        return target
    return f"{PREFIX}/"
