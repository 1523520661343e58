"""Docs pages run as written: each test runs a tutorial's or how-to's shell commands in order, in a fresh directory,
and checks that what the page says the reader will see holds. The pages listen where the docs say (4747, 8000,
4317), so these tests never run at the same time: pytest-xdist gives this folder to one worker
(``pytest_xdist_make_scheduler`` in ``tests/conftest.py``)."""
