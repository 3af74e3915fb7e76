# cython: language_level=3
# distutils: language = c++
"""The core: a thin, fast and safe face of libllama.

``GGML_ASSERT`` ends in ``abort()``, which Python cannot catch. Two defences:
llama.cpp calls that can abort on this thread go through ``_abort.h``, which
turns the abort into :class:`LlamaAbortError` and frees what was being built
or used; and the checks here, before the call, keep the asserts that run in
ggml's compute threads (where no exception can unwind) from being reached.
The core knows nothing of speculation; the controller and the drafters build
on its typed methods (see ``_core.pxd``).

Why one extension made of include files: llama.cpp is linked statically, and its global
state (backend registry, log callback, abort handler, RPC connections) must exist once per
process. So every part that calls libllama is compiled into this one module; each part
lives in its own ``.pxi`` next to this file, and the other extensions reach libllama only
through the ``cdef`` methods ``_core.pxd`` declares.
"""
from cpython.buffer cimport PyBUF_WRITABLE
from cpython.exc cimport PyErr_CheckSignals
from libc.stdint cimport int8_t, int32_t, uint8_t, uint32_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy
from libcpp.vector cimport vector
from libcpp.string cimport string
from libcpp cimport bool as cbool

from ._llama cimport *

cimport cython
import atexit
import collections
import logging
import os
import signal
import threading
import weakref

import numpy as np

from ._archs import (BLOCK_DRAFT_ARCHS, LAYER_DRAFT_ARCHS, LAYER_INPUT_ARCHS, LAZY_MTP_ARCHS, MTP_ARCHS,
                     MTP_MULTI_HEAD_ARCHS, MTP_PRUNED_ARCHS, PARTIAL_ROLLBACK_ARCHS,
                     ROLLBACK_TRIM_ARCHS)
from ._gguf_check import check_gguf
from ._gguf_layout import GGUFError
from .placement import Placement

include "_log.pxi"          # llama.cpp's log -> logging; signals held back by C callbacks
include "_errors.pxi"       # exceptions; llama.cpp's aborts turned into them
include "_args.pxi"         # argument checks of the Python API
include "_devices.pxi"      # backends, devices, RPC servers
include "_chat_template.pxi"  # llama.cpp's built-in chat templates
include "_views.pxi"        # read-only numpy views of a context's outputs
include "_model.pxi"        # Model
include "_batch.pxi"        # Batch
include "_lazy_head.pxi"    # the lazy LM head's part of a decode
include "_context_params.pxi"  # a context's llama.cpp parameters, checked
include "_stop.pxi"         # stopping a call midway: the stop flag's callbacks, the watchdog
include "_context_open.pxi"    # Context.__init__'s work: llama.cpp's context made and read back
include "_context_decode.pxi"  # a Context's batch checked, decoded or encoded
include "_context_memory.pxi"  # a Context's sequences: removed, copied, saved and restored
include "_context_hidden.pxi"  # the hidden rows a Context hands to drafts (MTP, EAGLE-3)
include "_batch_shapes.pxi"    # every batch shape decoded: warm-up, batch invariance
include "_context.pxi"      # Context
include "_target_view.pxi"  # TargetView
