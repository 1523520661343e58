"""Configuration: argument > environment (``LIGHTNING_STORE_*``) > default.

Every field is documented in ``docs/reference/env.md``; keep the two in step.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///./lightning_store.db"


class StoreSettings(BaseSettings):
    """Settings of the SQL store."""

    model_config = SettingsConfigDict(env_prefix="LIGHTNING_STORE_", extra="ignore")

    database_url: str = Field(
        default=DEFAULT_DATABASE_URL,
        description="SQLAlchemy URL: sqlite+aiosqlite:///path.db or postgresql+asyncpg://user@host/db.",
    )
    migrate_on_start: bool | None = Field(
        default=None,
        description="Upgrade the schema when the store opens. Default: on for SQLite, off for Postgres.",
    )
    watchdog_interval: float = Field(
        default=5.0, ge=0, description="Seconds between watchdog scans for timed-out attempts; 0 disables it."
    )
    sqlite_poll_interval: float = Field(
        default=0.05, gt=0, description="How often waits re-check an SQLite database other processes write."
    )
    postgres_poll_interval: float = Field(
        default=1.0, gt=0, description="Safety re-check interval of waits on Postgres (NOTIFY wakes them first)."
    )
    pool_size: int = Field(
        default=10, ge=1, description="The most database connections a process opens, kept open once opened."
    )
    statement_timeout: float = Field(
        default=20.0,
        ge=0,
        description="Postgres: seconds a statement of the store may wait for a connection, wait for a lock or run "
        "(and, 2 s more, wait for an answer) before it is stopped and its request answered 503; shorter than "
        "clients wait (30 s). 0: no limit.",
    )


def load_settings(**overrides: Any) -> StoreSettings:
    """Settings from the environment, with explicit arguments (those not ``None``) taking precedence."""
    return StoreSettings(**{k: v for k, v in overrides.items() if v is not None})


class ServerSettings(StoreSettings):
    """Settings of ``store serve`` (the store's settings plus these)."""

    host: str = Field(default="127.0.0.1", description="Address to bind.")
    port: int = Field(default=4747, ge=0, le=65535, description="Port to bind (Agent Lightning's default).")
    workers: int = Field(default=1, ge=1, description="Server processes; more than one needs Postgres.")
    token: str | None = Field(default=None, description="Bearer token every route but health requires.")
    insecure: bool = Field(default=False, description="Allow a non-loopback host without a token.")
    max_body_bytes: int = Field(default=32 * 1024 * 1024, gt=0, description="Largest request body accepted.")
    max_header_bytes: int = Field(
        default=64 * 1024, ge=1024, description="Largest request line and headers accepted (431 beyond)."
    )
    llm_upstream: str | None = Field(
        default=None, description="OpenAI-compatible base URL (…/v1) the proxy uses when no llm resource names one."
    )
    llm_model: str | None = Field(
        default=None, description="Model the proxy names to llm_upstream when a call names none."
    )
    llm_api_key: str | None = Field(default=None, description="Bearer key the proxy sends to llm_upstream.")
    upstream_timeout: float = Field(default=600.0, gt=0, description="Seconds the proxy waits for the upstream.")
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Origins whose browser pages may call the API (CORS), comma-separated; * for any. Default: "
        "none (only pages this server serves).",
    )
    otlp_grpc: bool = Field(default=True, description="Serve OTLP traces over gRPC too, on otlp_grpc_port.")
    otlp_grpc_port: int = Field(
        default=4317, ge=0, le=65535, description="Port of OTLP over gRPC (OpenTelemetry's default; 0: a free one)."
    )
    call_record_window: float = Field(
        default=0.05,
        ge=0,
        le=10,
        description="Seconds the LLM proxy gathers call records into one write; an attempt's end writes its own at "
        "once. Used when the server runs one process (with --workers N it writes at once).",
    )

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _split_origins(cls, value: Any) -> Any:
        """``a,b`` from the environment, a list from an argument; blanks dropped."""
        items = value.split(",") if isinstance(value, str) else value
        return [item.strip() for item in items if item.strip()] if isinstance(items, list) else items


def load_server_settings(**overrides: Any) -> ServerSettings:
    return ServerSettings(**{k: v for k, v in overrides.items() if v is not None})


class RunnerSettings(BaseSettings):
    """Settings of the runner's worker processes (``store run``)."""

    model_config = SettingsConfigDict(env_prefix="LIGHTNING_STORE_", extra="ignore")

    instrument: str = Field(
        default="auto",
        description="OpenInference instrumentation at worker start-up: auto (every installed framework the "
        "agent imported), none, or a comma list of frameworks (langchain, openai-agents).",
    )
    openai_defaults: bool = Field(
        default=True,
        description="Point OPENAI_BASE_URL and OPENAI_API_KEY at the store's proxy in workers that run one attempt "
        "at a time, so that an agent's OpenAI client built without llm.endpoint is recorded too (never over an "
        "OPENAI_BASE_URL already set).",
    )


class PolicyServerSettings(BaseSettings):
    """Which server ``store train`` serves the policy being trained with."""

    model_config = SettingsConfigDict(env_prefix="LIGHTNING_STORE_", extra="ignore")

    policy_server: Literal["transformers", "vllm"] = Field(
        default="transformers",
        description="transformers: the built-in server in the trainer's process; vllm: vLLM in its own virtualenv.",
    )
    decode_threads: int | None = Field(
        default=None,
        ge=1,
        description="Intra-op threads the transformers server decodes with (default: every core).",
    )
    policy_host: str = Field(
        default="127.0.0.1",
        description="The address the policy server listens on, which the store's proxy is told to call it at: an "
        "address of this machine that the store servers reach when they run on other machines.",
    )
    vllm_python: str | None = Field(default=None, description="The Python interpreter of the virtualenv with vLLM.")
    vllm_args: str = Field(default="", description="Extra arguments of the vLLM server (split like a shell does).")
    vllm_swap: Literal["auto", "reload", "restart"] = Field(
        default="auto", description="How vLLM takes a new policy version: auto (reload on CUDA, else restart)."
    )

    @field_validator("policy_host")
    @classmethod
    def _callable_host(cls, host: str) -> str:
        # The address is also the one the proxy is given: a wildcard can be listened on but not called.
        if host.strip("[]") in ("", "0.0.0.0", "::"):
            raise ValueError("give an address the store servers can call (not a wildcard such as 0.0.0.0)")
        return host


def load_policy_server_settings(**overrides: Any) -> PolicyServerSettings:
    return PolicyServerSettings(**{k: v for k, v in overrides.items() if v is not None})


class TrainerSettings(BaseSettings):
    """Where ``store train`` runs the policy updates: in its own process, or data-parallel with DeepSpeed."""

    model_config = SettingsConfigDict(env_prefix="LIGHTNING_STORE_", extra="ignore")

    trainer: Literal["torch", "deepspeed"] = Field(
        default="torch",
        description="torch: update the policy in the trainer's process; deepspeed: over `trainer_processes` ranks.",
    )
    trainer_processes: int = Field(default=2, ge=1, le=64, description="DeepSpeed ranks, the trainer's included.")
    deepspeed_zero_stage: int = Field(
        default=2,
        ge=1,
        le=2,
        description="ZeRO stage: 1 partitions the optimizer state over the ranks, 2 also the gradients.",
    )
    deepspeed_config: str | None = Field(
        default=None, description="A JSON file of DeepSpeed options laid over the generated configuration."
    )
    trainer_timeout: float = Field(
        default=600.0, gt=0, description="Seconds a rank waits for the others in a collective before failing."
    )


def load_trainer_settings(**overrides: Any) -> TrainerSettings:
    return TrainerSettings(**{k: v for k, v in overrides.items() if v is not None})


class OptimizerSettings(BaseSettings):
    """The optimizer LLM of prompt optimization (``store train --algorithm apo``): any OpenAI-compatible endpoint,
    separate from the agents' LLM. Its calls are recorded in the store under the run."""

    model_config = SettingsConfigDict(env_prefix="LIGHTNING_STORE_", extra="ignore")

    optimizer_url: str | None = Field(
        default=None, description="Base URL of the optimizer's OpenAI-compatible API, e.g. https://api.openai.com/v1."
    )
    optimizer_model: str | None = Field(default=None, description="Model name the optimizer endpoint serves.")
    optimizer_api_key: str | None = Field(default=None, description="Bearer key of the optimizer endpoint.")
    optimizer_timeout: float = Field(default=300.0, gt=0, description="Seconds one optimizer call may take.")


def load_optimizer_settings(**overrides: Any) -> OptimizerSettings:
    return OptimizerSettings(**{k: v for k, v in overrides.items() if v is not None})
