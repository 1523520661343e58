"""Which optional extras this installation lacks, and the mark that hides a command needing one.

A plain ``pip install lightning-store`` has no torch. The ``store`` CLI imports every command's module at start
(through the ``lightning_store.commands`` entry points), so a module that a command of the ``train`` extra lives in
must import without torch (torch and transformers imported inside the commands), and its command carries the
attribute that ``lightning_store.cli`` reads (``missing_extra``): then a plain install hides it from
``store --help``, and running it says which extra to install, in one line, with exit status 2. For a new command
of the ``train`` extra (a ``typer.Typer`` group or a function)::

    policy = needs_train_extra(typer.Typer(help="Serve a policy."))

and register it in ``pyproject.toml`` under ``[project.entry-points."lightning_store.commands"]``.

``store train`` and ``store algorithms`` are not marked: what they need depends on the algorithm (APO trains no
weights and runs without torch), so they check each algorithm (``algorithms.cli``: one whose module fails to
import for lack of torch, or whose ``needs_policy`` is set) and print :func:`install_hint` themselves.
"""

from __future__ import annotations

import importlib.util
from typing import TypeVar

T = TypeVar("T")

TRAIN_MODULES = ("torch", "transformers")
"""What the ``train`` extra installs that its commands cannot do without."""

MISSING_EXTRA = "missing_extra"
"""The attribute ``lightning_store.cli`` reads on an entry point's target (see
``lightning_store.cli.root.MISSING_EXTRA``; not imported from there, so that this module stays free of the CLI)."""


def train_extra_missing() -> str | None:
    """``"train"`` when torch or transformers cannot be imported here, else None. Looks for the modules without
    importing them (a few milliseconds, where importing torch takes a second)."""
    for name in TRAIN_MODULES:
        try:
            if importlib.util.find_spec(name) is None:
                return "train"
        except (ImportError, ValueError):  # a parent package that fails, or a module without a spec
            return "train"
    return None


def needs_train_extra(target: T) -> T:
    """Marks a command (a ``typer.Typer`` or a function registered as an entry point) as needing the ``train``
    extra: where it is missing, ``store --help`` leaves the command out and running it prints the install hint."""
    setattr(target, MISSING_EXTRA, train_extra_missing())
    return target


TRAIN_INSTALL = "pip install 'lightning-store[train]'"
"""How to install the ``train`` extra."""


def install_hint(command: str) -> str:
    """The line a command prints (then exits 2) where the ``train`` extra it needs is missing: the same as
    ``lightning_store.cli`` prints for a command marked with :func:`needs_train_extra`."""
    return f"store {command} needs the 'train' extra: {TRAIN_INSTALL}"


def lacks_train_modules(error: ImportError) -> bool:
    """Whether ``error`` (from importing an algorithm) is the ``train`` extra's absence: torch or transformers
    could not be imported, and they are missing here."""
    root = (error.name or "").split(".")[0]
    return root in TRAIN_MODULES and train_extra_missing() is not None
