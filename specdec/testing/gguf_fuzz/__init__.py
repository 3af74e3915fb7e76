"""Mutation fuzzing of model loading: mutated GGUF files, each loaded in a child process.

A mutation edits one or more fields of a valid GGUF file: raw bytes of the header, a
metadata entry's type/length/value, a tensor info's n_dims/dims/type/offset; or the
file's meaning with a consistent structure (a zero or huge hyperparameter, a missing
key, another architecture, a vocabulary whose arrays disagree, a tensor with another
shape). Case ``i`` of seed ``s`` is always the same file, so a crash is reproducible
from its number.

The child loads each file with :class:`specdec.Model`, creates a context and
generates a few tokens, and prints one line per case. llama.cpp aborts the whole
process on a failed ``GGML_ASSERT``, so the parent runs batches of cases in a child,
notes a child that dies (the case it was on is the crash) and starts the next batch
after it. Run by hand::

    python -m specdec.testing.gguf_fuzz --cases 1000 model.gguf [more.gguf ...]

``editor`` reads and writes GGUF files (:class:`GGUFFile`), ``mutators`` changes them,
``runner`` runs the cases in children and reports.
"""
from .editor import Entry, GGUFFile, Sparse, Tensor, dump, header_base, load
from .mutators import GENERATED, generate, mutate, raw_mutation
from .runner import Report, exercise, main, run

__all__ = ["GENERATED", "Entry", "GGUFFile", "Report", "Sparse", "Tensor", "dump", "exercise",
           "generate", "header_base", "load", "main", "mutate", "raw_mutation", "run"]
