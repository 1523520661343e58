"""What the optimizer LLM is shown, and how its rewrite is read back.

The critique sees what the store holds of a few rollouts, failures first: the task, the score, the messages the
agent's model was sent and its answers, tool calls, exceptions and error spans, and the attributes of each
reward (feedback text). The rewrite call gets the template, its placeholders and the critique. The two
instructions (the system messages) are Markdown files a user can replace (``critique_prompt_file``,
``edit_prompt_file``); the defaults live beside this module.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from importlib import resources as package_files
from pathlib import Path
from typing import Any

from algorithms.apo.evaluation import Outcome
from algorithms.apo.templates import placeholders
from lightning_store.contract import LightningStore
from lightning_store.resources import PromptTemplate
from lightning_store.transcript import build_transcript, text_of

_TAGGED = re.compile(r"<template>\s*?\n?(.*?)\n?\s*</template>", re.DOTALL)
_FENCED = re.compile(r"^```[\w-]*\n(.*)\n```$", re.DOTALL)


def instructions(path: Path | None, default: str) -> str:
    """The instruction file's text: the user's, else the packaged default (``critique.md`` or ``edit.md``)."""
    if path is not None:
        return Path(path).read_text()
    return package_files.files("algorithms.apo").joinpath("prompts", default).read_text()


def order_for_reflection(outcomes: Sequence[Outcome], count: int) -> list[Outcome]:
    """Failures first (not succeeded), then by rising score; the first ``count`` (stable, so seeded runs agree)."""
    ranked = sorted(outcomes, key=lambda o: (o.status == "succeeded", o.score))
    return ranked[:count]


async def report(store: LightningStore, outcomes: Sequence[Outcome], trace_chars: int) -> str:
    """The rollouts as Markdown, one section each, each trace cut to ``trace_chars`` characters."""
    traces = await asyncio.gather(*(_trace(store, o.rollout_id) for o in outcomes))  # one wait, not one each
    sections = []
    for number, (outcome, trace) in enumerate(zip(outcomes, traces, strict=True), start=1):
        verdict = "FAILED" if outcome.status != "succeeded" else ("OK" if outcome.score >= 1 else "LOW SCORE")
        lines = [f"### Rollout {number}: {verdict} (score {outcome.score:g}, status {outcome.status})"]
        lines.append("Task: " + _clip(json.dumps(outcome.task.input, ensure_ascii=False, default=str), 600))
        if outcome.error:
            lines.append("Error: " + _clip(outcome.error, 600))
        lines.append(_clip(trace, trace_chars) if trace else "(no trace recorded)")
        sections.append("\n".join(lines))
    return "\n\n".join(sections)


async def _trace(store: LightningStore, rollout_id: str) -> str:
    spans = (await store.query_spans(rollout_id, "latest")).items
    if not spans:
        return ""
    attempt_id = spans[0].attempt_id
    calls = await store.query_llm_calls([rollout_id], attempt_id=attempt_id)
    lines = []
    for event in build_transcript(spans, calls, full=True):
        kind = event["event"]
        if kind == "llm_call":
            for message in event.get("messages") or []:
                lines.append(f"[{message.get('role', '?')}] {text_of(message.get('content')) or ''}")
            if event.get("response") is not None:
                lines.append(f"[model answered] {event['response']}")
            for call in event.get("tool_calls") or []:
                lines.append(f"[model called tool] {call.get('name')}({call.get('arguments')})")
        elif kind == "llm_error":
            lines.append(f"[LLM call failed] {event.get('error')}")
        elif kind in ("tool", "operation"):
            error = f" ERROR {event['error']}" if event.get("error") else ""
            shown = f"input={_short(event.get('input'))} output={_short(event.get('output'))}"
            lines.append(f"[{kind} {event.get('name')}] {shown}{error}")
        elif kind == "reward":
            extra = {
                k: v for k, v in (event.get("attributes") or {}).items() if not str(k).startswith("agentlightning.")
            }
            feedback = f" feedback={_short(extra)}" if extra else ""
            lines.append(f"[reward] {event.get('value')}{feedback}")
        elif kind == "exception":
            lines.append(f"[exception] {event.get('type')}: {event.get('message')}")
        elif kind == "error":
            lines.append(f"[error in {event.get('name')}] {event.get('error')}")
        elif kind == "message":
            lines.append(f"[message] {event.get('text')}")
    return "\n".join(lines)


def _short(value: Any, width: int = 400) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return _clip(text, width)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 20] + f"… [{len(text) - width + 20} chars cut]"


def _template_block(name: str, template: PromptTemplate, others: Sequence[str]) -> str:
    names = sorted(placeholders(template))
    shown = ", ".join(f"{{{{ {n} }}}}" if template.engine == "jinja" else f"{{{n}}}" for n in names) or "(none)"
    lines = [f"Template name: {name}", f"Engine: {template.engine}", f"Placeholders: {shown}"]
    if others:
        lines.append("The agent also uses these templates, not being rewritten now: " + ", ".join(others))
    return "\n".join(lines) + f"\n\n<template>\n{template.template}\n</template>"


def critique_messages(
    system: str, name: str, template: PromptTemplate, others: Sequence[str], rollouts_report: str
) -> list[dict[str, str]]:
    block = _template_block(name, template, others)
    user = f"# Task: critique\n\n{block}\n\n## Rollouts (failures first)\n\n{rollouts_report}"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def edit_messages(
    system: str, name: str, template: PromptTemplate, others: Sequence[str], critique: str
) -> list[dict[str, str]]:
    user = (
        f"# Task: rewrite\n\n{_template_block(name, template, others)}\n\n## Critique\n\n{critique}\n\n"
        "Answer with the complete new template between <template> and </template>."
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def parse_rewrite(answer: str) -> str:
    """The new template in the answer: the last ``<template>…</template>`` block, else the whole answer without
    a surrounding code fence."""
    tagged = _TAGGED.findall(answer)
    if tagged:
        return str(tagged[-1])
    stripped = answer.strip()
    fenced = _FENCED.match(stripped)
    return fenced.group(1) if fenced else stripped
