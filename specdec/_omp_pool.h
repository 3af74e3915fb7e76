// Give back the OpenMP worker threads the calling thread keeps.
//
// Why: libgomp keeps a pool of workers per thread that ran a parallel region (each thread
// that decoded: a Decoder's caller, an Engine's worker, the thread that timed the LM heads),
// for the thread's whole life. While the pools of a process hold more threads than it has
// CPUs, libgomp cuts every team's spin-wait from ~300k spins to 100 (gomp_throttled_spin_
// count_var), so that the decoding team's workers fall asleep between regions and each of a
// round's regions (ggml's graph, the lazy head's passes) waits for them to be woken. An
// Engine next to one idle Decoder, or an Engine whose LM heads were timed on the caller's
// thread, decoded 30-35% slower on 2 cores (gemma3-270m, 4 slots: 126 tok/s against 200).
//
// How: omp_pause_resource_all(omp_pause_soft) (OpenMP 5.0) frees the calling thread's pool
// in libgomp (gomp_pause_host: its own pool only, refused inside a region); the next region
// the thread starts makes its workers again (one thread creation each). The front doors
// call it when a thread is done decoding for now (sd_release_omp_pool). libomp's pause is
// process-wide, not this thread's, so other OpenMP runtimes are left alone.
#pragma once

// (libgomp has had it since GCC 9, whatever _OPENMP it reports)
#if defined(_OPENMP) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 9
#include <omp.h>
static inline bool sd_release_omp_pool(void) {
    if (omp_in_parallel()) {
        return false;
    }
    return omp_pause_resource_all(omp_pause_soft) == 0;
}
#else
static inline bool sd_release_omp_pool(void) {
    return false;
}
#endif
