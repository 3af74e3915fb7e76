// GGML_ABORT / GGML_ASSERT on the calling thread become a C++ exception, then a Python one.
//
// Why: ggml_abort() ends in abort(), which takes the whole process down. ggml lets a program
// install a callback that runs first (ggml_set_abort_callback); a callback that throws never
// returns to that abort().
//
// Where a throw is safe: only inside one of the sd_* calls below, on the thread that made it
// (a thread_local depth counts them). The exception unwinds through llama.cpp's C++ (its RAII
// frees what was half-built; its loader and context constructor already catch std::exception
// and return NULL) and through ggml's C frames (x86-64 and aarch64 builds carry unwind tables
// for C; ggml holds no lock around an assert: its one critical section guards table setup).
// The sd_* wrapper catches whatever reaches it, so no exception ever crosses into Python's C
// frames, and records llama.cpp's message for the core, which then treats the object that was
// being built or used as broken (freed, never used again).
//
// Where it is not: inside ggml's compute (OpenMP workers, or the calling thread while it runs
// a parallel region, or ggml-cpu's kernels on one thread): an exception there would escape an
// OpenMP region (std::terminate) or leave a thread pool mid-barrier. The callback then lets
// the abort happen, after printing llama.cpp's message; the core's checks before the call
// (specdec/_gguf_check.py, the type checks in _core) are what keep those asserts unreached.
// Likewise during another exception's unwinding (a second throw would terminate).
//
// Remote (RPC) calls run on helper threads outside any sd_* call: an abort there, or on
// ggml-rpc's dispatcher, is parked by _remote.h's sd_remote_park while a remote call is in
// flight (the waiting thread reports an RPCError); this callback asks it before aborting.
#pragma once

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "ggml.h"
#include "llama.h"
#include "_remote.h"

struct sd_ggml_abort : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct sd_abort_state {
    int depth = 0;          // sd_* calls active on this thread
    bool aborted = false;   // an abort unwound since the last sd_abort_take
    std::string message;    // its message, or the what() of another escaped exception
};

static inline sd_abort_state & sd_abort_tls() {
    static thread_local sd_abort_state s;
    return s;
}

// ggml's message starts with "file:line: ": its file tells a compute kernel (ggml-cpu) apart
static inline bool sd_abort_in_compute(const char * msg) {
#ifdef _OPENMP
    if (omp_in_parallel()) {
        return true;
    }
#endif
    const char * colon = std::strchr(msg, ':');
    if (colon == nullptr) {
        return false;
    }
    std::string file(msg, colon - msg);
    return file.find("ggml-cpu") != std::string::npos;
}

static inline void sd_abort_callback(const char * msg) {
    sd_abort_state & s = sd_abort_tls();
    if (s.depth > 0 && std::uncaught_exceptions() == 0 && !sd_abort_in_compute(msg)) {
        s.aborted = true;
        s.message = msg;
        throw sd_ggml_abort(msg);
    }
    sd_remote_park(msg);   // returns only when no remote call is in flight
    std::fprintf(stderr, "%s\n", msg);
    std::fflush(stderr);
}

static inline void sd_abort_install() {
    ggml_set_abort_callback(sd_abort_callback);
}

// true when an abort (or another C++ exception) ended an sd_* call since the last take;
// the message goes to ``out`` and the flag is cleared
static inline bool sd_abort_take(std::string & out) {
    sd_abort_state & s = sd_abort_tls();
    bool was = s.aborted;
    out = s.message;
    s.aborted = false;
    s.message.clear();
    return was;
}

struct sd_abort_scope {
    sd_abort_scope() { sd_abort_tls().depth++; }
    ~sd_abort_scope() { sd_abort_tls().depth--; }
    sd_abort_scope(const sd_abort_scope &) = delete;
    sd_abort_scope & operator=(const sd_abort_scope &) = delete;
};

// Runs f() with aborts turned into exceptions; an exception that reaches here is recorded
// (sd_abort_take) and ``failed`` is returned instead.
template <class R, class F>
static inline R sd_guarded(R failed, F && f) {
    if (sd_abort_tls().depth == 0) {
        sd_abort_tls().aborted = false;
        sd_abort_tls().message.clear();
    }
    sd_abort_scope scope;
    try {
        return f();
    } catch (const std::exception & e) {
        sd_abort_state & s = sd_abort_tls();
        if (!s.aborted) {
            s.aborted = true;
            s.message = e.what();
        }
    } catch (...) {
        sd_abort_state & s = sd_abort_tls();
        s.aborted = true;
        s.message = "unknown C++ exception";
    }
    return failed;
}

// --- the llama.cpp calls that may abort on the calling thread ------------------------------

static inline llama_model * sd_model_load(const char * path, llama_model_params p) {
    llama_model * m = sd_guarded<llama_model *>(nullptr, [&] { return llama_model_load_from_file(path, p); });
    if (m != nullptr && sd_abort_tls().aborted) {
        // llama.cpp caught the abort and went on: what it built is not to be trusted
        llama_model_free(m);
        m = nullptr;
    }
    return m;
}

static inline llama_context * sd_init_from_model(llama_model * model, llama_context_params p) {
    llama_context * c = sd_guarded<llama_context *>(nullptr, [&] { return llama_init_from_model(model, p); });
    if (c != nullptr && sd_abort_tls().aborted) {
        llama_free(c);
        c = nullptr;
    }
    return c;
}

// -100: aborted (sd_abort_take has the message). It waits for the outputs: on a GPU
// llama_decode returns once the graph is queued, and the caller's clock (the adaptive policy's
// verify time) is to measure the compute, not its launch.
static inline int32_t sd_decode(llama_context * ctx, llama_batch batch) {
    return sd_guarded<int32_t>(-100, [&] {
        int32_t rc = llama_decode(ctx, batch);
        if (rc == 0) {
            llama_synchronize(ctx);
        }
        return rc;
    });
}

// -100: aborted (sd_abort_take has the message)
static inline int32_t sd_encode(llama_context * ctx, llama_batch batch) {
    return sd_guarded<int32_t>(-100, [&] { return llama_encode(ctx, batch); });
}

static inline int32_t sd_tokenize(const llama_vocab * vocab, const char * text, int32_t text_len,
                                  llama_token * tokens, int32_t n_tokens_max, bool add_special,
                                  bool parse_special) {
    return sd_guarded<int32_t>(INT32_MIN + 1, [&] {
        return llama_tokenize(vocab, text, text_len, tokens, n_tokens_max, add_special, parse_special);
    });
}

static inline int32_t sd_detokenize(const llama_vocab * vocab, const llama_token * tokens,
                                    int32_t n_tokens, char * text, int32_t text_len_max,
                                    bool remove_special, bool unparse_special) {
    return sd_guarded<int32_t>(0, [&] {
        return llama_detokenize(vocab, tokens, n_tokens, text, text_len_max, remove_special,
                                unparse_special);
    });
}

static inline int32_t sd_token_to_piece(const llama_vocab * vocab, llama_token token, char * buf,
                                        int32_t length, int32_t lstrip, bool special) {
    return sd_guarded<int32_t>(0, [&] {
        return llama_token_to_piece(vocab, token, buf, length, lstrip, special);
    });
}

// memory edits: false when aborted (the context is then broken)
static inline bool sd_memory_seq_rm(llama_memory_t mem, llama_seq_id seq, llama_pos p0, llama_pos p1) {
    return sd_guarded<bool>(false, [&] { return llama_memory_seq_rm(mem, seq, p0, p1); });
}

static inline bool sd_memory_seq_cp(llama_memory_t mem, llama_seq_id src, llama_seq_id dst,
                                    llama_pos p0, llama_pos p1) {
    return sd_guarded<bool>(false, [&] { llama_memory_seq_cp(mem, src, dst, p0, p1); return true; });
}

static inline bool sd_memory_seq_keep(llama_memory_t mem, llama_seq_id seq) {
    return sd_guarded<bool>(false, [&] { llama_memory_seq_keep(mem, seq); return true; });
}

static inline bool sd_memory_clear(llama_memory_t mem, bool data) {
    return sd_guarded<bool>(false, [&] { llama_memory_clear(mem, data); return true; });
}

static inline size_t sd_state_seq_get_size(llama_context * ctx, llama_seq_id seq, llama_state_seq_flags flags) {
    return sd_guarded<size_t>(0, [&] { return llama_state_seq_get_size_ext(ctx, seq, flags); });
}

static inline size_t sd_state_seq_get_data(llama_context * ctx, uint8_t * dst, size_t size,
                                           llama_seq_id seq, llama_state_seq_flags flags) {
    return sd_guarded<size_t>(0, [&] { return llama_state_seq_get_data_ext(ctx, dst, size, seq, flags); });
}

static inline size_t sd_state_seq_set_data(llama_context * ctx, const uint8_t * src, size_t size,
                                           llama_seq_id seq, llama_state_seq_flags flags) {
    return sd_guarded<size_t>(0, [&] { return llama_state_seq_set_data_ext(ctx, src, size, seq, flags); });
}
