# cython: language_level=3
"""The round's drafting (see ``_propose.pyx``)."""
from .drafters._base cimport Asks


cdef int propose(Asks asks, list seqs, bint isolate, dict errors) except -1
