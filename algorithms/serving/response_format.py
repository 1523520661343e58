"""``response_format`` for the policy server: structured output by checked decoding.

vLLM constrains decoding to a grammar; this server, on CPUs, checks instead. A chat request with
``{"type": "json_object"}`` or ``{"type": "json_schema", "json_schema": {"schema": …}}`` has its reply begun
with ``{`` for the model (part of the prompt, as a required tool call's start is: the recorded response token ids
are what the model wrote after it), and is sampled again, up to :data:`DEFAULT_TRIES` times, until the reply's
content is a JSON object that validates against the schema (``jsonschema``). The first reply that does is
returned; when none does, the last one is, as it came (a client that parses it sees why). Every reply returned
is one real sample of the policy, token-exact, so a trainer can learn from it like from any other.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from algorithms.serving.batching import SamplingError

DEFAULT_TRIES = 4
"""Samples a structured-output request may take before its last reply is returned unchecked."""


@dataclass(frozen=True)
class OutputCheck:
    """What a reply's content must be: a JSON object, valid against ``schema`` when one is given."""

    schema: dict[str, Any] | None = None

    def passes(self, content: str | None) -> bool:
        try:
            value = json.loads(content or "")
        except ValueError:
            return False
        if not isinstance(value, dict):
            return False
        if self.schema is None:
            return True
        import jsonschema

        return bool(jsonschema.Draft202012Validator(self.schema).is_valid(value))


def output_check(value: Any) -> OutputCheck | None:
    """The check a request's ``response_format`` asks for (None: plain text); :class:`SamplingError` names what
    is wrong with it."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputCheck()
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise SamplingError("response_format", "json_schema.schema must be a JSON Schema object")
        try:
            import jsonschema
        except ModuleNotFoundError as exc:  # pragma: no cover - the train extra brings it
            raise SamplingError("response_format", "json_schema needs the jsonschema package") from exc
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise SamplingError("response_format", f"json_schema.schema is not a valid schema: {exc.message}") from None
        return OutputCheck(schema)
    raise SamplingError("response_format", 'type must be "text", "json_object" or "json_schema"')
