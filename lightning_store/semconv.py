"""Span names and attribute keys that the tracers write and the adapters read (docs/reference/spans.md).

They are Agent Lightning 0.3's names, so that spans written by either project read the same; where the
OpenTelemetry GenAI semantic conventions define an attribute (``gen_ai.*``, ``error.type``, ``exception.*``)
the emitters write that one too.
"""

from __future__ import annotations

ROLLOUT_ID = "agentlightning.rollout_id"
ATTEMPT_ID = "agentlightning.attempt_id"
SPAN_SEQUENCE_ID = "agentlightning.span_sequence_id"

ANNOTATION = "agentlightning.annotation"
"""Span name of rewards (and other annotations)."""
MESSAGE = "agentlightning.message"
OBJECT = "agentlightning.object"
EXCEPTION = "agentlightning.exception"
OPERATION = "agentlightning.operation"

REWARD_PREFIX = "agentlightning.reward"
"""``agentlightning.reward.{i}.name`` and ``….value``; dimension 0 is the primary reward."""
MESSAGE_BODY = "agentlightning.message.body"
OBJECT_TYPE = "agentlightning.object.type"
OBJECT_LITERAL = "agentlightning.object.literal"
OBJECT_JSON = "agentlightning.object.json"
OPERATION_NAME = "agentlightning.operation.name"
OPERATION_INPUT = "agentlightning.operation.input"
OPERATION_OUTPUT = "agentlightning.operation.output"

TOOL_NAME = "gen_ai.tool.name"
"""GenAI semantic convention: the tool an operation ran (its span is ``execute_tool {name}``)."""
TOOL_CALL_ID = "gen_ai.tool.call.id"
OPERATION_KIND = "gen_ai.operation.name"
ERROR_TYPE = "error.type"


def reward_name(index: int) -> str:
    return f"{REWARD_PREFIX}.{index}.name"


def reward_value(index: int) -> str:
    return f"{REWARD_PREFIX}.{index}.value"
