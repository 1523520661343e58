"""The ``store`` command line: the core's commands (``serve``, ``migrate``, ``stats``, ``sql``, ``enqueue``,
``resources``, ``rollouts``, ``export``, ``prune``), each in a module of its own, and the root that gathers them
with the commands other packages register (``run``, ``train``, ``policy``, ``algorithms``: the
``lightning_store.commands`` entry points).

A room of the core's outer ring: it may import anything in ``lightning_store`` (the contract, the SQL store, the
client, export), and nothing of ``runners``, ``tracers``, ``adapters`` or ``algorithms`` except through those
entry points, loaded when the command runs. ``store`` is ``lightning_store.cli:main``; ``python -m
lightning_store.cli`` is the same command.
"""

from lightning_store.cli.root import app, main

__all__ = ["app", "main"]
