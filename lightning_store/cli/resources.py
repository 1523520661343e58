"""``store resources``: set and show the resources agents run with (LLM endpoints, prompt templates).

Resources are versioned snapshots (``ResourcesUpdate``): a change never edits a snapshot that rollouts may already
run with, it writes a new one, made of a base snapshot's resources (``--from ID``; by default the latest, which is
what rollouts enqueued without a resources id get) with the change applied. By default the new snapshot gets a
new id (``add_resources``, version 1); ``--id ID`` writes it as the next version of that id instead
(``update_resources``; the base is then that id's current snapshot when it exists). Either way it becomes the
latest. The read and the write are two calls: two writers at once may each miss the other's change.

Output: a write prints the new resources id alone on stdout (for ``$(…)``) and what it wrote on stderr. API keys
are masked (``sk-…abcd``) in everything shown unless ``--show-secrets``. Bad input (a URL that is not http(s), a
template that does not parse, bad JSON) exits with status 2, an unknown id or a store failure with 1, each with
one line on stderr.
"""

from __future__ import annotations

import json
import string
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import typer

from lightning_store.cli.common import DEFAULT_STORE, AsJson, StoreTarget, Token, fail, print_records, with_store
from lightning_store.contract import LightningStore
from lightning_store.errors import InvalidRequestError
from lightning_store.limits import check_json, text_problem
from lightning_store.resources import LLM, PromptTemplate, ResourcesUpdate, ResourceUnion

resources = typer.Typer(
    help="Set and show resources: the LLM endpoint and prompt templates, versioned.", no_args_is_help=True
)

Engine = Literal["f-string", "jinja", "poml"]
Change = Callable[[dict[str, ResourceUnion]], None]
From = Annotated[
    str | None, typer.Option("--from", help="Base the new version on this resources id (default: the latest).")
]
Empty = Annotated[bool, typer.Option("--empty", help="Start from no resources instead of a base snapshot.")]
Into = Annotated[
    str | None,
    typer.Option("--id", help="Write the next version of this resources id instead of a new id (update_resources)."),
]
ShowSecrets = Annotated[bool, typer.Option("--show-secrets", help="Show API keys in full.")]


@resources.command("set-llm")
def set_llm(
    url: Annotated[str, typer.Argument(help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1.")],
    model: Annotated[str, typer.Option(help="The model name the endpoint serves.")],
    api_key: Annotated[str | None, typer.Option(help="API key of the endpoint (stored as given).")] = None,
    name: Annotated[
        str,
        typer.Option(
            help="Resource name: agents look the LLM up by it. Through a server's proxy every call of a rollout goes "
            "to the snapshot's first llm resource."
        ),
    ] = "main_llm",
    sampling: Annotated[
        str | None, typer.Option(help='Sampling parameters, a JSON object: {"temperature": 0.7}.')
    ] = None,
    max_tokens_cap: Annotated[
        int | None,
        typer.Option(
            min=1, help="The most tokens a call through the proxy may ask for (a larger max_tokens is lowered)."
        ),
    ] = None,
    force: Annotated[
        str | None,
        typer.Option(
            help="Request fields the proxy sets on every call, replacing the agent's, a JSON object: "
            '{"tool_choice": "required"}.'
        ),
    ] = None,
    base: From = None,
    empty: Empty = False,
    into: Into = None,
    store: StoreTarget = DEFAULT_STORE,
    token: Token = None,
) -> None:
    """Write a new resources version with the LLM NAME (default main_llm) added or replaced."""
    what = "cannot set the llm"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        fail(what, f"{url!r} is not an http(s) URL (e.g. http://127.0.0.1:8000/v1)", 2)
    parameters = _json_object(what, "--sampling", sampling) if sampling is not None else {}
    forced = _json_object(what, "--force", force) if force is not None else None
    llm = LLM(
        endpoint=url,
        model=_text(what, "--model", model),
        api_key=api_key,
        sampling_parameters=parameters,
        max_tokens_cap=max_tokens_cap,
        forced_parameters=forced,
    )

    def change(named: dict[str, ResourceUnion]) -> None:
        named[name] = llm

    _publish(what, f"set {_text(what, '--name', name)}", change, base, empty, into, store, token)


@resources.command("set-prompt")
def set_prompt(
    name: Annotated[str, typer.Argument(help="Resource name: agents look the template up by it.")],
    template: Annotated[str | None, typer.Argument(help="The template text (or --file).")] = None,
    file: Annotated[Path | None, typer.Option(help="Read the template from this file (- for stdin).")] = None,
    engine: Annotated[Engine, typer.Option(help="How the agent fills it in.")] = "f-string",
    base: From = None,
    empty: Empty = False,
    into: Into = None,
    store: StoreTarget = DEFAULT_STORE,
    token: Token = None,
) -> None:
    """Write a new resources version with the prompt template NAME added or replaced."""
    what = "cannot set the prompt"
    if (template is None) == (file is None):
        fail(what, "give the template either as an argument or with --file", 2)
    if file is not None:
        try:
            text = typer.get_text_stream("stdin").read() if str(file) == "-" else file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            fail(what, f"cannot read {file}: {getattr(exc, 'strerror', None) or exc}", 2)
    else:
        text = str(template)
    prompt = PromptTemplate(template=_text(what, "the template", text), engine=engine)
    _check_template(what, prompt)

    def change(named: dict[str, ResourceUnion]) -> None:
        named[name] = prompt

    _publish(what, f"set {_text(what, 'NAME', name)}", change, base, empty, into, store, token)


@resources.command("remove")
def remove(
    name: Annotated[str, typer.Argument(help="The resource to leave out.")],
    base: From = None,
    into: Into = None,
    store: StoreTarget = DEFAULT_STORE,
    token: Token = None,
) -> None:
    """Write a new resources version without the resource NAME."""
    what = "cannot remove"

    def change(named: dict[str, ResourceUnion]) -> None:
        if name not in named:
            fail(what, f"the base snapshot has no resource {name!r} (it has: {', '.join(sorted(named)) or 'none'})")
        del named[name]

    _publish(what, f"removed {name}", change, base, False, into, store, token)


@resources.command("show")
def show(
    resources_id: Annotated[str | None, typer.Argument(help="A resources id (default: the latest).")] = None,
    show_secrets: ShowSecrets = False,
    as_json: Annotated[bool, typer.Option("--json", help="The stored JSON, on one line.")] = False,
    store: StoreTarget = DEFAULT_STORE,
    token: Token = None,
) -> None:
    """Print every resource of a snapshot: an LLM's endpoint, model and (masked) key; a template's engine and text."""
    what = "cannot show resources"

    async def work(target: LightningStore) -> tuple[ResourcesUpdate | None, ResourcesUpdate | None]:
        latest = await target.get_latest_resources()
        return (latest if resources_id is None else await target.get_resources_by_id(resources_id)), latest

    snapshot, latest = with_store(store, token, what, work)
    if snapshot is None:
        if resources_id is None:
            fail(what, "the store has no resources yet (`store resources set-llm URL --model M` writes some)")
        fail(what, f"no resources {resources_id!r} in the store (`store resources list` shows them)")
    data = _masked(snapshot.model_dump(mode="json"), show_secrets)
    if as_json:
        typer.echo(json.dumps(data, ensure_ascii=False))
        return
    is_latest = latest is not None and latest.resources_id == snapshot.resources_id
    typer.echo(
        f"{snapshot.resources_id}{' (latest)' if is_latest else ''}  version {snapshot.version}  "
        f"created {_when(snapshot.create_time)}  updated {_when(snapshot.update_time)}"
    )
    if not data["resources"]:
        typer.echo("  (no resources)")
    for name, resource in data["resources"].items():
        typer.echo(_describe(name, resource))


@resources.command("list")
def list_(
    limit: Annotated[int, typer.Option(min=1, help="Show at most this many, newest first.")] = 20,
    as_json: AsJson = False,
    store: StoreTarget = DEFAULT_STORE,
    token: Token = None,
) -> None:
    """List resources snapshots, newest first (the first is the latest): id, version, times, resources."""

    async def work(target: LightningStore) -> tuple[list[ResourcesUpdate], int]:
        page = await target.query_resources(sort_by="update_time", sort_order="desc", limit=limit)
        return list(page.items), page.total

    snapshots, total = with_store(store, token, "cannot list resources", work)
    if not snapshots and not as_json:
        typer.echo("no resources yet (`store resources set-llm URL --model M` writes some)", err=True)
        return
    rows = [
        {
            "resources_id": s.resources_id,
            "version": s.version,
            "create_time": s.create_time if as_json else _when(s.create_time),
            "update_time": s.update_time if as_json else _when(s.update_time),
            "resources": {name: resource.resource_type for name, resource in s.resources.items()},
        }
        for s in snapshots
    ]
    title = f"resources, newest first ({len(rows)} of {total})"
    print_records(
        rows, ["resources_id", "version", "create_time", "update_time", "resources"], as_json=as_json, title=title
    )


def _publish(
    what: str,
    done: str,
    change: Change,
    base_id: str | None,
    empty: bool,
    into: str | None,
    target: str,
    token: str | None,
) -> None:
    """Read the base snapshot, apply ``change`` to a copy of its resources, write the result as a new version;
    print its id on stdout and what was ``done`` on stderr."""
    if empty and base_id is not None:
        fail(what, "--empty and --from exclude each other", 2)

    async def work(store: LightningStore) -> tuple[ResourcesUpdate, ResourcesUpdate | None]:
        base = None
        if base_id is not None:
            base = await store.get_resources_by_id(base_id)
            if base is None:
                fail(what, f"no resources {base_id!r} in the store (`store resources list` shows them)")
        elif not empty:
            base = (await store.get_resources_by_id(into) if into is not None else None) or (
                await store.get_latest_resources()
            )
        named: dict[str, ResourceUnion] = dict(base.resources) if base is not None else {}
        change(named)
        written = await (store.update_resources(into, named) if into is not None else store.add_resources(named))
        return written, base

    written, base = with_store(target, token, what, work)
    typer.echo(written.resources_id)
    kinds = ", ".join(f"{n} ({r.resource_type})" for n, r in written.resources.items()) or "none"
    origin = f"; based on {base.resources_id} version {base.version}" if base is not None else ""
    typer.echo(
        f"wrote {written.resources_id} version {written.version} (now the latest) at {_when(written.update_time)}: "
        f"{done}; resources {kinds}{origin}",
        err=True,
    )


def _check_template(what: str, prompt: PromptTemplate) -> None:
    """Refuse an f-string template that ``str.format`` cannot parse, or a Jinja one Jinja cannot (when installed)."""
    try:
        if prompt.engine == "f-string":
            list(string.Formatter().parse(prompt.template))
        elif prompt.engine == "jinja":
            try:
                import jinja2
            except ImportError:  # not a dependency: without it the template is stored unchecked
                return
            jinja2.Environment().parse(prompt.template)
    except ValueError as exc:  # jinja2.TemplateSyntaxError is not one
        fail(what, f"not an f-string template: {exc} (write {{{{ and }}}} for literal braces)", 2)
    except Exception as exc:
        fail(what, f"not a Jinja template: {exc}", 2)


def _json_object(what: str, option: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        fail(what, f"{option}: not JSON ({exc.msg})", 2)
    if not isinstance(value, dict):
        fail(what, f"{option}: must be a JSON object", 2)
    try:
        check_json(value, option)
    except InvalidRequestError as exc:
        fail(what, exc.message, 2)
    return value


def _text(what: str, label: str, text: str) -> str:
    problem = "is empty" if not text else text_problem(text)
    if problem is not None:
        fail(what, f"{label} {problem}", 2)
    return text


def mask(key: str | None) -> str | None:
    """An API key as ``sk-…abcd``: its first 3 and last 4 characters, only when it is long enough (12 or more)
    that they give little away; ``…`` alone otherwise."""
    if not key:
        return key
    return f"{key[:3]}…{key[-4:]}" if len(key) >= 12 else "…"


def _masked(data: dict[str, Any], show_secrets: bool) -> dict[str, Any]:
    if not show_secrets:
        for resource in data["resources"].values():
            if resource.get("api_key"):
                resource["api_key"] = mask(resource["api_key"])
    return data


def _describe(name: str, resource: dict[str, Any]) -> str:
    kind = resource["resource_type"]
    if kind == "prompt_template":
        text = "\n".join(f"  | {line}" for line in resource["template"].splitlines() or [""])
        return f"{name}: prompt_template ({resource['engine']})\n{text}"
    lines = [f"{name}: {kind}", f"  endpoint  {resource['endpoint']}", f"  model     {resource['model']}"]
    lines.append(f"  api_key   {resource['api_key'] or 'none'}")
    if resource.get("sampling_parameters"):
        lines.append(f"  sampling  {json.dumps(resource['sampling_parameters'])}")
    return "\n".join(lines)


def _when(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp).astimezone().isoformat(sep=" ", timespec="seconds")
