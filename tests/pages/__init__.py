"""Docs pages run as written: each test runs a tutorial's or how-to's shell commands in order, in a fresh directory,
and checks that what the page says the reader will see holds. They are the suite's longest tests and go out to the
workers first; the pages that listen on the default ports (4747, 8000) go to one worker together
(``ON_DEFAULT_PORTS`` in ``tests/conftest.py``), and a new page that does must be added there."""
