/* What every kernel file shares: errors, the per-call run state (threads, stop requests),
 * scratch memory under the limit, vector types and the dtype template helpers.  Internal:
 * only roicore.h is installed. */
#ifndef ROICORE_COMMON_H
#define ROICORE_COMMON_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "roicore.h"

#ifdef _OPENMP
#include <omp.h>
#define ROICORE_HAVE_OPENMP 1
#else
#define ROICORE_HAVE_OPENMP 0
static inline int omp_get_thread_num(void) { return 0; }
static inline int omp_get_num_threads(void) { return 1; }
static inline int omp_get_max_threads(void) { return 1; }
#endif

#if defined(__GNUC__)
#define ROICORE_INLINE static inline __attribute__((always_inline))
#define ROICORE_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define ROICORE_INLINE static inline
#define ROICORE_PRINTF(f, a)
#endif

/* Kernels that gain from AVX2 are compiled twice by GCC on x86-64 Linux, for AVX2 and for
 * the baseline, and the loader picks one (ifunc), so one binary runs everywhere.  Neither
 * copy contracts a*b+c into an FMA (-ffp-contract=off, and "avx2" implies no FMA), so both
 * give the same bits. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define ROICORE_X86_DISPATCH 1
#define ROICORE_CLONES __attribute__((target_clones("avx2", "default")))
#define ROICORE_AVX2 __attribute__((target("avx2")))
/* For kernels that call fma()/fmaf() on purpose: a copy for CPUs with the FMA instruction,
 * where the calls become vector instructions, and the baseline, where they stay library
 * calls; both round once, so both give the same bits. */
#define ROICORE_FMA_CLONES __attribute__((target_clones("fma", "default")))
#else
#define ROICORE_CLONES
#define ROICORE_FMA_CLONES
#endif

#ifdef ROICORE_X86_DISPATCH
/* For kernels written in two copies by hand (those using AVX2 intrinsics). */
static inline int roicore_has_avx2(void) {
    static int has = -1;
    int v = __atomic_load_n(&has, __ATOMIC_RELAXED);
    if (v < 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx2") ? 1 : 0;
        __atomic_store_n(&has, v, __ATOMIC_RELAXED);
    }
    return v;
}
#endif

#define ROICORE_CAT2(a, b) a##_##b
#define ROICORE_CAT(a, b) ROICORE_CAT2(a, b)

static inline int64_t roicore_min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t roicore_max64(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t roicore_clamp64(int64_t v, int64_t lo, int64_t hi) {
    return v < lo ? lo : (v > hi ? hi : v);
}
static inline int64_t roicore_round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }
static inline size_t roicore_dtype_size(roicore_dtype d) { return d == ROICORE_FLOAT32 ? 4 : 8; }
static inline size_t roicore_index_size(roicore_index_type t) { return t == ROICORE_INT32 ? 4 : 8; }

/* ------------------------------------------------------------------------ outputs */

/* The kernels take every array as a roicore_tensor, whose data is read-only; an output
 * reaches them as a view of its roicore_out_tensor (roicore_out_view), and they write
 * through ROICORE_WRITABLE only views made that way, whose memory the caller passed as
 * writable. */
#define ROICORE_WRITABLE(t) ((void *)(uintptr_t)(t)->data)

/* `view` made a read-only tensor of `out` (NULL stays NULL). */
static inline const roicore_tensor *roicore_out_view(const roicore_out_tensor *out,
                                                     roicore_tensor *view) {
    if (!out) return NULL;
    memset(view, 0, sizeof *view);
    view->data = out->data;
    view->dtype = out->dtype;
    view->layout = out->layout;
    view->n = out->n, view->c = out->c, view->h = out->h, view->w = out->w;
    memcpy(view->reserved, out->reserved, sizeof view->reserved);
    return view;
}

/* Element strides of a tensor in its layout: element (n, c, h, w) is at
 * n*s.n + c*s.c + h*s.h + w*s.w. */
typedef struct {
    int64_t n, c, h, w;
} roicore_strides;

static inline roicore_strides roicore_strides_of(const roicore_tensor *t) {
    roicore_strides s;
    s.n = t->c * t->h * t->w;
    if (t->layout == ROICORE_NHWC) {
        s.c = 1, s.h = t->w * t->c, s.w = t->c;
    } else {
        s.c = t->h * t->w, s.h = t->w, s.w = 1;
    }
    return s;
}

/* ------------------------------------------------------------------------ errors */

/* Fill `err` (if any) and return `code`. */
roicore_status roicore_fail(roicore_error *err, int code, const char *fmt, ...)
    ROICORE_PRINTF(3, 4);
/* The same for a bad value at element `index` of the array the caller calls `argument`
 * (both recorded in err, for a binding that words the message in its user's terms). */
roicore_status roicore_fail_at(roicore_error *err, int code, const char *argument,
                               int64_t index, const char *fmt, ...) ROICORE_PRINTF(5, 6);

/* ------------------------------------------------------------------------ one call */

/* The state of one call, shared by its threads.  `stop` is set once the poll callback
 * asks to stop (or scratch runs out mid-call); every thread then finishes its current
 * piece of work and leaves. */
typedef struct {
    int n_threads;
    int (*poll)(void *arg);
    void *poll_arg;
    int stop;                    /* 0, or why the call stops: ROICORE_STOP_* */
    int64_t next_poll_ns;        /* the calling thread's: when to poll next */
    const int64_t *interrupts;   /* the runtime's SIGINT count, when Ctrl-C is watched */
    int64_t interrupts_seen;     /* its value when the call started */
} roicore_run;

enum { ROICORE_STOP_POLL = 1, ROICORE_STOP_SIGINT = 2 };

/* An exec's own consistency (NULL: the defaults): thread count, reserved fields. */
int roicore_check_exec(const roicore_exec *exec, roicore_error *err);
/* Resolve a checked exec (NULL: defaults) into a run. */
void roicore_run_init(roicore_run *run, const roicore_exec *exec);

/* Called between pieces of work by every thread: polls (calling thread, rate-limited) and
 * returns nonzero when the call should stop. */
int roicore_run_poll(roicore_run *run);
static inline int roicore_stopping(roicore_run *run) {
    if ((run->poll || run->interrupts) && omp_get_thread_num() == 0) return roicore_run_poll(run);
    return __atomic_load_n(&run->stop, __ATOMIC_RELAXED);
}

/* Pieces of work larger than this many element visits (a bin of RoIAlign samples, a max-pool
 * bin's pixels) check for a stop on their own, so that a hostile call stops within a
 * fraction of a second however large its bins. */
#define ROICORE_HEAVY_BIN 4096

/* The status a finished call returns. */
int roicore_run_status(const roicore_run *run, roicore_error *err);

/* Threads about to start a team of n (n >= 2) must call this first: it records that this
 * process ran a parallel region (a forked child then runs on one thread). */
void roicore_team_started(int n);

/* ------------------------------------------------------------------------ work sharing */

/* Threads of one region share work through counters rather than OpenMP loops, so that no
 * thread sleeps at a barrier between the phases of a call: waking a sleeping thread
 * (OMP_WAIT_POLICY=PASSIVE, common where several processes share a machine) costs tens of
 * microseconds, a large share of a sub-millisecond call.  A thread takes tasks from a
 * counter (take), counts finished ones (done), and waits for a phase by spinning on that
 * count (await), yielding the CPU once the wait grows long.  Each thread but the first
 * counts itself out before it leaves and the first waits for them (leave), so the closing
 * join has no sleeper to wake.  Release/acquire on the counts makes a finished task's
 * writes visible to the threads that waited for it.  Counters live on cache lines of
 * their own (roicore_counters): two cores writing one line pass it back and forth. */
#define ROICORE_LINE 64
#define ROICORE_COUNTER_STRIDE (ROICORE_LINE / (int64_t)sizeof(int64_t))

static inline int64_t roicore_take(int64_t *next) {
    return __atomic_fetch_add(next, 1, __ATOMIC_RELAXED);
}
static inline void roicore_done(int64_t *count) {
    __atomic_fetch_add(count, 1, __ATOMIC_RELEASE);
}
/* Wait until *count reaches target; returns early (nonzero) when the call stops. */
int roicore_await(int64_t *count, int64_t target, roicore_run *run);
void roicore_leave(int64_t *left, roicore_run *run);

/* ------------------------------------------------------------------------ scratch */

/* Scratch for one call: `bytes` of 64-byte-aligned memory, or NULL with ROICORE_ERR_MEMORY
 * in err when it would pass the memory limit or malloc fails.  `what` names it. */
void *roicore_scratch(int64_t bytes, const char *what, roicore_error *err);
void roicore_scratch_free(void *p);

/* Asks the kernel to back an output of 4 MiB or more with huge pages, where it does so on
 * request (Linux transparent huge pages in "madvise" mode): an output the caller has just
 * allocated then faults once per 2 MiB as it is written, not once per 4 KiB page.  NumPy
 * advises its own large arrays the same way; other frameworks' allocators do not.  Only
 * the whole huge pages inside [data, data + bytes) are advised; a no-op elsewhere. */
void roicore_advise_output(void *data, int64_t bytes);

/* Zeroed counters, each on a line of its own: counter i is c[i * ROICORE_COUNTER_STRIDE]. */
int64_t *roicore_counters(int n, roicore_error *err);

/* ------------------------------------------------------------------------ vectors */

/* 32-byte vectors (GCC/Clang vector extensions): AVX2 registers in the AVX2 copies, pairs
 * of SSE registers otherwise.  Loads and stores go through memcpy-like unaligned types. */
typedef float roicore_vf32 __attribute__((vector_size(32)));
typedef int32_t roicore_vm32 __attribute__((vector_size(32)));  /* masks of f32 lanes */
typedef double roicore_vf64 __attribute__((vector_size(32)));
typedef int64_t roicore_vm64 __attribute__((vector_size(32)));  /* masks of f64 lanes */
typedef uint32_t roicore_vu32 __attribute__((vector_size(32)));
typedef uint64_t roicore_vu64 __attribute__((vector_size(32)));
typedef int32_t roicore_vi32x4 __attribute__((vector_size(16)));

/* Vectors per channel block: a block holds 8 vectors (64 float32 or 32 float64 channels,
 * 256 bytes per pixel), so a bin's running results over a whole block live in 8 vector
 * registers. */
#define ROICORE_BLOCK_VECTORS 8
/* Lanes per pixel of a whole block, in a dtype template (LANES: values per vector). */
#define ROICORE_BLOCK_LANES (ROICORE_BLOCK_VECTORS * LANES)

#endif
