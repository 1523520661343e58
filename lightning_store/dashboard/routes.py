"""The dashboard's routes under ``/dashboard``, and the static files it ships (no CDN: it works offline)."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

from lightning_store.dashboard import auth, login, overview, resources, rollout, rollouts, runs, search, tasks
from lightning_store.dashboard.reader import DashboardUnavailableError
from lightning_store.dashboard.templating import HERE, render


def install(app: FastAPI) -> None:
    """Adds the dashboard to ``app``. Its pages are left out of the OpenAPI document: they are HTML for people,
    not part of the API."""
    router = APIRouter(prefix=auth.PREFIX, include_in_schema=False)
    pages = (login, overview, runs, resources, rollouts, rollout, search, tasks)
    for page in (module.router for module in pages):
        router.include_router(page)
    app.include_router(router)
    app.mount(auth.STATIC_PREFIX.rstrip("/"), StaticFiles(directory=HERE / "static"), name="dashboard-static")

    @app.get(auth.PREFIX, include_in_schema=False)
    async def dashboard_root() -> RedirectResponse:
        return RedirectResponse(f"{auth.PREFIX}/", status_code=307)

    @app.get("/", include_in_schema=False)
    async def server_root() -> RedirectResponse:
        # A browser pointed at the server's address lands on the dashboard (Agent Lightning's server shows its own).
        return RedirectResponse(f"{auth.PREFIX}/", status_code=307)

    @app.exception_handler(DashboardUnavailableError)
    async def unavailable(request: Request, exc: DashboardUnavailableError) -> HTMLResponse:
        return render(request, "unavailable.html", {"reason": str(exc)}, status_code=503)
