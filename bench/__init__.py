"""Krill benchmark harness: ``python -m bench.run [--quick] [--case NAME]``.

Prints one JSON line per case on stdout (progress goes to stderr). See bench/README.md.
"""
