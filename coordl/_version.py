"""The version of coordl, in one place: setup.cfg reads it (`attr:`), `coordl.__version__` re-exports it."""

__version__ = "0.1.0"
