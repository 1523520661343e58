"""The deployment files under ``deploy/`` (docs/scaling.md, "Deploy"), checked offline.

* Every Kubernetes object matches the official Kubernetes JSON schema, strictly (an unknown field is an error),
  for the oldest and the newest Kubernetes version checked: the schemas ship in the ``kubernetes-validate`` wheel.
* ``compose.yaml`` matches the Compose specification's schema, vendored (Apache-2.0) in the ``check-jsonschema``
  wheel.
* Every ``store`` command line in them parses with the real CLI (the core's commands and those of the
  ``lightning_store.commands`` entry points), values included, and the agent it names can be imported; every
  ``LIGHTNING_STORE_*`` variable is a setting (``lightning_store/settings.py``) or an option's ``envvar``, and a
  literal value passes that setting's validation.
* The parts fit together: probes ask a route that is open without the token, the Service selects the store's
  pods and names a port they have, the URLs runners and trainers use name that Service (or compose service) and
  its port, and every Secret key used exists.

Each check is shown to fail on a manifest broken on purpose.
"""

from __future__ import annotations

import copy
import functools
import importlib
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any
from unittest import mock
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]
import pydantic
import pytest
import typer
import yaml
from check_jsonschema.builtin_schemas import get_builtin_schema  # type: ignore[import-untyped]
from pydantic_settings import BaseSettings
from typer.core import TyperCommand, TyperGroup

from lightning_store import cli, settings
from lightning_store.server.guards import OPEN_PATHS

ROOT = Path(__file__).resolve().parents[2]
"""The repository root: the image's working directory /app holds its ``examples/`` too."""
DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
COMPOSE = DEPLOY / "compose.yaml"
KUBERNETES_VERSIONS = ("1.30", kubernetes_validate.latest_version())
"""The oldest Kubernetes the manifests support, and the newest whose schema the installed package ships."""
SERVE_PORT = 4747
"""``store serve``'s default port."""
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job")

Object = dict[str, Any]
Command = TyperCommand | TyperGroup
"""A ``store`` command as typer builds it (typer bundles its own click)."""


# --- reading the manifests -------------------------------------------------------------------------------------


def kubernetes_objects() -> list[tuple[str, Object]]:
    """(file name, object) for every object of every manifest (kustomization.yaml is kustomize's, not one)."""
    found = []
    for path in sorted(KUBERNETES.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            found += [(path.name, obj) for obj in yaml.safe_load_all(path.read_text()) if obj]
    return found


def compose_file() -> Object:
    loaded: Object = yaml.safe_load(COMPOSE.read_text())
    return loaded


@dataclass(frozen=True)
class Container:
    where: str
    argv: list[str]
    env: dict[str, str | None]
    """Each variable's literal value, or None where it comes from elsewhere (a Secret, the host, interpolation)."""


def pod_specs(objects: Sequence[tuple[str, Object]]) -> Iterator[tuple[str, Object]]:
    for name, obj in objects:
        if obj["kind"] in WORKLOADS:
            yield f"{name}: {obj['kind']}/{obj['metadata']['name']}", obj["spec"]["template"]["spec"]


def kubernetes_containers(objects: Sequence[tuple[str, Object]]) -> list[Container]:
    found = []
    for where, pod in pod_specs(objects):
        for container in pod.get("initContainers", []) + pod["containers"]:
            env = {var["name"]: var.get("value") for var in container.get("env", [])}
            argv = [*container.get("command", []), *container.get("args", [])]
            found.append(Container(f"{where}: {container['name']}", argv, env))
    return found


def compose_containers(compose: Object) -> list[Container]:
    """The services that run the store's image (those whose command is a list starting with ``store``)."""
    found = []
    for name, service in compose["services"].items():
        command = service.get("command")
        if isinstance(command, list) and command[:1] == ["store"]:
            raw = service.get("environment", {})
            assert isinstance(raw, dict), f"compose service {name}: write environment as a mapping"
            env = {key: None if value is None or "${" in str(value) else str(value) for key, value in raw.items()}
            found.append(Container(f"compose.yaml: {name}", [str(word) for word in command], env))
    return found


# --- the checks --------------------------------------------------------------------------------------------------


def kubernetes_schema_errors(obj: Object, version: str) -> list[str]:
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f"{'.'.join(map(str, error.absolute_path)) or '(top)'}: {error.message}"]
    return []


def leaves(error: jsonschema.ValidationError) -> Iterator[jsonschema.ValidationError]:
    """The errors under an ``anyOf``/``oneOf`` failure (which alone says only that no branch matched)."""
    if not error.context:
        yield error
    for branch in error.context or []:
        yield from leaves(branch)


def compose_schema_errors(compose: Object) -> list[str]:
    schema = get_builtin_schema("vendor.compose-spec")
    validator = jsonschema.validators.validator_for(schema)(schema)  # the draft the schema names
    return [
        f"{'.'.join(map(str, leaf.absolute_path)) or '(top)'}: {leaf.message}"
        for error in validator.iter_errors(compose)
        for leaf in leaves(error)
    ]


@functools.cache
def store_commands() -> dict[str, Command]:
    """The ``store`` subcommands as the installed CLI has them, without touching ``cli.app``."""
    group = typer.main.get_command(cli.app)
    assert isinstance(group, TyperGroup)
    commands: dict[str, Command] = {}
    for name, command in group.commands.items():
        assert isinstance(command, TyperCommand | TyperGroup)
        commands[name] = command
    for ep in entry_points(group="lightning_store.commands"):
        target = ep.load()
        if not isinstance(target, typer.Typer):
            target, function = typer.Typer(), target
            target.command(name=ep.name)(function)
        command = typer.main.get_command(target)
        assert isinstance(command, TyperCommand | TyperGroup)
        commands[ep.name] = command
    return commands


@functools.cache
def settings_classes() -> tuple[type[BaseSettings], ...]:
    return tuple(
        value
        for value in vars(settings).values()
        if isinstance(value, type) and issubclass(value, BaseSettings) and value is not BaseSettings
    )


def setting_name(field: str) -> str:
    return f"LIGHTNING_STORE_{field.upper()}"


@functools.cache
def known_variables() -> frozenset[str]:
    """Every variable a settings class reads, and every ``envvar`` of a ``store`` command's options."""
    names = {setting_name(field) for cls in settings_classes() for field in cls.model_fields}

    def walk(command: Command) -> None:
        for param in command.params:
            envvars = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or [])
            names.update(envvars)
        if isinstance(command, TyperGroup):
            for sub in command.commands.values():
                assert isinstance(sub, TyperCommand | TyperGroup)
                walk(sub)

    for command in store_commands().values():
        walk(command)
    return frozenset(names)


def env_problems(env: Mapping[str, str | None]) -> list[str]:
    problems = [
        f"{name} is not a lightning-store setting"
        for name in env
        if name.startswith("LIGHTNING_STORE_") and name not in known_variables()
    ]
    literal = {name: value for name, value in env.items() if value is not None}
    for cls in settings_classes():
        given = {field: literal[setting_name(field)] for field in cls.model_fields if setting_name(field) in literal}
        if given:
            try:
                cls.model_validate(given)
            except pydantic.ValidationError as error:
                problems += [f"{setting_name(str(e['loc'][0]))}: {e['msg']}" for e in error.errors()]
    return problems


def agent_problems(agent: str) -> list[str]:
    """``module:name`` as ``store run`` imports it from its working directory (the repository root here)."""
    module_name, _, name = agent.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        return [f"agent {agent}: {error}"]
    return [] if name and hasattr(module, name) else [f"agent {agent}: {module_name} has no {name!r}"]


def command_problems(argv: Sequence[str], env: Mapping[str, str | None] | None = None) -> list[str]:
    """What the CLI says of ``argv`` (with the literal variables of ``env`` set), parsed as ``store`` would,
    without running it; and whether the agent it names imports."""
    if list(argv[:1]) != ["store"] or len(argv) < 2:
        return [f"{list(argv)} is not a store subcommand"]
    words = list(argv[1:])
    path = ["store", words[0]]
    command: object = store_commands().get(words.pop(0))
    while isinstance(command, TyperGroup) and words and not words[0].startswith("-"):
        path.append(words[0])
        command = command.commands.get(words.pop(0))
    if not isinstance(command, TyperCommand | TyperGroup):
        return [f"{' '.join(path)}: no such command"]
    literal = {name: value for name, value in (env or {}).items() if value is not None}
    try:
        with mock.patch.dict(os.environ, literal):
            context = command.make_context(" ".join(path), words)
    except typer.TyperException as error:  # click's usage errors, as typer bundles it
        return [f"{' '.join(argv)}: {error.format_message()}"]
    except typer.Exit as error:  # e.g. store train with an algorithm this installation cannot run
        return [f"{' '.join(argv)}: exits with status {error.exit_code} before it starts"]
    agent = context.params.get("agent")
    return agent_problems(agent) if isinstance(agent, str) else []


def container_problems(container: Container) -> list[str]:
    return command_problems(container.argv, container.env) + env_problems(container.env)


def probe_problems(pod: Object) -> list[str]:
    """Every HTTP probe asks a route open without the token, on a port the container has."""
    problems = []
    for container in pod["containers"]:
        ports = {port.get("name") for port in container.get("ports", [])} | {
            port["containerPort"] for port in container.get("ports", [])
        }
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = container.get(kind, {})
            for action in ("httpGet", "tcpSocket"):
                if action in probe and probe[action]["port"] not in ports:
                    problems.append(f"{container['name']}.{kind}: port {probe[action]['port']!r} is not declared")
            path = probe.get("httpGet", {}).get("path")
            if path is not None and path not in OPEN_PATHS:
                problems.append(f"{container['name']}.{kind}: {path} needs the token (open: {OPEN_PATHS})")
    return problems


def secret_problems(objects: Sequence[tuple[str, Object]]) -> list[str]:
    """Every ``secretKeyRef`` that is not optional names a Secret of the manifests and one of its keys."""
    keys = {
        obj["metadata"]["name"]: set(obj.get("stringData", {})) | set(obj.get("data", {}))
        for _, obj in objects
        if obj["kind"] == "Secret"
    }
    problems = []
    for where, pod in pod_specs(objects):
        for container in pod.get("initContainers", []) + pod["containers"]:
            for var in container.get("env", []):
                ref = var.get("valueFrom", {}).get("secretKeyRef")
                if ref and not ref.get("optional") and ref["key"] not in keys.get(ref["name"], set()):
                    problems.append(f"{where}: {var['name']} reads {ref['name']}/{ref['key']}, which is not defined")
    return problems


def store_urls(container: Container) -> list[str]:
    """The store server URLs a container is given: ``LIGHTNING_STORE_URL`` and ``--store``."""
    urls = [container.env.get("LIGHTNING_STORE_URL") or ""]
    urls += [after for before, after in zip(container.argv, container.argv[1:], strict=False) if before == "--store"]
    return [url for url in urls if url.startswith("http")]


def serve_port(argv: Sequence[str]) -> int:
    return int(argv[argv.index("--port") + 1]) if "--port" in argv else SERVE_PORT


def token_problems(container: Container) -> list[str]:
    """A command given a server URL must send the token every deployed server requires (`--token` or
    ``LIGHTNING_STORE_TOKEN``): its own options must read it, and the container must set it."""
    if not store_urls(container):
        return []
    command = store_commands()[container.argv[1]]
    reads = any(
        param.envvar == "LIGHTNING_STORE_TOKEN" or "--token" in getattr(param, "opts", []) for param in command.params
    )
    problems = [] if reads else [f"{container.where}: store {container.argv[1]} has no way to send the token"]
    if "LIGHTNING_STORE_TOKEN" not in container.env and "--token" not in container.argv:
        problems.append(f"{container.where}: LIGHTNING_STORE_TOKEN is not set")
    return problems


def url_problems(container: Container, servers: Mapping[str, int]) -> list[str]:
    """Each store URL names a server of the deployment (a Service, a compose service) at its port."""
    problems = []
    for url in store_urls(container):
        parts = urlsplit(url)
        if servers.get(parts.hostname or "") != parts.port:
            problems.append(f"{container.where}: {url} is none of the store servers {dict(servers)}")
    return problems


def kubernetes_servers(objects: Sequence[tuple[str, Object]]) -> dict[str, int]:
    return {
        obj["metadata"]["name"]: port["port"]
        for _, obj in objects
        if obj["kind"] == "Service"
        for port in obj["spec"]["ports"]
    }


def compose_servers(compose: Object) -> dict[str, int]:
    return {
        container.where.removeprefix("compose.yaml: "): serve_port(container.argv)
        for container in compose_containers(compose)
        if container.argv[1:2] == ["serve"]
    }


def service_problems(objects: Sequence[tuple[str, Object]]) -> list[str]:
    """Each Service selects the pods of a workload, and its target port is one they declare."""
    problems = []
    for _, service in objects:
        if service["kind"] != "Service":
            continue
        selector = service["spec"]["selector"].items()
        pods = [pod for _, obj in objects if obj["kind"] in WORKLOADS for pod in [obj["spec"]["template"]]]
        chosen = [pod for pod in pods if selector <= pod["metadata"]["labels"].items()]
        if not chosen:
            problems.append(f"Service {service['metadata']['name']} selects no pods")
        declared = {
            value
            for pod in chosen
            for c in pod["spec"]["containers"]
            for p in c.get("ports", [])
            for value in p.values()
        }
        problems += [
            f"Service {service['metadata']['name']}: target port {port['targetPort']!r} is not declared by its pods"
            for port in service["spec"]["ports"]
            if port.get("targetPort", port["port"]) not in declared
        ]
    return problems


# --- the deployment as written -----------------------------------------------------------------------------------


OBJECTS = kubernetes_objects()
CONTAINERS = kubernetes_containers(OBJECTS) + compose_containers(compose_file())


@pytest.fixture(autouse=True)
def _in_the_image_working_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Relative paths in the manifests are the image's /app, which holds the repository's examples/."""
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT))


def test_the_manifests_hold_every_part() -> None:
    kinds = {(obj["kind"], obj["metadata"]["name"]) for _, obj in OBJECTS}
    assert {("Secret", "lightning-store"), ("Service", "lightning-store"), ("Job", "lightning-store-train")} <= kinds
    subcommands = {(c.where.split(":")[0], c.argv[1]) for c in CONTAINERS}
    for source in ("store.yaml", "runner.yaml", "train-job.yaml", "compose.yaml"):
        assert any(where == source for where, _ in subcommands), f"{source} runs no store command"
    assert {"serve", "migrate", "run", "train"} <= {command for _, command in subcommands}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(
    ("name", "obj"), OBJECTS, ids=[f"{name}:{obj['kind']}/{obj['metadata']['name']}" for name, obj in OBJECTS]
)
def test_kubernetes_objects_match_the_schema(name: str, obj: Object, version: str) -> None:
    assert kubernetes_schema_errors(obj, version) == []


def test_kustomization_names_existing_manifests() -> None:
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    for resource in kustomization["resources"]:
        assert (KUBERNETES / resource).is_file(), resource
    # Applied on their own (docs/scaling.md): placeholders must not overwrite a real Secret, and a Job runs once.
    assert not {"secret.yaml", "train-job.yaml"} & set(kustomization["resources"])


def test_compose_file_matches_the_compose_spec() -> None:
    assert compose_schema_errors(compose_file()) == []


def test_compose_store_waits_for_a_healthy_postgres() -> None:
    compose = compose_file()
    assert compose["services"]["store"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert compose["services"]["trainer"]["profiles"] == ["train"]
    health = " ".join(compose["services"]["store"]["healthcheck"]["test"])
    assert any(f"127.0.0.1:{SERVE_PORT}{path}" in health for path in OPEN_PATHS), health


@pytest.mark.parametrize("container", CONTAINERS, ids=[c.where for c in CONTAINERS])
def test_store_command_lines_parse_and_name_real_settings(container: Container) -> None:
    assert container_problems(container) == []


@pytest.mark.parametrize("container", CONTAINERS, ids=[c.where for c in CONTAINERS])
def test_store_urls_name_a_server_of_the_deployment(container: Container) -> None:
    source = container.where.split(":")[0]
    servers = compose_servers(compose_file()) if source == "compose.yaml" else kubernetes_servers(OBJECTS)
    assert url_problems(container, servers) == []


@pytest.mark.parametrize("container", CONTAINERS, ids=[c.where for c in CONTAINERS])
def test_commands_that_reach_the_server_send_its_token(container: Container) -> None:
    assert token_problems(container) == []


def test_probes_services_and_secrets_fit_together() -> None:
    problems = secret_problems(OBJECTS) + service_problems(OBJECTS)
    for _, pod in pod_specs(OBJECTS):
        problems += probe_problems(pod)
    assert problems == []
    assert any("readinessProbe" in c for _, pod in pod_specs(OBJECTS) for c in pod["containers"])


# --- broken on purpose: each check can fail ---------------------------------------------------------------------


def store_deployment() -> Object:
    (found,) = (obj for name, obj in OBJECTS if name == "store.yaml" and obj["kind"] == "Deployment")
    return copy.deepcopy(found)


def store_container(deployment: Object) -> Object:
    container: Object = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


@pytest.mark.parametrize(
    ("breakage", "expected"),
    [
        ("misspelled field", "'comand'"),
        ("replicas as words", "'two'"),
        ("no selector", "'selector' is a required property"),
    ],
)
def test_a_broken_kubernetes_object_is_rejected(breakage: str, expected: str) -> None:
    deployment = store_deployment()
    if breakage == "misspelled field":
        store_container(deployment)["comand"] = store_container(deployment).pop("command")
    elif breakage == "replicas as words":
        deployment["spec"]["replicas"] = "two"
    else:
        del deployment["spec"]["selector"]
    errors = kubernetes_schema_errors(deployment, KUBERNETES_VERSIONS[-1])
    assert errors and expected in errors[0], errors


@pytest.mark.parametrize(
    ("breakage", "expected"),
    [
        ("unknown condition", "'service_up' is not one of"),
        ("misspelled field", "'comand' was unexpected"),
        ("ports as a string", "is not of type 'array'"),
    ],
)
def test_a_broken_compose_file_is_rejected(breakage: str, expected: str) -> None:
    compose = compose_file()
    store = compose["services"]["store"]
    if breakage == "unknown condition":
        store["depends_on"]["postgres"]["condition"] = "service_up"
    elif breakage == "misspelled field":
        store["comand"] = store.pop("command")
    else:
        store["ports"] = "4747:4747"
    errors = compose_schema_errors(compose)
    assert any(expected in error for error in errors), errors


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (["store", "serv"], {}, "store serv: no such command"),
        (["store", "serve", "--worker", "4"], {}, "No such option: --worker"),
        (["store", "run", "examples.apo.agent:answer", "--workers", "0"], {}, "--workers"),
        (["store", "run", "examples.apo.agent:nope"], {}, "has no 'nope'"),
        (["store", "run", "examples.no_such_agent:answer"], {}, "No module named"),
        (["store", "train", "--algorithm", "no-such", "--agent", "a:b", "--train", "x"], {}, "no-such"),
        (["store", "serve"], {"LIGHTNING_STORE_WORKER": "4"}, "LIGHTNING_STORE_WORKER is not a lightning-store"),
        (["store", "serve"], {"LIGHTNING_STORE_POOL_SIZE": "0"}, "LIGHTNING_STORE_POOL_SIZE: Input should be"),
        (["store", "serve"], {"LIGHTNING_STORE_PORT": "http"}, "LIGHTNING_STORE_PORT: Input should be"),
    ],
)
def test_a_broken_command_line_is_rejected(argv: list[str], env: dict[str, str | None], expected: str) -> None:
    problems = container_problems(Container("broken", argv, env))
    assert any(expected in problem for problem in problems), problems


def test_broken_wiring_is_rejected() -> None:
    objects = [(name, copy.deepcopy(obj)) for name, obj in OBJECTS]
    deployment = next(
        obj for _, obj in objects if obj["kind"] == "Deployment" and obj["metadata"]["name"] == "lightning-store"
    )
    container = store_container(deployment)
    container["readinessProbe"]["httpGet"]["path"] = "/v1/agl/statistics"
    container["livenessProbe"]["tcpSocket"]["port"] = "web"
    container["env"][1]["valueFrom"]["secretKeyRef"]["key"] = "bearer-token"
    deployment["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] = "server"
    problems = probe_problems(deployment["spec"]["template"]["spec"]) + secret_problems(objects)
    problems += service_problems(objects)
    assert any("/v1/agl/statistics needs the token" in problem for problem in problems), problems
    assert any("port 'web' is not declared" in problem for problem in problems), problems
    assert any("lightning-store/bearer-token, which is not defined" in problem for problem in problems), problems
    assert any("Service lightning-store selects no pods" in problem for problem in problems), problems
    runner = Container("runner", ["store", "run", "a:b"], {"LIGHTNING_STORE_URL": "http://store:4747"})
    assert url_problems(runner, kubernetes_servers(objects)) != []
    trainer = Container("trainer", ["store", "train", "--store", "http://lightning-store:80"], {})
    assert url_problems(trainer, kubernetes_servers(objects)) != []
    tokenless = Container("runner", ["store", "run", "a:b"], {"LIGHTNING_STORE_URL": "http://lightning-store:4747"})
    assert token_problems(tokenless) == ["runner: LIGHTNING_STORE_TOKEN is not set"]


def test_schema_sources_are_current_enough() -> None:
    """Guards against an install that silently lost the schemas (the checks above would then prove nothing)."""
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?", KUBERNETES_VERSIONS[-1])
    assert tuple(map(int, KUBERNETES_VERSIONS[-1].split(".")[:2])) >= (1, 30)
    assert "services" in get_builtin_schema("vendor.compose-spec")["properties"]
