"""What the ``store`` commands that work through the store contract share: the ``--store``/``--token`` options,
opening the store they name, one-line failures, and printing records as a table or as JSON lines.

A command of the workflow (``store enqueue``, ``store resources …``, ``store rollouts …``) reaches the store the
way ``store run`` does: ``--store`` is a ``store serve`` URL (``http://host:port``) or a database URL opened in
process; the default is ``$LIGHTNING_STORE_URL``, else ``http://127.0.0.1:4747``.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lightning_store.contract import LightningStore

T = TypeVar("T")

DEFAULT_STORE = "http://127.0.0.1:4747"

StoreTarget = Annotated[
    str,
    typer.Option(
        "--store",
        envvar="LIGHTNING_STORE_URL",
        help="A store serve URL (http://host:port) or a database URL (sqlite:///…, postgresql://…).",
    ),
]
ReadStore = Annotated[
    str | None,
    typer.Option(
        "--store",
        envvar="LIGHTNING_STORE_URL",
        help="Read a store serve URL (http://host:port) or a database URL instead of --database-url.",
        show_default=False,
    ),
]
"""``--store`` of the commands that read the database directly (``stats``, ``sql``): given (or set in
``$LIGHTNING_STORE_URL``), it wins over ``--database-url``, so that every read command reads what ``store rollouts``
reads; not given, they read ``--database-url`` (default ``./lightning_store.db``) as before."""
DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url", help="SQLAlchemy URL; default $LIGHTNING_STORE_DATABASE_URL or ./lightning_store.db"
    ),
]
Token = Annotated[str | None, typer.Option(envvar="LIGHTNING_STORE_TOKEN", help="Bearer token of the server.")]
AsJson = Annotated[bool, typer.Option("--json", help="One JSON object per line instead of a table.")]

out = Console()
errors = Console(stderr=True)


def fail(what: str, line: str, code: int = 1) -> NoReturn:
    """Print ``what: line`` as one line on stderr (never wrapped, never read as markup) and exit with ``code``."""
    errors.print(f"[red]{what}:[/red] {escape(line)}", soft_wrap=True, highlight=False)
    raise typer.Exit(code)


def with_store(
    target: str,
    token: str | None,
    what: str,
    work: Callable[[LightningStore], Awaitable[T]],
    *,
    timeout: float = 30.0,
) -> T:
    """Open the store ``target`` names, run ``work`` on it, close it and return what ``work`` returned.

    A store that cannot be reached (no server answers, a wrong token, a database that is down or not migrated)
    and a store error (``NotFoundError``, ``InvalidRequestError``, …) end the command with ``what: reason`` on
    stderr and exit status 1; other exceptions propagate (they are bugs).
    """
    import httpx
    import sqlalchemy.exc

    from lightning_store import aio
    from lightning_store.connect import connect, is_server_url
    from lightning_store.errors import DatabaseUnavailableError, StoreError, UnauthorizedError
    from lightning_store.migrate import DatabaseNotMigratedError

    async def run() -> T:
        store = await connect(target, token=token, timeout=timeout)
        try:
            return await work(store)
        finally:
            await store.close()

    try:
        return aio.run(run())
    except UnauthorizedError as exc:
        fail(what, f"{target} wants a bearer token: pass --token or set LIGHTNING_STORE_TOKEN ({exc.message})")
    except StoreError as exc:
        fail(what, exc.message if exc.field is None else f"{exc.message} (field: {exc.field})")
    except (httpx.TransportError, OSError) as exc:
        hint = " (start one with `store serve`, or name another with --store)" if is_server_url(target) else ""
        fail(what, f"cannot reach the store at {target}: {type(exc).__name__}: {exc}{hint}")
    except httpx.HTTPStatusError as exc:
        fail(what, f"the server at {target} answered {exc.response.status_code}: {exc.response.text[:300]}")
    except (DatabaseUnavailableError, DatabaseNotMigratedError, sqlalchemy.exc.SQLAlchemyError) as exc:
        # (a SQLAlchemy error is raised before the store took over, e.g. SQLite's CANTOPEN)
        line = database_failure(exc, target)
        if line is None:
            raise
        fail(what, line)


def missing_database_line(database_url: str) -> str | None:
    """For a SQLite file that does not exist (a read command must not create it): the line that says so, how one
    is made, and how to read a running server instead; ``None`` when the database is not a missing file."""
    from lightning_store.sql.engine import missing_sqlite_file

    missing = missing_sqlite_file(database_url)
    if missing is None:
        return None
    return (
        f"no such file: {missing} (`store serve` or `store migrate` creates it; "
        "read a running server with --store http://HOST:PORT)"
    )


@contextlib.contextmanager
def database_errors(what: str, database_url: str, *, code: int = 1, serving: bool = False) -> Iterator[None]:
    """Turn a database that cannot be reached or is not migrated into one line (``what: …``) and exit ``code``;
    other errors pass."""
    try:
        yield
    except Exception as exc:
        line = database_failure(exc, database_url, serving=serving)
        if line is None:
            raise
        fail(what, line, code)


def database_failure(exc: BaseException, database_url: str, *, serving: bool = False) -> str | None:
    """One line for an error that says the database cannot be reached or is not migrated (the URL shown without
    its password); ``None`` for other errors. ``serving``: for ``store serve``, which also offers ``--migrate``
    and reports only what its own check raised (an ``OSError`` there may be uvicorn's, a port in use)."""
    import sqlalchemy.exc

    from lightning_store.errors import DatabaseUnavailableError, InvalidRequestError
    from lightning_store.migrate import DatabaseNotMigratedError
    from lightning_store.sql.engine import shown_url, unavailable_reason

    if isinstance(exc, sqlalchemy.exc.ArgumentError) and "URL" in str(exc):
        return (
            f"not a database URL: {database_url!r} (e.g. sqlite:///lightning_store.db or "
            "postgresql://user@host:5432/db)"
        )

    if isinstance(exc, InvalidRequestError) and exc.field == "database_url":
        return str(exc)  # an unsupported database, or one whose driver (an extra) is not installed
    if isinstance(exc, DatabaseNotMigratedError):
        if not exc.known:
            return f"{exc}: upgrade lightning-store"
        fix = f"run `store migrate --database-url {shown_url(database_url)}`"
        return f"{exc}: {fix}" + (" or pass --migrate" if serving else "")
    if isinstance(exc, DatabaseUnavailableError):
        reason: str | None = exc.reason
    else:
        reason = None if serving else unavailable_reason(exc)
    return None if reason is None else f"cannot reach the database {shown_url(database_url)}: {reason}"


def print_records(rows: Sequence[Mapping[str, Any]], columns: Iterable[str], *, as_json: bool, title: str = "") -> None:
    """``rows`` as a table of ``columns`` on stdout, or (``as_json``) one JSON object per row with every key.

    JSON lines are the form to pipe into other tools (``jq``, ``store enqueue``); the table is for reading.
    """
    if as_json:
        for row in rows:
            sys.stdout.write(json.dumps(row, default=str) + "\n")
        return
    names = list(columns)
    table = Table(*names, title=title or None)
    for row in rows:
        table.add_row(*(_cell(row.get(name)) for name in names))
    out.print(table)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return escape(json.dumps(value, default=str))
    return escape(str(value))
