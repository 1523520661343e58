"""A small DOM of a dashboard page (stdlib ``html.parser``), enough to find elements by attribute and read their
text, so that tests compare what a page shows with what SQL returns."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    children: list[Element | str] = field(default_factory=list)

    def text(self) -> str:
        """Its text content (as the DOM's ``textContent``)."""
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def walk(self) -> Iterator[Element]:
        for child in self.children:
            if isinstance(child, Element):
                yield child
                yield from child.walk()

    def all(self, match: Callable[[Element], bool]) -> list[Element]:
        return [e for e in self.walk() if match(e)]

    def testids(self, testid: str) -> list[Element]:
        return self.all(lambda e: e.attrs.get("data-testid") == testid)

    def testid(self, testid: str) -> Element:
        found = self.testids(testid)
        assert len(found) == 1, f"{len(found)} elements with data-testid={testid!r}"
        return found[0]

    def cells(self) -> dict[str, Element]:
        """Its descendants with a ``data-col``, by column."""
        return {e.attrs["data-col"]: e for e in self.all(lambda e: "data-col" in e.attrs)}

    def hrefs(self) -> list[str]:
        return [e.attrs["href"] for e in self.all(lambda e: e.tag == "a" and "href" in e.attrs)]


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(element)
        if tag not in VOID:
            self.stack.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(Element(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for depth in range(len(self.stack) - 1, 0, -1):
            if self.stack[depth].tag == tag:
                del self.stack[depth:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(data)


def parse(html: str) -> Element:
    builder = _Builder()
    builder.feed(html)
    builder.close()
    return builder.root


def number(text: str) -> float | None:
    """A ``data-value``: the exact number the page was given, or None for an empty one."""
    return float(text) if text != "" else None
