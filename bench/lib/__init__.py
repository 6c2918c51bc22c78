"""Helpers of the benchmarks in bench/, none a benchmark itself (bench/README.md lists both).

A benchmark runs as `.venv/bin/python bench/X.py`, which puts bench/ first on sys.path, and
imports these as `from lib import report`. loader_child.py and before.py are run as scripts.
"""
