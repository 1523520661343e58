"""lightning-store: a durable rollout and span store for training LLM agents with reinforcement learning.

The core is a small centre (the contract and the types it speaks: ``contract``, ``models``, ``errors``,
``limits``, ``resources``, ``spans``, ``llm_calls``, ``semconv``) and rooms around it: ``sql/`` (the SQL store),
``client`` (the contract over HTTP), ``server/`` (``store serve``), ``dashboard/``, ``export/`` (export and
retention) and ``cli/`` (the ``store`` command). docs/adr/0026 says what each may import and where a new module
goes. This package imports none of ``runners``, ``tracers``, ``adapters`` and ``algorithms``.
"""

from lightning_store.contract import UNSET, LightningStore, StoreStatistics
from lightning_store.errors import ConflictError, InvalidRequestError, NotFoundError, StoreError
from lightning_store.llm_calls import LlmCall
from lightning_store.models import (
    Attempt,
    AttemptedRollout,
    AttemptEnd,
    AttemptStatus,
    EnqueueRolloutRequest,
    PaginatedResult,
    Rollout,
    RolloutConfig,
    RolloutMode,
    RolloutStatus,
    Worker,
    WorkerStatus,
)
from lightning_store.resources import LLM, NamedResources, PromptTemplate, ProxyLLM, ResourcesUpdate
from lightning_store.spans import Span

__all__ = [
    "LLM",
    "UNSET",
    "Attempt",
    "AttemptEnd",
    "AttemptStatus",
    "AttemptedRollout",
    "ConflictError",
    "EnqueueRolloutRequest",
    "InvalidRequestError",
    "LightningStore",
    "LlmCall",
    "NamedResources",
    "NotFoundError",
    "PaginatedResult",
    "PromptTemplate",
    "ProxyLLM",
    "ResourcesUpdate",
    "Rollout",
    "RolloutConfig",
    "RolloutMode",
    "RolloutStatus",
    "Span",
    "StoreError",
    "StoreStatistics",
    "Worker",
    "WorkerStatus",
]
