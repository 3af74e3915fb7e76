"""Importing this module registers the built-in drafters."""
from . import ngram  # noqa: F401
