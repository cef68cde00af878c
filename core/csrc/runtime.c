/* The runtime side of a call: error messages, the thread-count policy (with fork safety
 * and thread-creation limits), stop requests, work-sharing waits and scratch memory. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <signal.h>

#include "common.h"

/* ------------------------------------------------------------------------ the runtime */

/* What the calls of a process share: the memory limit, the kept scratch blocks, whether a
 * team of threads ran (fork safety) and the count of Ctrl-Cs.  Each copy of the library
 * has one of its own until roicore_runtime_share points it at another copy's. */
#define SCRATCH_SLOTS 8
#define RUNTIME_MAGIC 0x726f6963u  /* "roic" */
#define RUNTIME_LAYOUT 1           /* one more on any change to struct roicore_runtime */

struct roicore_runtime {
    uint32_t magic, layout, size;
    int64_t memory_limit;          /* -1: not yet read (physical memory) */
    pthread_mutex_t scratch_lock;  /* guards the four fields below */
    char *kept[SCRATCH_SLOTS];     /* the kept scratch blocks; free slots are NULL */
    int64_t kept_bytes, kept_stamp, scratch_keep_limit;
    int ran_team;                  /* a team of >= 2 threads ran in this process */
    int forked_after_team;         /* this process was forked after one did */
    int64_t interrupts;            /* SIGINTs seen since roicore_watch_interrupts */
    void (*rewatch)(void);         /* the watching copy's check of its handler; NULL: none */
};

static roicore_runtime own = {RUNTIME_MAGIC, RUNTIME_LAYOUT, (uint32_t)sizeof(roicore_runtime),
                              -1, PTHREAD_MUTEX_INITIALIZER, {NULL}, 0, 0, 256 << 20, 0, 0, 0,
                              NULL};
static roicore_runtime *active = &own;

static roicore_runtime *rt(void) { return __atomic_load_n(&active, __ATOMIC_ACQUIRE); }

roicore_runtime *roicore_runtime_current(void) { return rt(); }

static int64_t release_down_to(roicore_runtime *r, int64_t keep);

roicore_status roicore_runtime_share(roicore_runtime *runtime, roicore_error *err) {
    if (!runtime) return roicore_fail(err, ROICORE_ERR_ARGUMENT, "runtime is NULL");
    if (runtime->magic != RUNTIME_MAGIC || runtime->layout != RUNTIME_LAYOUT ||
        runtime->size != sizeof(roicore_runtime))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "runtime comes from a roicore whose runtime differs from this "
                            "one's (roicore %s, runtime layout %d): build both from one roicore",
                            ROICORE_VERSION_STRING, RUNTIME_LAYOUT);
    roicore_runtime *previous = __atomic_exchange_n(&active, runtime, __ATOMIC_ACQ_REL);
    if (previous != runtime) release_down_to(previous, 0);  /* its kept blocks, unused now */
    return ROICORE_OK;
}

int roicore_abi_version(void) { return ROICORE_ABI_VERSION; }
int roicore_version_number(void) { return ROICORE_VERSION_NUMBER; }
const char *roicore_version_string(void) { return ROICORE_VERSION_STRING; }
int roicore_openmp_enabled(void) { return ROICORE_HAVE_OPENMP; }

static void fill(roicore_error *err, int code, const char *argument, int64_t index,
                 const char *fmt, va_list ap) {
    memset(err, 0, sizeof *err);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    snprintf(err->argument, sizeof err->argument, "%s", argument ? argument : "");
    err->index = index;
    err->code = (roicore_status)code;
}

roicore_status roicore_fail(roicore_error *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        fill(err, code, NULL, -1, fmt, ap);
        va_end(ap);
    }
    return (roicore_status)code;
}

roicore_status roicore_fail_at(roicore_error *err, int code, const char *argument,
                               int64_t index, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        fill(err, code, argument, index, fmt, ap);
        va_end(ap);
    }
    return (roicore_status)code;
}

/* ------------------------------------------------------------------------ threads */

/* libgomp keeps a pool of threads per calling thread.  After fork() the child has the
 * pool's bookkeeping but not its threads, and its next parallel region waits for them
 * forever.  So once this process has run a team of several threads, a forked child runs
 * every call on one thread (it cannot build a new pool in libgomp). */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void in_child(void) {
    roicore_runtime *r = rt();
    if (__atomic_load_n(&r->ran_team, __ATOMIC_RELAXED)) r->forked_after_team = 1;
}
static void register_atfork(void) { pthread_atfork(NULL, NULL, in_child); }

void roicore_team_started(int n) {
    roicore_runtime *r = rt();
    if (n >= 2) pthread_once(&atfork_once, register_atfork);  /* this copy's handler too */
    if (n >= 2 && !__atomic_load_n(&r->ran_team, __ATOMIC_RELAXED))
        __atomic_store_n(&r->ran_team, 1, __ATOMIC_RELAXED);
}

static int cpus_available(void) {
#ifdef CPU_COUNT
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* libgomp exits the process ("Thread creation failed") when it cannot start a thread of a
 * team, which container limits (pids.max, RLIMIT_NPROC, RLIMIT_AS) make possible.  libgomp
 * keeps a pool of threads per calling thread and starts only those a larger team adds, so
 * before a calling thread first asks for a team larger than any it has had, it starts that
 * many more threads itself and lets them exit at once: the team is as large as what
 * started.  The probe runs once per team size per thread. */
static __thread int team_probed = 1;  /* the largest team known to start from this thread */

static void *probe_thread(void *arg) { return arg; }

/* The stack size libgomp gives its threads: OMP_STACKSIZE ("size" with an optional B, K, M
 * or G suffix, K by default), else GOMP_STACKSIZE (in KiB); 0 for the default. */
static size_t omp_stack_size(void) {
    const char *v = getenv("OMP_STACKSIZE");
    int kib_only = 0;
    if (!v || !*v) {
        v = getenv("GOMP_STACKSIZE");
        kib_only = 1;
    }
    if (!v || !*v) return 0;
    char *end = NULL;
    errno = 0;
    const unsigned long long n = strtoull(v, &end, 10);
    if (errno || end == v) return 0;  /* libgomp ignores what it cannot read */
    while (*end == ' ' || *end == '\t') ++end;
    unsigned long long unit = 1024;
    if (!kib_only) {
        switch (*end) {
            case 'b': case 'B': unit = 1; break;
            case 'k': case 'K': break;
            case 'm': case 'M': unit = 1ull << 20; break;
            case 'g': case 'G': unit = 1ull << 30; break;
            default: break;
        }
    }
    return n > SIZE_MAX / unit ? SIZE_MAX : (size_t)(n * unit);
}

static int startable_team(int n) {
    if (n <= team_probed) return n;
    const int more = n - team_probed;
    pthread_t *tids = (pthread_t *)malloc(sizeof(pthread_t) * (size_t)more);
    int started = 0;
    pthread_attr_t attr;  /* the stacks libgomp's threads will have */
    const int with_attr = pthread_attr_init(&attr) == 0;
    const size_t stack = omp_stack_size();
    if (with_attr && stack && pthread_attr_setstacksize(&attr, stack) != 0) {
        free(tids);  /* a size libgomp cannot give its threads either: one thread */
        pthread_attr_destroy(&attr);
        return team_probed;
    }
    if (tids && with_attr) {
        while (started < more && pthread_create(&tids[started], &attr, probe_thread, NULL) == 0)
            ++started;
        for (int i = 0; i < started; ++i) pthread_join(tids[i], NULL);
    }
    free(tids);
    if (with_attr) pthread_attr_destroy(&attr);
    team_probed += started;
    return team_probed;
}

int roicore_resolve_threads(int requested) {
    if (!ROICORE_HAVE_OPENMP || rt()->forked_after_team) return 1;
    int n;
    if (requested == 0)
        n = (int)roicore_min64(omp_get_max_threads(), cpus_available());
    else if (requested < 0)
        n = (int)roicore_max64(1, (int64_t)cpus_available() + 1 + requested);
    else
        n = requested;
    if (n > ROICORE_MAX_THREADS) n = ROICORE_MAX_THREADS;
    return n <= 1 ? 1 : startable_team(n);
}

/* ------------------------------------------------------------------------ a call */

#define POLL_INTERVAL_NS 20000000  /* 20 ms */

static int64_t now_ns(void) {
    struct timespec ts;
#ifdef CLOCK_MONOTONIC_COARSE
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
#else
    clock_gettime(CLOCK_MONOTONIC, &ts);
#endif
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int roicore_check_exec(const roicore_exec *exec, roicore_error *err) {
    if (!exec) return ROICORE_OK;
    if (exec->reserved0 || exec->reserved[0] || exec->reserved[1] || exec->reserved[2] ||
        exec->reserved[3])
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "exec has nonzero reserved fields: zero-initialise roicore_exec and "
                            "set only the fields you use");
    return ROICORE_OK;
}

void roicore_run_init(roicore_run *run, const roicore_exec *exec) {
    roicore_runtime *r = rt();
    run->n_threads = roicore_resolve_threads(exec ? exec->n_threads : 0);
    run->poll = exec ? exec->poll : NULL;
    run->poll_arg = exec ? exec->poll_arg : NULL;
    run->stop = 0;
    run->interrupts = NULL;
    void (*rewatch)(void) = __atomic_load_n(&r->rewatch, __ATOMIC_ACQUIRE);
    if (rewatch) {  /* Ctrl-C is watched: the SIGINTs that arrive from now on stop the call */
        rewatch();
        run->interrupts = &r->interrupts;
        run->interrupts_seen = __atomic_load_n(&r->interrupts, __ATOMIC_ACQUIRE);
    }
    run->next_poll_ns = run->poll ? now_ns() + POLL_INTERVAL_NS : 0;
    roicore_team_started(run->n_threads);
}

int roicore_run_poll(roicore_run *run) {
    if (__atomic_load_n(&run->stop, __ATOMIC_RELAXED)) return 1;
    if (run->interrupts &&
        __atomic_load_n(run->interrupts, __ATOMIC_RELAXED) != run->interrupts_seen) {
        __atomic_store_n(&run->stop, ROICORE_STOP_SIGINT, __ATOMIC_RELAXED);
        return 1;
    }
    if (!run->poll) return 0;
    int64_t t = now_ns();
    if (t < run->next_poll_ns) return 0;
    run->next_poll_ns = t + POLL_INTERVAL_NS;
    if (run->poll(run->poll_arg)) {
        __atomic_store_n(&run->stop, ROICORE_STOP_POLL, __ATOMIC_RELAXED);
        return 1;
    }
    return 0;
}

int roicore_run_status(const roicore_run *run, roicore_error *err) {
    switch (run->stop) {
        case 0:
            return ROICORE_OK;
        case ROICORE_STOP_SIGINT:
            return roicore_fail(err, ROICORE_ERR_INTERRUPTED, "interrupted by Ctrl-C (SIGINT)");
        default:
            return roicore_fail(err, ROICORE_ERR_INTERRUPTED,
                                "interrupted: the call was asked to stop");
    }
}

/* ------------------------------------------------------------------------ Ctrl-C */

/* The SIGINT handler before ours, which ours passes each signal on to. */
static struct sigaction previous_sigint;
static pthread_mutex_t watch_lock = PTHREAD_MUTEX_INITIALIZER;

static void on_sigint(int sig, siginfo_t *info, void *context) {
    const struct sigaction before = previous_sigint;
    if (!(before.sa_flags & SA_SIGINFO) && before.sa_handler == SIG_IGN) return;  /* ignored */
    __atomic_add_fetch(&rt()->interrupts, 1, __ATOMIC_RELEASE);
    if (before.sa_flags & SA_SIGINFO) {
        if (before.sa_sigaction) before.sa_sigaction(sig, info, context);
    } else if (before.sa_handler == SIG_DFL) {  /* the default: end the process, as before */
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigaction(SIGINT, &dfl, NULL);
        raise(SIGINT);
    } else {
        before.sa_handler(sig);
    }
}

/* (Re)install on_sigint in front of the process's SIGINT handler when another one took
 * its place (Python's signal.signal installs its own, dropping ours). */
static void watch_sigint(void) {
    struct sigaction current;
    if (sigaction(SIGINT, NULL, &current) != 0) return;
    if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_sigint) return;
    pthread_mutex_lock(&watch_lock);
    if (sigaction(SIGINT, NULL, &current) == 0 &&
        !((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_sigint)) {
        struct sigaction ours = current;
        ours.sa_sigaction = on_sigint;
        ours.sa_flags = (current.sa_flags | SA_SIGINFO) & ~SA_RESETHAND;
        previous_sigint = current;
        sigaction(SIGINT, &ours, NULL);
    }
    pthread_mutex_unlock(&watch_lock);
}

roicore_status roicore_watch_interrupts(roicore_error *err) {
    (void)err;
    watch_sigint();
    __atomic_store_n(&rt()->rewatch, watch_sigint, __ATOMIC_RELEASE);
    return ROICORE_OK;
}

int roicore_await(int64_t *count, int64_t target, roicore_run *run) {
    for (uint32_t spins = 0; __atomic_load_n(count, __ATOMIC_ACQUIRE) < target; ++spins) {
        if ((spins & 255) == 0 && roicore_stopping(run)) return 1;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
        if (spins >= 1u << 14) sched_yield();
    }
    return 0;
}

void roicore_leave(int64_t *left, roicore_run *run) {
    (void)run;  /* the other threads always arrive: they only leave loops early */
    if (omp_get_thread_num() == 0) {
        for (uint32_t spins = 0;
             __atomic_load_n(left, __ATOMIC_ACQUIRE) < omp_get_num_threads() - 1; ++spins) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
            if (spins >= 1u << 14) sched_yield();
        }
    } else {
        roicore_done(left);
    }
}

/* ------------------------------------------------------------------------ memory */

static int64_t physical_memory(void) {
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || size <= 0) return 0;
    return (int64_t)pages * (int64_t)size;
}

int64_t roicore_get_memory_limit(void) {
    roicore_runtime *r = rt();
    int64_t limit = __atomic_load_n(&r->memory_limit, __ATOMIC_RELAXED);
    if (limit < 0) {
        limit = physical_memory();
        __atomic_store_n(&r->memory_limit, limit, __ATOMIC_RELAXED);
    }
    return limit;
}

roicore_status roicore_set_memory_limit(int64_t bytes) {
    if (bytes < 0) return ROICORE_ERR_ARGUMENT;
    __atomic_store_n(&rt()->memory_limit, bytes, __ATOMIC_RELAXED);
    return ROICORE_OK;
}

roicore_status roicore_check_allocation(int64_t bytes, const char *what, roicore_error *err) {
    const int64_t limit = roicore_get_memory_limit();
    if (bytes >= 0 && (limit == 0 || bytes <= limit)) return ROICORE_OK;
    what = what && *what ? what : "an allocation";
    if (bytes < 0)
        return roicore_fail(err, ROICORE_ERR_MEMORY,
                            "%s would take more than 2**63 bytes", what);
    return roicore_fail(err, ROICORE_ERR_MEMORY,
                        "%s would take %lld bytes, over roicore's memory limit of %lld bytes",
                        what, (long long)bytes, (long long)limit);
}

int64_t roicore_mul(int64_t a, int64_t b) {
    int64_t r;
    if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r)) return -1;
    return r;
}

/* Scratch blocks of SCRATCH_KEEP_MIN bytes or more go back to a small cache instead of the
 * system, and the next call that needs about as much takes one.  Inside a framework's
 * threads glibc tends to return a freed block of several MB to the kernel, and the next
 * call then faults in and zeroes every page again, which cost more than the kernel that
 * used the block (an NHWC PS-RoI pass's NCHW copy); the frameworks' own allocators keep
 * freed memory likewise.  At most SCRATCH_SLOTS blocks and scratch_keep_limit bytes are
 * kept idle, the oldest going first. */
#define SCRATCH_KEEP_MIN (1 << 20)
#define SCRATCH_SLACK 4  /* a kept block serves requests down to 1 - 1/SLACK of its size */

typedef struct {
    int64_t bytes;  /* the usable size after the header */
    int64_t stamp;  /* when it was kept, for evicting the oldest */
} scratch_header;

/* A child forked while another thread held the lock would wait for it forever; the kept
 * blocks stay valid in the child, so only the lock starts afresh. */
static pthread_once_t scratch_atfork_once = PTHREAD_ONCE_INIT;
static void scratch_in_child(void) { pthread_mutex_init(&rt()->scratch_lock, NULL); }
static void scratch_register_atfork(void) { pthread_atfork(NULL, NULL, scratch_in_child); }

/* Under AddressSanitizer a kept block is poisoned, and a taken one only up to the bytes
 * asked for, so that a use after free or a write past the request is still reported. */
#if defined(__SANITIZE_ADDRESS__)
#define ROICORE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ROICORE_ASAN 1
#endif
#endif
#ifdef ROICORE_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (size_t)(n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (size_t)(n))
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

static scratch_header *header_of(char *block) { return (scratch_header *)(block - ROICORE_LINE); }

static void release_block(char *block) { free(block - ROICORE_LINE); }

/* A kept block of r's of at least `bytes` and not much more, or NULL. */
static char *take_kept(roicore_runtime *r, int64_t bytes) {
    char *best = NULL;
    pthread_mutex_lock(&r->scratch_lock);
    int slot = -1;
    for (int i = 0; i < SCRATCH_SLOTS; ++i) {
        if (!r->kept[i]) continue;
        const int64_t size = header_of(r->kept[i])->bytes;
        if (size >= bytes && size - size / SCRATCH_SLACK <= bytes &&
            (slot < 0 || size < header_of(r->kept[slot])->bytes))
            slot = i;
    }
    if (slot >= 0) {
        best = r->kept[slot];
        r->kept[slot] = NULL;
        r->kept_bytes -= header_of(best)->bytes;
    }
    pthread_mutex_unlock(&r->scratch_lock);
    return best;
}

void *roicore_scratch(int64_t bytes, const char *what, roicore_error *err) {
    int64_t limit = roicore_get_memory_limit();
    if (bytes < 0 || bytes > INT64_MAX - ROICORE_LINE || (limit > 0 && bytes > limit)) {
        if (bytes < 0)
            roicore_fail(err, ROICORE_ERR_MEMORY,
                         "%s would take more than 2**63 bytes of scratch memory", what);
        else
            roicore_fail(err, ROICORE_ERR_MEMORY,
                         "%s would take %lld bytes of scratch memory, over roicore's memory "
                         "limit of %lld bytes", what, (long long)bytes, (long long)limit);
        return NULL;
    }
    if (bytes >= SCRATCH_KEEP_MIN) {
        pthread_once(&scratch_atfork_once, scratch_register_atfork);
        char *block = take_kept(rt(), bytes);
        if (block) {
            UNPOISON(block, bytes);
            return block;
        }
    }
    void *p = NULL;
    if (posix_memalign(&p, ROICORE_LINE, (size_t)(bytes + ROICORE_LINE)) != 0) {
        roicore_fail(err, ROICORE_ERR_MEMORY, "%s: could not allocate %lld bytes of scratch memory",
                     what, (long long)bytes);
        return NULL;
    }
    char *block = (char *)p + ROICORE_LINE;
    header_of(block)->bytes = bytes;
    return block;
}

/* Under r's lock: its oldest kept block, taken out of the cache; NULL when none is kept. */
static char *pop_oldest(roicore_runtime *r) {
    int oldest = -1;
    for (int i = 0; i < SCRATCH_SLOTS; ++i)
        if (r->kept[i] &&
            (oldest < 0 || header_of(r->kept[i])->stamp < header_of(r->kept[oldest])->stamp))
            oldest = i;
    if (oldest < 0) return NULL;
    char *block = r->kept[oldest];
    r->kept[oldest] = NULL;
    r->kept_bytes -= header_of(block)->bytes;
    return block;
}

#define HUGE_PAGE ((uintptr_t)2 << 20)
#define ADVISE_MIN_BYTES ((int64_t)4 << 20)

void roicore_advise_output(void *data, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (!data || bytes < ADVISE_MIN_BYTES) return;
    const uintptr_t first = ((uintptr_t)data + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    const uintptr_t end = ((uintptr_t)data + (uintptr_t)bytes) & ~(HUGE_PAGE - 1);
    /* a hint: where the kernel refuses it (no THP, a file mapping), nothing changes */
    if (end > first) (void)madvise((void *)first, end - first, MADV_HUGEPAGE);
#else
    (void)data, (void)bytes;
#endif
}

void roicore_scratch_free(void *p) {
    char *block = (char *)p, *evicted[SCRATCH_SLOTS];
    int n_evicted = 0;
    if (!block) return;
    const int64_t bytes = header_of(block)->bytes;
    if (bytes >= SCRATCH_KEEP_MIN) {
        roicore_runtime *r = rt();
        pthread_mutex_lock(&r->scratch_lock);
        if (bytes <= r->scratch_keep_limit) {
            int slot = -1;
            for (;;) {  /* the oldest go until the block fits in a slot and under the limit */
                for (int i = 0; i < SCRATCH_SLOTS && slot < 0; ++i)
                    if (!r->kept[i]) slot = i;
                if (slot >= 0 && r->kept_bytes + bytes <= r->scratch_keep_limit) break;
                evicted[n_evicted++] = pop_oldest(r);
            }
            header_of(block)->stamp = ++r->kept_stamp;
            POISON(block, bytes);
            r->kept[slot] = block;
            r->kept_bytes += bytes;
            block = NULL;
        }
        pthread_mutex_unlock(&r->scratch_lock);
    }
    for (int i = 0; i < n_evicted; ++i) release_block(evicted[i]);
    if (block) release_block(block);
}

/* r's oldest kept blocks released until at most `keep` bytes stay kept; the bytes released. */
static int64_t release_down_to(roicore_runtime *r, int64_t keep) {
    char *evicted[SCRATCH_SLOTS];
    int n_evicted = 0;
    int64_t released = 0;
    pthread_mutex_lock(&r->scratch_lock);
    while (r->kept_bytes > keep) {
        evicted[n_evicted] = pop_oldest(r);
        released += header_of(evicted[n_evicted++])->bytes;
    }
    pthread_mutex_unlock(&r->scratch_lock);
    for (int i = 0; i < n_evicted; ++i) release_block(evicted[i]);
    return released;
}

int64_t roicore_get_scratch_keep_limit(void) {
    roicore_runtime *r = rt();
    pthread_mutex_lock(&r->scratch_lock);
    const int64_t limit = r->scratch_keep_limit;
    pthread_mutex_unlock(&r->scratch_lock);
    return limit;
}

roicore_status roicore_set_scratch_keep_limit(int64_t bytes) {
    if (bytes < 0) return ROICORE_ERR_ARGUMENT;
    roicore_runtime *r = rt();
    pthread_mutex_lock(&r->scratch_lock);
    r->scratch_keep_limit = bytes;
    pthread_mutex_unlock(&r->scratch_lock);
    release_down_to(r, bytes);
    return ROICORE_OK;
}

int64_t roicore_release_scratch(void) { return release_down_to(rt(), 0); }

int64_t *roicore_counters(int n, roicore_error *err) {
    int64_t bytes = (int64_t)n * ROICORE_LINE;
    int64_t *c = (int64_t *)roicore_scratch(bytes, "task counters", err);
    if (c) memset(c, 0, (size_t)bytes);
    return c;
}
