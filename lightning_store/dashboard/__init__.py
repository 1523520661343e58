"""The read-only web dashboard ``store serve`` shows at ``/dashboard`` (docs/dashboard.md; ADR 0013): pages
rendered on the server from the store's documented views, with their templates and static files here.

A room of the core's outer ring: it reads through the contract and the SQL views (``reader``), and imports
neither the command line nor the outer packages; the server installs it (``routes.install``).
"""
