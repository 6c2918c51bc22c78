"""The `coordl` command: commands.py is the entry point; one module per command group."""

from .commands import main

__all__ = ["main"]
