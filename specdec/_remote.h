// Calls into libllama that may talk to an RPC server, made safe against a server that dies.
//
// ggml-rpc sends every message from a dispatcher thread of its own and ends in GGML_ABORT when
// a socket fails; the thread that asked waits on a future that is then never set. So a dead
// server would either kill the process (abort) or hang it. Here:
//   * a call on a model with remote devices runs on a helper thread (one per calling thread,
//     reused), and the calling thread waits for it, for an abort somewhere while it is in
//     flight, or for a deadline;
//   * ggml's abort callback (installed by _core) first asks sd_remote_park: while a remote call
//     is in flight, the aborting thread (an RPC dispatcher, or the helper) records the message,
//     wakes the waiter and sleeps for ever instead of returning into abort().
// The waiter then reports the failure; _core marks the model dead and never touches its
// llama.cpp objects again (freeing them would need the dead server), so they are leaked.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "llama.h"
#include "_rs_graph.h"

struct sd_remote_shared {
    std::mutex m;
    std::condition_variable cv;
    uint64_t n_aborts = 0;
    std::string last_abort;
    std::atomic<int> in_flight{0};
};

// never destroyed: parked threads may still hold it while the process exits
inline sd_remote_shared & sd_remote() {
    static sd_remote_shared * s = new sd_remote_shared;
    return *s;
}

// ggml abort callback hook: returns only when no remote call is in flight
inline void sd_remote_park(const char * msg) {
    sd_remote_shared & s = sd_remote();
    if (s.in_flight.load() == 0) {
        return;
    }
    {
        std::lock_guard<std::mutex> lk(s.m);
        s.n_aborts++;
        s.last_abort = msg ? msg : "ggml abort";
    }
    s.cv.notify_all();
    for (;;) {
        std::this_thread::sleep_for(std::chrono::hours(24));
    }
}

// one helper thread per calling thread, reused; abandoned (left parked) after a failure
struct sd_remote_worker {
    std::mutex m;
    std::condition_variable cv;
    std::function<void()> job;
    bool has_job = false;
    bool done = false;
    bool stop = false;
    std::string error;

    // detached: a worker stuck in llama.cpp is abandoned, an idle one ends itself on stop
    sd_remote_worker() { std::thread([this] { run(); delete this; }).detach(); }

    void run() {
        std::unique_lock<std::mutex> lk(m);
        for (;;) {
            cv.wait(lk, [this] { return has_job || stop; });
            if (stop) {
                return;
            }
            std::function<void()> f = std::move(job);
            has_job = false;
            lk.unlock();
            std::string err;
            try {
                f();
            } catch (const std::exception & e) {
                err = e.what();
            } catch (...) {
                err = "unknown C++ exception";
            }
            lk.lock();
            error = err;
            done = true;
            lk.unlock();
            // the waiter sleeps on the shared condition variable (aborts wake it there too);
            // taking its mutex orders this wake-up after the waiter's check
            sd_remote_shared & s = sd_remote();
            { std::lock_guard<std::mutex> sl(s.m); }
            s.cv.notify_all();
            lk.lock();
        }
    }

    void stop_async() {
        {
            std::lock_guard<std::mutex> lk(m);
            stop = true;
        }
        cv.notify_all();
    }
};

// the calling thread's worker; at thread exit it is told to stop (no join: exit must not wait)
struct sd_remote_slot {
    sd_remote_worker * w = nullptr;
    ~sd_remote_slot() {
        if (w) {
            w->stop_async();
            w = nullptr;
        }
        gone() = true;
    }
    static bool & gone() {
        thread_local bool g = false;   // trivially destructible: readable after ~sd_remote_slot
        return g;
    }
};

inline sd_remote_slot & sd_remote_my_slot() {
    thread_local sd_remote_slot slot;
    return slot;
}

enum { SD_REMOTE_OK = 0, SD_REMOTE_ABORTED = 1, SD_REMOTE_TIMEOUT = 2, SD_REMOTE_EXCEPTION = 3 };

// Run f on this thread's helper and wait. timeout_s <= 0: no deadline. On failure, why holds
// the reason and the helper is abandoned (it may be stuck inside llama.cpp for ever).
inline int sd_remote_call(const std::function<void()> & f, double timeout_s, std::string & why) {
    if (sd_remote_slot::gone()) {   // this thread is exiting (interpreter shutdown): no guard
        f();
        return SD_REMOTE_OK;
    }
    sd_remote_slot & slot = sd_remote_my_slot();
    if (!slot.w) {
        slot.w = new sd_remote_worker();
    }
    sd_remote_worker * w = slot.w;
    sd_remote_shared & s = sd_remote();
    uint64_t aborts0;
    {
        std::lock_guard<std::mutex> lk(s.m);
        aborts0 = s.n_aborts;
    }
    s.in_flight++;
    {
        std::lock_guard<std::mutex> lk(w->m);
        w->job = f;
        w->has_job = true;
        w->done = false;
    }
    w->cv.notify_all();
    auto deadline = std::chrono::steady_clock::now() +
        std::chrono::microseconds((int64_t)((timeout_s > 0 ? timeout_s : 1e9) * 1e6));
    int rc = SD_REMOTE_OK;
    {
        std::unique_lock<std::mutex> lk(s.m);
        for (;;) {
            bool done;
            {
                std::lock_guard<std::mutex> wl(w->m);
                done = w->done;
                if (done && !w->error.empty()) {
                    why = w->error;
                    rc = SD_REMOTE_EXCEPTION;
                }
            }
            if (done) {
                break;
            }
            if (s.n_aborts != aborts0) {
                why = s.last_abort;
                rc = SD_REMOTE_ABORTED;
                break;
            }
            if (s.cv.wait_until(lk, deadline) == std::cv_status::timeout &&
                std::chrono::steady_clock::now() >= deadline) {
                why = "no answer within " + std::to_string(timeout_s) + " s";
                rc = SD_REMOTE_TIMEOUT;
                break;
            }
        }
    }
    s.in_flight--;
    if (rc == SD_REMOTE_ABORTED || rc == SD_REMOTE_TIMEOUT) {
        slot.w = nullptr;   // abandoned: stuck in llama.cpp or parked
    }
    return rc;
}

// --- the calls _core makes this way ------------------------------------------------------------

inline int sd_remote_load(const char * path, llama_model_params p, llama_model ** out,
                          double timeout_s, std::string & why) {
    std::string spath(path);
    return sd_remote_call([spath, p, out] { *out = llama_model_load_from_file(spath.c_str(), p); },
                          timeout_s, why);
}

inline int sd_remote_init(llama_model * model, llama_context_params p, llama_context ** out,
                          double timeout_s, std::string & why) {
    return sd_remote_call([model, p, out] { *out = llama_init_from_model(model, p); }, timeout_s, why);
}

// decode, then wait for the outputs so that reading them later needs no network
inline int sd_remote_decode(llama_context * ctx, llama_batch b, bool trim, uint32_t n_trim,
                            uint32_t n_rs_seq, int32_t * rc, double timeout_s, std::string & why) {
    return sd_remote_call([=] {
        if (trim) sd_set_graph_n_rs_seq(ctx, n_trim);
        *rc = llama_decode(ctx, b);
        if (trim) sd_set_graph_n_rs_seq(ctx, n_rs_seq);
        if (*rc == 0) llama_synchronize(ctx);
    }, timeout_s, why);
}

inline int sd_remote_state_get(llama_context * ctx, uint8_t * dst, size_t n, llama_seq_id seq,
                               llama_state_seq_flags flags, size_t * got, double timeout_s,
                               std::string & why) {
    return sd_remote_call([=] { *got = llama_state_seq_get_data_ext(ctx, dst, n, seq, flags); },
                          timeout_s, why);
}

inline int sd_remote_state_set(llama_context * ctx, const uint8_t * src, size_t n, llama_seq_id seq,
                               llama_state_seq_flags flags, size_t * got, double timeout_s,
                               std::string & why) {
    return sd_remote_call([=] { *got = llama_state_seq_set_data_ext(ctx, src, n, seq, flags); },
                          timeout_s, why);
}

inline int sd_remote_clear(llama_context * ctx, bool data, double timeout_s, std::string & why) {
    return sd_remote_call([=] { llama_memory_clear(llama_get_memory(ctx), data); }, timeout_s, why);
}

inline int sd_remote_free_context(llama_context * ctx, double timeout_s, std::string & why) {
    return sd_remote_call([=] { llama_free(ctx); }, timeout_s, why);
}

inline int sd_remote_free_model(llama_model * model, double timeout_s, std::string & why) {
    return sd_remote_call([=] { llama_model_free(model); }, timeout_s, why);
}

// connect to an RPC server and list its devices (ggml_backend_rpc_add_server, reached through
// the registry as common/arg.cpp does, so a build without RPC still links)
typedef ggml_backend_reg_t (*sd_rpc_add_server_fn)(const char * endpoint);

inline int sd_remote_add_server(const char * endpoint, ggml_backend_reg_t * out, double timeout_s,
                                std::string & why) {
    ggml_backend_reg_t rpc = ggml_backend_reg_by_name("RPC");
    if (!rpc) {
        why = "this build has no RPC backend (build with -Drpc=true)";
        return SD_REMOTE_EXCEPTION;
    }
    auto add = (sd_rpc_add_server_fn) ggml_backend_reg_get_proc_address(rpc, "ggml_backend_rpc_add_server");
    if (!add) {
        why = "the RPC backend has no ggml_backend_rpc_add_server";
        return SD_REMOTE_EXCEPTION;
    }
    std::string ep(endpoint);
    return sd_remote_call([ep, add, out] { *out = add(ep.c_str()); }, timeout_s, why);
}

// the RPC server of the pinned tree (tools/rpc/rpc-server.cpp's call); blocks serving clients
typedef void (*sd_rpc_start_server_fn)(const char * endpoint, const char * cache_dir,
                                       size_t n_threads, size_t n_devices, ggml_backend_dev_t * devices);

inline bool sd_rpc_start_server(const char * endpoint, const char * cache_dir, size_t n_threads,
                                size_t n_devices, ggml_backend_dev_t * devices) {
    ggml_backend_reg_t rpc = ggml_backend_reg_by_name("RPC");
    if (!rpc) {
        return false;
    }
    auto start = (sd_rpc_start_server_fn) ggml_backend_reg_get_proc_address(rpc, "ggml_backend_rpc_start_server");
    if (!start) {
        return false;
    }
    start(endpoint, cache_dir, n_threads, n_devices, devices);
    return true;
}
