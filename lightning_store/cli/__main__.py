"""``python -m lightning_store.cli``: the ``store`` command."""

from lightning_store.cli.root import main

main()
