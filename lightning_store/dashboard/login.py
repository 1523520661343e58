"""Logging in and out (see :mod:`lightning_store.dashboard.auth` for why a cookie, and what it holds)."""

from __future__ import annotations

import secrets

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from pydantic import BaseModel, Field

from lightning_store.dashboard import auth
from lightning_store.dashboard.templating import render

router = APIRouter()


class Login(BaseModel):
    token: str = Field(max_length=4096)


@router.get("/login", response_class=HTMLResponse)
async def login_page(request: Request, next: str | None = None) -> Response:
    if request.app.state.token is None:  # nothing to log in to
        return RedirectResponse(auth.safe_next(next), status_code=303)
    return render(request, "login.html", {"next": auth.safe_next(next)})


@router.post("/login")
async def login(body: Login, request: Request) -> Response:
    """204 with the session cookie when ``token`` is the server's; 401 otherwise."""
    token: str | None = request.app.state.token
    if token is not None and not secrets.compare_digest(body.token.encode(), token.encode()):
        return JSONResponse({"detail": "wrong token", "field": "token", "error_type": "Unauthorized"}, status_code=401)
    response = Response(status_code=204)
    if token is not None:
        response.set_cookie(
            auth.COOKIE,
            auth.cookie_value(token),
            path=auth.PREFIX,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
    return response


@router.get("/logout")
async def logout() -> Response:
    response = RedirectResponse(auth.LOGIN_PATH, status_code=303)
    response.delete_cookie(auth.COOKIE, path=auth.PREFIX)
    return response
