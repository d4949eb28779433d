"""The ``tokenwire`` command. It drives the services through their public interfaces."""

from tokenwire.cli._app import main

__all__ = ["main"]
