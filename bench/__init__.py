"""attnstore's benchmark suites (`python -m bench --list`): one package per suite, each
with run.py; what suites share is in bench.common."""
