/* Running a kernel over independent units of work (batch rows, or batch rows x blocks of
 * channels) in several threads; included by kernels.c before the kernel bodies.
 *
 * parallel_ranges(threads, units, fn, ctx) splits [0, units) into min(threads, units, MAX_THREADS)
 * contiguous ranges of near-equal size and calls fn(ctx, k, u0, u1) for range k, the first in the
 * calling thread, the others in threads started for the call (POSIX threads) and joined before it
 * returns. A range whose thread cannot be started runs in the caller after its own, so the result
 * never depends on whether threads were available. Each unit's arithmetic is the same in every
 * split, so the results are bit-equal for any thread count. The caller (the Python side) picks
 * `threads` from torch.get_num_threads() and the work's size (library.threads_for). */
#include <pthread.h>

#define MAX_THREADS 64

typedef void (*range_fn)(void *ctx, int64_t k, int64_t u0, int64_t u1);

struct range_job {
    range_fn fn;
    void *ctx;
    int64_t k, u0, u1;
};

static void *run_range(void *p) {
    const struct range_job *job = (const struct range_job *)p;
    job->fn(job->ctx, job->k, job->u0, job->u1);
    return NULL;
}

static void parallel_ranges(int64_t threads, int64_t units, range_fn fn, void *ctx) {
    if (threads > units) threads = units;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads <= 1) {
        if (units > 0) fn(ctx, 0, 0, units);
        return;
    }
    struct range_job jobs[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    int started[MAX_THREADS];
    for (int64_t k = 0; k < threads; k++) {
        struct range_job job = {fn, ctx, k, units * k / threads, units * (k + 1) / threads};
        jobs[k] = job;
    }
    for (int64_t k = 1; k < threads; k++) started[k] = pthread_create(&ids[k], NULL, run_range, &jobs[k]) == 0;
    run_range(&jobs[0]);
    for (int64_t k = 1; k < threads; k++) {
        if (started[k]) pthread_join(ids[k], NULL);
        else run_range(&jobs[k]);
    }
}

/* Blocks of channels per batch row for `threads` threads over B rows of L channels: 1 when the
 * rows alone keep the threads evenly busy (threads divides B), else enough blocks that the units
 * B x blocks split evenly (threads / gcd(B, threads)), at most L. */
static int64_t channel_blocks(int64_t threads, int64_t B, int64_t L) {
    if (threads <= 1 || B <= 0 || L <= 1) return 1;
    int64_t x = B, y = threads;
    while (y) {
        const int64_t r = x % y;
        x = y, y = r;
    }
    const int64_t blocks = threads / x;
    return blocks < L ? blocks : L;
}
