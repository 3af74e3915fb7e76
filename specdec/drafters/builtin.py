"""Importing this module registers the built-in drafters."""
from . import ngram, ngram_map, ngram_cache  # noqa: F401
from . import draft_model, layerskip  # noqa: F401,E402
from . import suffix  # noqa: F401,E402
from . import mtp  # noqa: F401,E402
