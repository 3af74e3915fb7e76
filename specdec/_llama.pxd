# cython: language_level=3
"""Declarations of the libllama API used by specdec (llama.cpp @ 0c1e570).

Only ``_core`` calls into libllama; every other module goes through ``_core``'s
typed methods, so that one static copy of llama.cpp lives in the process.
"""
from libc.stdint cimport int8_t, int32_t, int64_t, uint32_t, uint64_t, uint8_t
from libcpp cimport bool as cbool
from libcpp.string cimport string
from libcpp.vector cimport vector

cdef extern from "ggml.h" nogil:
    enum ggml_log_level:
        GGML_LOG_LEVEL_NONE
        GGML_LOG_LEVEL_DEBUG
        GGML_LOG_LEVEL_INFO
        GGML_LOG_LEVEL_WARN
        GGML_LOG_LEVEL_ERROR
        GGML_LOG_LEVEL_CONT
    ctypedef void (*ggml_log_callback)(ggml_log_level level, const char * text, void * user_data) noexcept nogil
    ctypedef cbool (*ggml_abort_callback)(void * data) noexcept nogil
    struct ggml_tensor:
        pass
    ctypedef cbool (*ggml_backend_sched_eval_callback)(ggml_tensor * t, cbool ask, void * user_data) noexcept nogil

cdef extern from "ggml-backend.h" nogil:
    struct ggml_backend_device:
        pass
    struct ggml_backend_reg:
        pass
    ctypedef ggml_backend_device * ggml_backend_dev_t
    ctypedef ggml_backend_reg * ggml_backend_reg_t
    enum ggml_backend_dev_type:
        GGML_BACKEND_DEVICE_TYPE_CPU
        GGML_BACKEND_DEVICE_TYPE_GPU
        GGML_BACKEND_DEVICE_TYPE_IGPU
        GGML_BACKEND_DEVICE_TYPE_ACCEL
        GGML_BACKEND_DEVICE_TYPE_META
    const char * ggml_backend_dev_name(ggml_backend_dev_t device)
    const char * ggml_backend_dev_description(ggml_backend_dev_t device)
    void ggml_backend_dev_memory(ggml_backend_dev_t device, size_t * free, size_t * total)
    ggml_backend_dev_type ggml_backend_dev_type_of "ggml_backend_dev_type" (ggml_backend_dev_t device)
    ggml_backend_reg_t ggml_backend_dev_backend_reg(ggml_backend_dev_t device)
    const char * ggml_backend_reg_name(ggml_backend_reg_t reg)
    size_t ggml_backend_reg_dev_count(ggml_backend_reg_t reg)
    ggml_backend_dev_t ggml_backend_reg_dev_get(ggml_backend_reg_t reg, size_t index)
    void * ggml_backend_reg_get_proc_address(ggml_backend_reg_t reg, const char * name)
    size_t ggml_backend_reg_count()
    ggml_backend_reg_t ggml_backend_reg_get(size_t index)
    size_t ggml_backend_dev_count()
    ggml_backend_dev_t ggml_backend_dev_get(size_t index)
    ggml_backend_dev_t ggml_backend_dev_by_name(const char * name)
    enum ggml_type:
        GGML_TYPE_F32
        GGML_TYPE_COUNT
    struct ggml_traits "ggml_type_traits":
        const char * type_name
        int64_t blck_size
        size_t type_size
        cbool is_quantized
        void * to_float
    const ggml_traits * ggml_get_type_traits(ggml_type type)

cdef extern from "ggml-cpu.h" nogil:
    struct ggml_type_traits_cpu:
        void * from_float
        void * vec_dot
        ggml_type vec_dot_type
    const ggml_type_traits_cpu * ggml_get_type_traits_cpu(ggml_type type)

cdef extern from "llama.h" nogil:
    ctypedef int32_t llama_pos
    ctypedef int32_t llama_token
    ctypedef int32_t llama_seq_id
    cdef int LLAMA_TOKEN_NULL

    struct llama_vocab:
        pass
    struct llama_model:
        pass
    struct llama_context:
        pass
    struct llama_memory_i:
        pass
    ctypedef llama_memory_i * llama_memory_t

    enum llama_vocab_type:
        LLAMA_VOCAB_TYPE_NONE
        LLAMA_VOCAB_TYPE_SPM
        LLAMA_VOCAB_TYPE_BPE
        LLAMA_VOCAB_TYPE_WPM
        LLAMA_VOCAB_TYPE_UGM
        LLAMA_VOCAB_TYPE_RWKV
        LLAMA_VOCAB_TYPE_PLAMO2

    enum llama_load_mode:
        LLAMA_LOAD_MODE_AUTO
        LLAMA_LOAD_MODE_NONE
        LLAMA_LOAD_MODE_MMAP

    enum llama_context_type:
        LLAMA_CONTEXT_TYPE_DEFAULT
        LLAMA_CONTEXT_TYPE_MTP

    enum llama_flash_attn_type:
        LLAMA_FLASH_ATTN_TYPE_AUTO
        LLAMA_FLASH_ATTN_TYPE_DISABLED
        LLAMA_FLASH_ATTN_TYPE_ENABLED

    ctypedef struct llama_chat_message:
        const char * role
        const char * content

    ctypedef struct llama_batch:
        int32_t n_tokens
        llama_token * token
        float * embd
        llama_pos * pos
        int32_t * n_seq_id
        llama_seq_id ** seq_id
        int8_t * logits

    enum llama_split_mode:
        LLAMA_SPLIT_MODE_NONE
        LLAMA_SPLIT_MODE_LAYER
        LLAMA_SPLIT_MODE_ROW
        LLAMA_SPLIT_MODE_TENSOR

    struct llama_model_params:
        ggml_backend_dev_t * devices
        int32_t n_gpu_layers
        llama_split_mode split_mode
        llama_load_mode load_mode
        int32_t main_gpu
        const float * tensor_split
        cbool vocab_only
        cbool check_tensors
        cbool use_extra_bufts
        cbool no_host
        cbool no_alloc
        cbool load_mtp
        cbool (*progress_callback)(float progress, void * user_data) noexcept nogil
        void * progress_callback_user_data

    struct llama_context_params:
        uint32_t n_ctx
        uint32_t n_batch
        uint32_t n_ubatch
        uint32_t n_seq_max
        uint32_t n_rs_seq
        uint32_t n_outputs_max
        uint32_t n_outputs_max_per_seq
        int32_t n_threads
        int32_t n_threads_batch
        llama_context_type ctx_type
        llama_flash_attn_type flash_attn_type
        ggml_backend_sched_eval_callback cb_eval
        void * cb_eval_user_data
        ggml_abort_callback abort_callback
        void * abort_callback_data
        cbool embeddings
        cbool offload_kqv
        cbool no_perf
        cbool op_offload
        cbool swa_full
        cbool kv_unified
        llama_context * ctx_other

    struct llama_perf_context_data:
        double t_start_ms
        double t_load_ms
        double t_p_eval_ms
        double t_eval_ms
        int32_t n_p_eval
        int32_t n_eval
        int32_t n_reused

    ctypedef uint32_t llama_state_seq_flags
    cdef uint32_t LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY

    llama_model_params llama_model_default_params()
    llama_context_params llama_context_default_params()
    void llama_backend_init()
    void llama_log_set(ggml_log_callback log_callback, void * user_data)
    const char * llama_print_system_info()
    int32_t llama_chat_apply_template(const char * tmpl, const llama_chat_message * chat,
                                      size_t n_msg, cbool add_ass, char * buf,
                                      int32_t length) except +
    int32_t llama_chat_builtin_templates(const char ** output, size_t len)
    size_t llama_max_devices()
    cbool llama_supports_rpc()

    void llama_model_free(llama_model * model)
    void llama_free(llama_context * ctx)

    uint32_t llama_n_ctx(const llama_context * ctx)
    uint32_t llama_n_ctx_seq(const llama_context * ctx)
    uint32_t llama_n_batch(const llama_context * ctx)
    uint32_t llama_n_ubatch(const llama_context * ctx)
    uint32_t llama_n_seq_max(const llama_context * ctx)
    uint32_t llama_n_rs_seq(const llama_context * ctx)
    llama_memory_t llama_get_memory(const llama_context * ctx)

    const llama_vocab * llama_model_get_vocab(const llama_model * model)
    int32_t llama_model_n_ctx_train(const llama_model * model)
    int32_t llama_model_n_embd(const llama_model * model)
    int32_t llama_model_n_embd_inp(const llama_model * model)
    int32_t llama_model_n_embd_out(const llama_model * model)
    int32_t llama_model_n_layer(const llama_model * model)
    int32_t llama_model_n_layer_nextn(const llama_model * model)
    int32_t llama_model_n_swa(const llama_model * model)
    int32_t llama_model_meta_val_str(const llama_model * model, const char * key, char * buf, size_t buf_size)
    int32_t llama_model_desc(const llama_model * model, char * buf, size_t buf_size)
    uint64_t llama_model_size(const llama_model * model)
    uint64_t llama_model_n_params(const llama_model * model)
    const char * llama_model_chat_template(const llama_model * model, const char * name)
    cbool llama_model_has_encoder(const llama_model * model)
    cbool llama_model_is_recurrent(const llama_model * model)
    cbool llama_model_is_hybrid(const llama_model * model)

    int llama_vocab_type_of "llama_vocab_type" (const llama_vocab * vocab)
    int32_t llama_vocab_n_tokens(const llama_vocab * vocab)
    const char * llama_vocab_get_text(const llama_vocab * vocab, llama_token token)
    cbool llama_vocab_is_eog(const llama_vocab * vocab, llama_token token)
    cbool llama_vocab_is_control(const llama_vocab * vocab, llama_token token)
    llama_token llama_vocab_bos(const llama_vocab * vocab)
    llama_token llama_vocab_eos(const llama_vocab * vocab)
    llama_token llama_vocab_eot(const llama_vocab * vocab)
    llama_token llama_vocab_nl(const llama_vocab * vocab)
    llama_token llama_vocab_sep(const llama_vocab * vocab)
    cbool llama_vocab_get_add_bos(const llama_vocab * vocab)
    cbool llama_vocab_get_add_eos(const llama_vocab * vocab)
    llama_token llama_vocab_mask(const llama_vocab * vocab)


    llama_pos llama_memory_seq_pos_min(llama_memory_t mem, llama_seq_id seq_id)
    llama_pos llama_memory_seq_pos_max(llama_memory_t mem, llama_seq_id seq_id)


    llama_batch llama_batch_init(int32_t n_tokens, int32_t embd, int32_t n_seq_max)
    void llama_batch_free(llama_batch batch)
    int32_t llama_decode(llama_context * ctx, llama_batch batch)
    void llama_set_n_threads(llama_context * ctx, int32_t n_threads, int32_t n_threads_batch)
    float * llama_get_logits_ith(llama_context * ctx, int32_t i)
    void llama_set_causal_attn(llama_context * ctx, cbool causal_attn)

    llama_perf_context_data llama_perf_context(const llama_context * ctx)
    void llama_perf_context_reset(llama_context * ctx)

# C++-only staging API (src/llama-ext.h): mangled names, so this module is compiled as C++.
cdef extern from "llama-ext.h" nogil:
    void llama_set_embeddings_nextn(llama_context * ctx, cbool value, cbool masked)
    void llama_set_nextn_layer_offset(llama_context * ctx, int32_t offset)
    float * llama_get_embeddings_nextn(llama_context * ctx)
    float * llama_get_embeddings_nextn_ith(llama_context * ctx, int32_t i)
    void llama_set_embeddings_layer_inp(llama_context * ctx, uint32_t lid, cbool value)
    float * llama_get_embeddings_layer_inp(llama_context * ctx, uint32_t lid)
    const int32_t * llama_model_target_layer_ids(const llama_model * model)
    uint32_t llama_model_target_layer_ids_n(const llama_model * model)


cdef extern from "_abort.h" nogil:
    # llama.cpp calls with GGML_ABORT on the calling thread turned into a failure (see _abort.h)
    void sd_abort_install()
    cbool sd_abort_take(string & out)
    llama_model * sd_model_load(const char * path, llama_model_params p)
    llama_context * sd_init_from_model(llama_model * model, llama_context_params p)
    int32_t sd_decode(llama_context * ctx, llama_batch batch)
    int32_t sd_encode(llama_context * ctx, llama_batch batch)
    int32_t sd_tokenize(const llama_vocab * vocab, const char * text, int32_t text_len,
                        llama_token * tokens, int32_t n_tokens_max, cbool add_special,
                        cbool parse_special)
    int32_t sd_detokenize(const llama_vocab * vocab, const llama_token * tokens, int32_t n_tokens,
                          char * text, int32_t text_len_max, cbool remove_special,
                          cbool unparse_special)
    int32_t sd_token_to_piece(const llama_vocab * vocab, llama_token token, char * buf,
                              int32_t length, int32_t lstrip, cbool special)
    cbool sd_memory_seq_rm(llama_memory_t mem, llama_seq_id seq, llama_pos p0, llama_pos p1)
    cbool sd_memory_seq_cp(llama_memory_t mem, llama_seq_id src, llama_seq_id dst, llama_pos p0,
                           llama_pos p1)
    cbool sd_memory_seq_keep(llama_memory_t mem, llama_seq_id seq)
    cbool sd_memory_clear(llama_memory_t mem, cbool data)
    size_t sd_state_seq_get_size(llama_context * ctx, llama_seq_id seq, llama_state_seq_flags flags)
    size_t sd_state_seq_get_data(llama_context * ctx, uint8_t * dst, size_t size, llama_seq_id seq,
                                 llama_state_seq_flags flags)
    size_t sd_state_seq_set_data(llama_context * ctx, const uint8_t * src, size_t size,
                                 llama_seq_id seq, llama_state_seq_flags flags)


cdef extern from "_rs_graph.h" nogil:
    # per-decode snapshot count of the recurrent graph (see _rs_graph.h)
    void sd_set_graph_n_rs_seq(llama_context * ctx, uint32_t n)


cdef extern from "_batch_invariant.h" nogil:
    # the CPU's reference kernels: batch-invariant (exact mode), and faster for a batch of
    # several sequences' rows (see _batch_invariant.h)
    int sd_set_cpu_ref_kernels(llama_context * ctx, cbool on)
    cbool sd_flash_attn(llama_context * ctx)
    const int SD_FA_TILE_Q
    vector[string] sd_backend_names(llama_context * ctx)
    ggml_backend_dev_t sd_ref_cpu_device_of(ggml_backend_dev_t base)


cdef extern from "_graph_check.h" nogil:
    # a new context's reserved graph against the kernels that will compute it (see the header)
    string sd_check_graph(llama_context * ctx, const vector[cbool] & computable)


cdef extern from "_lm_head.h" nogil:
    # the lazy LM head (see _lm_head.h)
    cppclass sd_lm_head:
        cbool enabled
        cbool batch_invariant
        cbool active
        cbool grammar
        int upto
        int n_threads
        int state
        const char * why
        long long n_embd
        long long n_vocab
        int n_rows
        cbool captured
        int fused
        cbool is_q8_0
        vector[float] logits
        vector[uint8_t] done
        long long n_masked
        long long n_passes
        long long n_whole
    cbool sd_lm_head_cb(ggml_tensor * t, cbool ask, void * user_data) noexcept
    cbool sd_lm_head_wanted(const sd_lm_head * h)
    void sd_lm_head_compute(sd_lm_head * h, int r0, int r1)
    void sd_lm_head_compute_rows(sd_lm_head * h, const int * rows, int n)
    void sd_lm_head_compute_masked(sd_lm_head * h, int r, const uint32_t * bits)
    long long sd_mask_count(const uint32_t * bits, long long n_vocab)
    void sd_lm_head_begin(sd_lm_head * h)
    void sd_lm_head_end(sd_lm_head * h)


cdef extern from "_remote.h" nogil:
    # calls that may talk to an RPC server, safe against a dead one (see _remote.h)
    int SD_REMOTE_OK, SD_REMOTE_ABORTED, SD_REMOTE_TIMEOUT, SD_REMOTE_EXCEPTION
    int sd_remote_load(const char * path, llama_model_params p, llama_model ** out,
                       double timeout_s, string & why)
    int sd_remote_init(llama_model * model, llama_context_params p, llama_context ** out,
                       double timeout_s, string & why)
    int sd_remote_decode(llama_context * ctx, llama_batch b, cbool trim, uint32_t n_trim,
                         uint32_t n_rs_seq, int32_t * rc, double timeout_s, string & why)
    int sd_remote_state_get(llama_context * ctx, uint8_t * dst, size_t n, llama_seq_id seq,
                            llama_state_seq_flags flags, size_t * got, double timeout_s, string & why)
    int sd_remote_state_set(llama_context * ctx, const uint8_t * src, size_t n, llama_seq_id seq,
                            llama_state_seq_flags flags, size_t * got, double timeout_s, string & why)
    int sd_remote_clear(llama_context * ctx, cbool data, double timeout_s, string & why)
    int sd_remote_free_context(llama_context * ctx, double timeout_s, string & why)
    int sd_remote_free_model(llama_model * model, double timeout_s, string & why)
    int sd_remote_add_server(const char * endpoint, ggml_backend_reg_t * out, double timeout_s,
                             string & why)
    cbool sd_rpc_start_server(const char * endpoint, const char * cache_dir, size_t n_threads,
                              size_t n_devices, ggml_backend_dev_t * devices)


cdef extern from "_omp_pool.h" nogil:
    # the calling thread's OpenMP workers given back (see _omp_pool.h)
    cbool sd_release_omp_pool()


cdef extern from "_interrupt.h" nogil:
    # SIGINT seen while the main thread is in llama.cpp (see _interrupt.h)
    struct sd_stop_flag:
        cbool requested
        cbool watch
        unsigned long since
        double deadline
    cbool sd_past_deadline(const sd_stop_flag * f)
    double sd_monotonic_s()
    unsigned long sd_sigint_watch_begin()
    void sd_sigint_watch_end()
    void sd_sigint_note()
    cbool sd_stop_now(const sd_stop_flag * f)
