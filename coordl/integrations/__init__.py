"""coordl inside other frameworks' runners, each in a module of its own that imports the framework
only when used (`pip install -e '.[NAME]'`):

    ray.py    Ray Tune: the trials of a search on one node share that node's `coordl serve` daemon
"""
