// Ctrl-C while the main thread is inside llama.cpp with the GIL released.
//
// Why: Python's SIGINT handler only records the signal; KeyboardInterrupt is raised when the
// main thread next runs bytecode. A long prefill (one llama_decode) or a model load would
// finish first. llama.cpp polls a C callback instead: between ubatches and between graph
// nodes (llama_set_abort_callback), and per tensor while loading (progress_callback).
//
// How: around such a call on the main thread, while Python's SIGINT handler is the default
// (KeyboardInterrupt), the core installs sd_sigint_handler with sigaction. It counts the
// signal in a lock-free counter and calls the handler it replaced (Python's, which records
// the signal as usual), then the core restores that handler. The callbacks compare the
// counter with its value when the call began; a call that stops that way returns to Cython,
// which lets Python raise the KeyboardInterrupt (PyErr_CheckSignals).
//
// Only async-signal-safe work happens in the handler: an atomic increment and a call to the
// previous handler, which is what the kernel would have called.
#pragma once

#include <atomic>
#include <csignal>
#include <cstring>
#include <ctime>

static std::atomic<unsigned long> sd_sigint_count{0};
static struct sigaction sd_sigint_prev;
static int sd_sigint_depth = 0;   // main thread only: nested watches install once

static void sd_sigint_handler(int sig, siginfo_t * info, void * uctx) {
    sd_sigint_count.fetch_add(1, std::memory_order_relaxed);
    if (sd_sigint_prev.sa_flags & SA_SIGINFO) {
        if (sd_sigint_prev.sa_sigaction != nullptr) {
            sd_sigint_prev.sa_sigaction(sig, info, uctx);
        }
    } else if (sd_sigint_prev.sa_handler != SIG_DFL && sd_sigint_prev.sa_handler != SIG_IGN &&
               sd_sigint_prev.sa_handler != nullptr) {
        sd_sigint_prev.sa_handler(sig);
    }
}

// Start watching SIGINT (main thread); returns the counter's value to compare against.
static inline unsigned long sd_sigint_watch_begin() {
    if (sd_sigint_depth++ == 0) {
        struct sigaction sa;
        std::memset(&sa, 0, sizeof(sa));
        sa.sa_sigaction = sd_sigint_handler;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGINT, &sa, &sd_sigint_prev) != 0) {
            sd_sigint_depth--;
        }
    }
    return sd_sigint_count.load(std::memory_order_relaxed);
}

static inline void sd_sigint_watch_end() {
    if (sd_sigint_depth > 0 && --sd_sigint_depth == 0) {
        sigaction(SIGINT, &sd_sigint_prev, nullptr);
    }
}

static inline unsigned long sd_sigint_seen() {
    return sd_sigint_count.load(std::memory_order_relaxed);
}

// A callback that had to drop a KeyboardInterrupt (raised in Python code it ran) counts it
// here, so that the C call it runs in stops as if the signal had been seen.
static inline void sd_sigint_note() {
    sd_sigint_count.fetch_add(1, std::memory_order_relaxed);
}

// What llama.cpp's callbacks read: an explicit request (Context.interrupt), a SIGINT
// counted since the call began (when watched), or the call's deadline passed (the decode
// watchdog: CLOCK_MONOTONIC seconds, 0 for none; read between graph nodes, a clock read each).
struct sd_stop_flag {
    bool requested;
    bool watch;
    unsigned long since;
    double deadline;
};

static inline double sd_monotonic_s() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline bool sd_past_deadline(const sd_stop_flag * f) {
    return f->deadline > 0 && sd_monotonic_s() > f->deadline;
}

static inline bool sd_stop_now(const sd_stop_flag * f) {
    return f->requested || (f->watch && sd_sigint_seen() != f->since) || sd_past_deadline(f);
}
