# cython: language_level=3
"""Typed face of the core for the other Cython modules (controller, drafters).

They cimport these classes and call the ``cdef`` methods without Python in the
loop; only this module links libllama.
"""
from libc.stdint cimport int8_t, int32_t, uint8_t, uint32_t
from libcpp.vector cimport vector
from ._llama cimport (
    llama_model, llama_vocab, llama_context, llama_memory_t, llama_batch,
    llama_token, llama_pos, llama_seq_id, sd_lm_head, ggml_backend_dev_t, sd_stop_flag,
)
from libcpp.string cimport string


cdef class Model:
    cdef llama_model * model
    cdef const llama_vocab * vocab
    cdef readonly str path
    cdef readonly str arch
    cdef readonly int n_vocab
    cdef readonly int n_embd
    cdef readonly int n_embd_out
    cdef readonly int n_layer
    cdef readonly int n_mtp_layers     # llama.cpp: n_layer_nextn
    cdef readonly bint mtp_loaded
    cdef readonly bint is_recurrent
    cdef readonly bint is_hybrid
    cdef readonly bint use_extra_bufts
    cdef readonly object placement   # placement.Placement
    cdef readonly list devices       # the devices layers may go to (dicts, see devices())
    cdef readonly bint is_remote     # some layers may live on RPC servers
    cdef double _timeout             # seconds a remote call may take (0: no limit)
    cdef object _dead                # why an RPC failure made the model unusable, or None
    cdef vector[ggml_backend_dev_t] _devs
    cdef object __weakref__

    cdef vector[ggml_backend_dev_t] _devices(self, plc) except *
    cdef bint _remote_dead(self)
    cdef int _remote_failed(self, int rc, string why, str what) except -1

    cdef int _alive(self) except -1
    cdef int _check_token(self, object tok) except -1
    cdef bint is_eog_c(self, llama_token tok) noexcept nogil
    cdef int piece_c(self, llama_token tok, char * buf, int size) noexcept nogil
    cdef int tokenize_c(self, const char * text, int n, bint parse_special,
                        vector[int32_t] & out) except -1


cdef class Batch:
    cdef llama_batch b
    cdef readonly int capacity
    cdef readonly int n_embd
    cdef readonly int n_seq_max

    cdef int add_c(self, llama_token tok, llama_pos pos, llama_seq_id seq, bint output) except -1 nogil
    cdef int add_embd_c(self, llama_token tok, llama_pos pos, llama_seq_id seq, bint output,
                        const float * row) except -1 nogil
    cdef inline void clear_c(self) noexcept nogil:
        self.b.n_tokens = 0
    cdef int drop_seq_c(self, llama_seq_id seq, int n_drop) noexcept nogil


cdef class Context:
    cdef llama_context * ctx
    cdef llama_memory_t mem
    cdef readonly Model model
    cdef readonly int n_ctx
    cdef readonly int n_ctx_seq
    cdef readonly int n_batch
    cdef readonly int n_ubatch
    cdef readonly int n_seq_max
    cdef readonly int n_rollback       # llama.cpp: n_rs_seq, recurrent snapshots per sequence
    cdef readonly int n_threads
    cdef readonly bint is_mtp
    cdef readonly int n_vocab
    cdef readonly bint batch_invariant   # exact mode's kernels (see _batch_invariant.h)
    cdef readonly int invariant_rows     # batches known batch-invariant up to this many rows:
                                         # -1 any (CPU only), 0 not yet checked (a GPU, RPC)
    cdef readonly list backends          # names of the backends computing its rows (str)
    cdef readonly bint swa_full          # sliding-window layers keep every position, not a window
    cdef readonly bint kv_unified        # one KV stream for all sequences (else one each)
    cdef int _mtp_hidden        # hidden states for MTP (llama.cpp: nextn): 0 off, 1 masked, 2 dense
    cdef int _n_embd_in         # row width of embd input for this context type
    cdef int _last_n_tokens
    cdef vector[int32_t] _rollback_budget  # per seq: how far the last decode can still be rolled back
    cdef vector[int32_t] _seq_ntok         # per seq: tokens in the batch being decoded
    cdef bint _needs_rollback_guard
    cdef bint _rollback_trim    # decode graphs write only the snapshots a batch can roll back
    cdef int _busy
    cdef sd_stop_flag _stop     # what llama.cpp's abort callback reads (interrupt(), Ctrl-C)
    cdef public double decode_timeout   # the watchdog's limit per decode (s); 0: adaptive
    cdef double _s_per_token    # the slowest seconds per token of this context's decodes
    cdef int _n_outputs_max     # output rows a decode may ask for (llama.cpp asserts it)
    cdef int _n_views           # live buffer views of this context's outputs
    cdef llama_context * _closed_ctx   # closed while views were alive: freed with the last one
    cdef sd_lm_head * _head     # lazy LM head (None of it is used unless lazy_logits is on)
    cdef bint _lazy             # the last decode stopped at the norm: logits come from _head
    cdef bint _lazy_multi       # the lazy head may serve batches of several sequences
    cdef bint _head_installed   # made with lazy_logits: the head's graph callback is in place
    cdef bint _interleaved_ref  # interleaved batches decode with the CPU's reference kernels
    cdef vector[int32_t] _out_row   # batch index -> output row of the last decode, -1: none
    cdef object _aborted        # (call, llama.cpp's message) once an abort has freed it
    cdef readonly Context other # the target whose weights an EAGLE-3 draft borrows (ctx_other)
    cdef vector[int32_t] _layer_inp  # layers whose inputs every decode keeps (set_layer_inputs)
    cdef bint _layer_inp_ok     # the last decode made them (False until one has)
    cdef int _n_feat            # DFlash drafts: width of a feature row (target layers x n_embd)
    cdef readonly bint causal_attn   # False: every row attends to the whole sequence (DFlash)
    cdef readonly long long n_decodes  # decodes run (how a drafter batches is counted by them)
    # decodes whose shape (rows, outputs, most rows of one sequence) differed from the one
    # before: each is a new compute graph, which a CUDA backend runs uncaptured, then captures
    cdef readonly long long n_shape_changes
    cdef int _shape_rows, _shape_out, _shape_most
    cdef readonly long long n_encodes  # encoder calls run (EAGLE-3)

    cdef int _enter(self) except -1
    cdef void _leave(self) noexcept
    cdef void _free_ptr(self, llama_context * ctx) noexcept
    cdef void _free(self) noexcept
    cdef void _free_closed(self) noexcept
    cdef int _alive(self) except -1
    cdef int _check_abort(self, str what) except -1
    cdef int _row_index(self, int i, str what) except -1
    cdef int decode_c(self, Batch batch, bint grammar=*) except -1
    cdef float * logits_c(self, int i) noexcept nogil
    cdef float * masked_logits_c(self, int i, const uint32_t * bits) noexcept nogil
    cdef bint logits_ready_c(self, int i) noexcept nogil
    cdef void prepare_logits_c(self, int i0, int n) noexcept nogil
    cdef void prepare_logits_rows_c(self, const vector[int] & rows) noexcept nogil
    cdef float * mtp_hidden_c(self, int i) noexcept nogil
    cdef float * layer_inp_c(self, int lid, int i) noexcept nogil
    cdef int encode_c(self, Batch batch) except -1
    cdef int seq_rm_c(self, llama_seq_id seq, llama_pos p0, llama_pos p1) except -1
    cdef llama_pos pos_max_c(self, llama_seq_id seq) noexcept nogil
    cdef llama_pos pos_min_c(self, llama_seq_id seq) noexcept nogil
    cdef int save_state_c(self, llama_seq_id seq, uint32_t flags, vector[uint8_t] & out) except -1
    cdef int load_state_c(self, llama_seq_id seq, uint32_t flags, const vector[uint8_t] & data) except -1


cdef class TargetView:
    cdef Context _ctx
