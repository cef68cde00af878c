/* The one place roicore talks to OpenMP.  The same .pyx compiles with and without it:
 * without _OPENMP the omp_* calls become sequential no-ops (scikit-learn/scikit-image shim). */
#ifndef ROICORE_OMP_H
#define ROICORE_OMP_H
#include <sched.h>
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#define ROICORE_HAVE_OPENMP 1
#else
#define ROICORE_HAVE_OPENMP 0
static inline int omp_get_max_threads(void) { return 1; }
static inline int omp_get_thread_num(void) { return 0; }
static inline int omp_get_num_threads(void) { return 1; }
#endif

/* Work sharing without OpenMP barriers, for sub-millisecond kernels (PS-RoI pooling).
 *
 * Under OMP_WAIT_POLICY=PASSIVE (which the bench sets, as do many deployments that run
 * several processes) a thread that reaches an OpenMP barrier early goes straight to
 * sleep, and waking it cost 40-85 us on these VMs: two barriers and the closing join
 * added about 0.2 ms to a 0.5 ms R-FCN forward at 2 threads.  Inside one parallel
 * region, threads instead take tasks from a shared counter (roicore_take), count the
 * finished ones (roicore_done) and wait for a phase to end by spinning on that count
 * (roicore_await, yielding the CPU once the wait grows long, in case the thread it
 * waits for is not running).  Each thread but the first counts itself out before it
 * leaves, and the first thread waits for them: it reaches the closing join last, so the
 * join has no sleeper to wake on the caller's path.  Release/acquire on the counts makes
 * a finished task's writes visible to the threads that waited for it. */
static inline int64_t roicore_take(int64_t *next) {
    return __atomic_fetch_add(next, 1, __ATOMIC_RELAXED);
}

static inline void roicore_done(int64_t *count) {
    __atomic_fetch_add(count, 1, __ATOMIC_RELEASE);
}

static inline void roicore_await(int64_t *count, int64_t target) {
    for (uint32_t spins = 0; __atomic_load_n(count, __ATOMIC_ACQUIRE) < target; ++spins) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
        if (spins >= 1u << 14) sched_yield();
    }
}

/* The end of a region that used the counters: see above. */
static inline void roicore_leave(int64_t *left) {
    if (omp_get_thread_num() == 0)
        roicore_await(left, omp_get_num_threads() - 1);
    else
        roicore_done(left);
}
#endif
