"""The OpenAI SDK's defaults pointed at the store: an agent's plain ``OpenAI()`` client is recorded too.

An agent that builds its client without the ``llm`` it is given (``OpenAI()``, ``AsyncOpenAI()``, LangChain's
``ChatOpenAI()``, AutoGen's or the Agents SDK's default client: all read ``OPENAI_BASE_URL`` and
``OPENAI_API_KEY``) would call OpenAI itself, and the store would never see the call. A worker process that runs
one attempt at a time sets, before it imports the agent (so a client made at import time gets them too):

* ``OPENAI_BASE_URL`` to the server's proxy route for this worker, ``{server}/worker/{worker_id}/v1``, which
  forwards each call to the proxy of the attempt the worker runs at that moment (the store knows it: the
  worker's ``current_attempt_id``), and records it like any call to the attempt's own endpoint. The upstream is
  the attempt's ``llm`` resource, with its own model name (the agent's ``gpt-4o-mini`` names no model of ours);
* ``OPENAI_API_KEY`` to the store's token, or to a placeholder when there is no token and none is set (the SDK
  refuses to build a client without one; the proxy does not read it).

Contract of :func:`point_openai_defaults`: nothing is set when the worker has no server (a database URL), when
it runs several attempts at once (``--concurrency`` > 1: which attempt a call belongs to cannot be told from the
call, so the agent must use ``llm.endpoint``), when the setting ``LIGHTNING_STORE_OPENAI_DEFAULTS`` is off, or
when ``OPENAI_BASE_URL`` is already set (the user's choice wins; a warning says those calls bypass the store).
Returns the base URL it set, else None.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping
from urllib.parse import quote

logger = logging.getLogger(__name__)
PLACEHOLDER_KEY = "lightning-store"
"""``OPENAI_API_KEY`` where there is no token and the user set none (any non-empty value satisfies the SDK)."""


def worker_base_url(server_url: str, worker_id: str) -> str:
    """The proxy route (``…/v1``) that serves whatever attempt ``worker_id`` runs when a call arrives."""
    return f"{server_url.rstrip('/')}/worker/{quote(worker_id, safe='')}/v1"


def point_openai_defaults(
    *,
    server_url: str | None,
    worker_id: str,
    token: str | None,
    concurrency: int,
    enabled: bool = True,
    environ: MutableMapping[str, str] | None = None,
) -> str | None:
    """Set ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` in ``environ`` (default: this process's) as the module
    docstring says; the base URL set, or None."""
    env = os.environ if environ is None else environ
    if not enabled or server_url is None:
        return None
    if concurrency > 1:
        logger.info(
            "%d attempts at once: an OpenAI client must be given llm.endpoint to be recorded (OPENAI_BASE_URL "
            "cannot name one attempt)",
            concurrency,
        )
        return None
    if env.get("OPENAI_BASE_URL"):
        logger.warning(
            "OPENAI_BASE_URL is set (%s): an OpenAI client built without llm.endpoint calls it directly and its "
            "calls are not recorded; unset it to have them recorded",
            env["OPENAI_BASE_URL"],
        )
        return None
    url = worker_base_url(server_url, worker_id)
    env["OPENAI_BASE_URL"] = url
    if token:
        env["OPENAI_API_KEY"] = token
    else:
        env.setdefault("OPENAI_API_KEY", PLACEHOLDER_KEY)
    return url
