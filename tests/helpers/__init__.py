"""Helpers shared by more than one test module (no tests here).

Test modules import from this package, never from one another. Fixtures that several
folders share live in the conftest.py files (e.g. ``tokenizer`` in tests/conftest.py).
"""
