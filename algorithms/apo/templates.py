"""The placeholders of a prompt template and the check a proposed rewrite must pass before any rollout runs.

A rewrite keeps its template's engine (an f-string stays an f-string, Jinja stays Jinja) and exactly its
placeholders: the agent formats the template with the fields it knows, so a dropped placeholder loses task data
and an added one fails at format time in every rollout. Both are caught here, with a reason, for nothing.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import jinja2
import jinja2.meta

from lightning_store.resources import PromptTemplate

_JINJA = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)


class TemplateError(ValueError):
    """The template does not parse or does not render."""


def placeholders(template: PromptTemplate) -> set[str]:
    """The names the template reads: ``{name}`` fields of an f-string (``{name.attr}``/``{name[0]}`` count as
    ``name``), undeclared variables of a Jinja template. Raises :class:`TemplateError` when it does not parse."""
    if template.engine == "jinja":
        try:
            return set(jinja2.meta.find_undeclared_variables(_JINJA.parse(template.template)))
        except jinja2.TemplateSyntaxError as error:
            raise TemplateError(f"Jinja syntax error on line {error.lineno}: {error.message}") from None
    if template.engine == "f-string":
        try:
            fields = [field for _, field, _, _ in string.Formatter().parse(template.template) if field is not None]
        except ValueError as error:
            raise TemplateError(f"not a valid format string: {error}") from None
        names = set()
        for field in fields:
            name = field.split(".", 1)[0].split("[", 1)[0]
            if not name or name.isdigit():
                raise TemplateError(f"positional field {{{field}}}: use named placeholders")
            names.add(name)
        return names
    raise TemplateError(f"the {template.engine!r} engine cannot be checked; use f-string or jinja")


def render(template: PromptTemplate, values: dict[str, object]) -> str:
    """The template filled with ``values`` (every placeholder must have one)."""
    try:
        if template.engine == "jinja":
            return _JINJA.from_string(template.template).render(**values)
        return template.template.format(**values)
    except (jinja2.TemplateError, KeyError, IndexError, ValueError, AttributeError, TypeError) as error:
        raise TemplateError(f"does not render: {type(error).__name__}: {error}") from None


@dataclass(frozen=True)
class Verdict:
    """Whether a rewrite may be evaluated; ``reason`` says why not."""

    ok: bool
    reason: str = ""


def check_rewrite(parent: PromptTemplate, text: str) -> Verdict:
    """Is ``text`` an acceptable rewrite of ``parent``: not empty, not unchanged, parses, keeps exactly the
    parent's placeholders, and renders with a sample value for each."""
    if not text.strip():
        return Verdict(False, "empty rewrite")
    if text.strip() == parent.template.strip():
        return Verdict(False, "unchanged")
    child = PromptTemplate(template=text, engine=parent.engine)
    try:
        wanted, got = placeholders(parent), placeholders(child)
    except TemplateError as error:
        return Verdict(False, str(error))
    problems = []
    if dropped := sorted(wanted - got):
        problems.append("drops " + ", ".join(_shown(n, parent) for n in dropped))
    if added := sorted(got - wanted):
        problems.append("adds " + ", ".join(_shown(n, parent) for n in added))
    if problems:
        return Verdict(False, "; ".join(problems))
    sample: dict[str, object] = {name: f"<{name}>" for name in got}
    try:
        render(parent, sample)
    except TemplateError:
        return Verdict(True)  # the parent needs richer values than a sample string ({x.attr}, {n:.2f}): not checkable
    try:
        render(child, sample)
    except TemplateError as error:
        return Verdict(False, str(error))
    return Verdict(True)


def _shown(name: str, template: PromptTemplate) -> str:
    return f"{{{{ {name} }}}}" if template.engine == "jinja" else f"{{{name}}}"
