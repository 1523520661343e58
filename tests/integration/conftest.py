"""Fixtures of the Agent Lightning compatibility tests (:mod:`tests.integration.agl_servers`): ``agl_python``,
``server_database`` (indirect: ``"sqlite"`` or ``"postgres"``) and ``served``. A module that defines a fixture of
the same name uses its own."""

from tests.integration.agl_servers import agl_python, served, server_database

__all__ = ["agl_python", "served", "server_database"]
