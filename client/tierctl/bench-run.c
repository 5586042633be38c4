/* SPDX-License-Identifier: MIT */
/* bench-run.c: one run of tierctl bench's sweep, through the io_uring queue tierd uses (util/uring.c). */

/*
 * Theory of operation: a run is what tierd's engine does when it moves a
 * tensor to or from NVMe (daemon/engine/xfer.c), stripped of the tensor:
 * one UringReq per block of @bs bytes, on a Uring of depth @qd (tierd's
 * [nvme] queue_depth), the files registered as fixed files and the buffer
 * as a registered buffer (tierd's host segments are), block i of the run on
 * file i mod n (tierd's extents are striped the same way, nvme_alloc()).
 * The Uring is util/uring.c, the one tierd runs (libtierutil-uring): the
 * same queueing, batching, eventfd wake-ups and resumption of short
 * transfers.  @qd requests are queued at the start; each completion
 * queues the next block until the run's byte or time bound, so @qd stay in
 * flight.  The sd-event loop runs until the last completion.
 *
 * Times: a run starts before the first request is queued and ends at the
 * last completion; a request's latency runs from just before it goes to the
 * ring (its prep callback) to its completion callback, so it includes the
 * loop's dispatch, as tierd's would.
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-event.h>

#include "client/tierctl/bench.h"
#include "proto/macro.h"
#include "util/time-util.h"
#include "util/uring.h"

typedef struct Run Run;

typedef struct Slot {
        UringReq req;
        Run *run;
        uint64_t t_prep;
} Slot;

struct Run {
        sd_event *event;
        Uring *uring;
        const BenchRunSpec *spec;
        uint8_t *pool;
        size_t pool_blocks;
        bool registered;
        volatile sig_atomic_t *stop;
        Slot *slots;
        uint64_t next_block;
        uint64_t max_io;
        uint64_t issued, completed, bytes;
        uint64_t t0, t_end, deadline;
        int error;
        bool done;              /* the last completion came */
        uint64_t *lat;
        size_t n_lat, lat_alloc;
        uint64_t *ibytes;       /* bytes completed per interval */
        size_t n_ibytes;
        uint64_t interval_ns;
};

static uint64_t now_mono(void) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return timespec_to_ns(&ts);
}

static void slot_prep(UringReq *req) {
        Slot *s = container_of(req, Slot, req);

        s->t_prep = now_mono();
}

static bool run_may_issue(Run *r) {
        if (r->error < 0 || (r->stop && *r->stop))
                return false;
        if (r->issued >= r->max_io)
                return false;
        /* the time bound only stops issuing once every slot has had a request */
        if (r->deadline && r->issued >= r->spec->qd && now_mono() >= r->deadline)
                return false;
        return true;
}

static void slot_done(UringReq *req, int res);

static void slot_issue(Run *r, Slot *s, unsigned index) {
        const BenchRunSpec *sp = r->spec;
        uint64_t b = r->next_block++;
        uint64_t per_file = sp->area / sp->bs;
        unsigned file = (unsigned) (b % sp->n_fds);
        uint64_t fblock = (b / sp->n_fds) % per_file;
        size_t pblock = index % r->pool_blocks;

        s->req = (UringReq) {
                .cb = slot_done,
                .prep = slot_prep,
                .op = sp->op == BENCH_READ ? URING_READ : URING_WRITE,
                .file_index = file,
                .buf_index = r->registered ? 0 : -1,
                .buf = r->pool + pblock * sp->bs,
                .len = (uint32_t) sp->bs,
                .offset = fblock * sp->bs,
        };
        list_init(&s->req.link);
        r->issued++;
        uring_queue(r->uring, &s->req);
}

static void run_account(Run *r, uint64_t now, uint64_t len, uint64_t t_prep) {
        r->completed++;
        r->bytes += len;
        r->t_end = now;
        if (r->lat && now >= t_prep) {
                if (r->n_lat == r->lat_alloc && r->lat_alloc < BENCH_LAT_MAX) {
                        size_t n = MIN((size_t) BENCH_LAT_MAX, MAX(r->lat_alloc * 2, (size_t) 1024));
                        uint64_t *p = realloc(r->lat, n * sizeof(*p));

                        if (p) {
                                r->lat = p;
                                r->lat_alloc = n;
                        }
                }
                if (r->n_lat < r->lat_alloc)
                        r->lat[r->n_lat++] = now - t_prep;
        }
        if (r->interval_ns) {
                size_t i = (size_t) ((now - r->t0) / r->interval_ns);

                if (i >= r->n_ibytes) {
                        size_t n = MAX(i + 1, r->n_ibytes * 2);
                        uint64_t *p = realloc(r->ibytes, n * sizeof(*p));

                        if (!p) {
                                r->error = -ENOMEM;
                                return;
                        }
                        memset(p + r->n_ibytes, 0, (n - r->n_ibytes) * sizeof(*p));
                        r->ibytes = p;
                        r->n_ibytes = n;
                }
                r->ibytes[i] += len;
        }
}

static void slot_done(UringReq *req, int res) {
        Slot *s = container_of(req, Slot, req);
        Run *r = s->run;

        if (res < 0) {
                if (r->error == 0)
                        r->error = res;
                r->completed++;
        } else
                run_account(r, now_mono(), (uint64_t) res, s->t_prep);
        if (run_may_issue(r))
                slot_issue(r, s, (unsigned) (s - r->slots));
        else if (r->completed == r->issued)
                r->done = true;
}

static int cmp_u64(const void *a, const void *b) {
        uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;

        return x < y ? -1 : x > y;
}

static int errorf(char **ret_error, int r, const char *what) {
        if (ret_error && asprintf(ret_error, "%s: %s", what, strerror(-r)) < 0)
                *ret_error = NULL;
        return r;
}

void bench_result_deinit(BenchResult *r) {
        r->interval_gbps = mfree(r->interval_gbps);
        r->n_intervals = 0;
}

int bench_run(sd_event *event, const BenchRunSpec *spec, uint8_t *pool, size_t pool_size,
              volatile sig_atomic_t *stop, BenchResult *ret, char **ret_error) {
        Run r = {
                .event = event,
                .spec = spec,
                .pool = pool,
                .pool_blocks = pool_size / spec->bs,
                .stop = stop,
        };
        BenchResult res = {};
        uint64_t per_file;
        int k;

        if (spec->n_fds == 0 || spec->bs == 0 || spec->qd == 0 || r.pool_blocks == 0 || spec->area < spec->bs)
                return -EINVAL;
        per_file = spec->area / spec->bs;
        r.next_block = spec->first_block % (per_file * spec->n_fds);
        /* not DIV_ROUND_UP(): max_bytes may be UINT64_MAX (no bound) */
        r.max_io = MAX(spec->max_bytes / spec->bs + (spec->max_bytes % spec->bs != 0), (uint64_t) spec->qd);
        r.interval_ns = spec->interval_s > 0 ? (uint64_t) (spec->interval_s * 1e9) : 0;
        r.slots = calloc(spec->qd, sizeof(Slot));
        if (!r.slots)
                return -ENOMEM;
        if (!r.interval_ns) {
                r.lat = malloc(1024 * sizeof(uint64_t));
                r.lat_alloc = r.lat ? 1024 : 0;
        }

        k = uring_new(event, spec->qd, &r.uring);
        if (k < 0) {
                errorf(ret_error, k, "Cannot set up an io_uring");
                goto out;
        }
        k = uring_register_files(r.uring, spec->fds, spec->n_fds);
        if (k < 0) {
                errorf(ret_error, k, "Cannot register the files with io_uring");
                goto out;
        }
        /* registered buffers are pinned and count against RLIMIT_MEMLOCK: plain buffers if refused */
        r.registered = uring_register_buffers(r.uring, 1) >= 0 && uring_set_buffer(r.uring, 0, pool, pool_size) >= 0;

        r.t0 = r.t_end = now_mono();
        r.deadline = spec->max_seconds > 0 ? r.t0 + (uint64_t) (spec->max_seconds * 1e9) : 0;
        for (unsigned i = 0; i < spec->qd && run_may_issue(&r); i++) {
                r.slots[i].run = &r;
                slot_issue(&r, &r.slots[i], i);
        }
        /* as the engine does after queueing a transfer's parts; later ones go from uring.c's own sources */
        (void) uring_flush(r.uring);
        /* not sd_event_loop(): @event (and its signal sources) serves every run of the sweep */
        while (r.issued > 0 && !r.done) {
                k = sd_event_run(event, UINT64_MAX);
                if (k < 0) {
                        errorf(ret_error, k, "The event loop failed");
                        goto out;
                }
        }
        if (r.error < 0) {
                k = errorf(ret_error, r.error, spec->op == BENCH_READ ? "A read failed" : "A write failed");
                goto out;
        }

        res.bytes = r.bytes;
        res.n_io = r.completed;
        res.seconds = (double) (r.t_end - r.t0) / 1e9;
        res.registered = r.registered;
        if (res.seconds > 0) {
                res.gbps = (double) r.bytes / res.seconds / 1e9;
                res.iops = (double) r.completed / res.seconds;
        }
        if (r.n_lat > 0) {
                qsort(r.lat, r.n_lat, sizeof(uint64_t), cmp_u64);
                res.lat_us_p50 = (double) r.lat[r.n_lat / 2] / 1e3;
        }
        if (r.interval_ns && r.bytes > 0) {
                /* the last interval is as long as the run lasted in it */
                size_t n = MAX((size_t) DIV_ROUND_UP(r.t_end - r.t0, r.interval_ns), (size_t) 1);

                res.interval_gbps = calloc(n, sizeof(double));
                if (!res.interval_gbps) {
                        k = -ENOMEM;
                        goto out;
                }
                for (size_t i = 0; i < n; i++) {
                        uint64_t start = i * r.interval_ns;
                        uint64_t len = MIN(r.interval_ns, r.t_end - r.t0 - start);

                        /* bytes per ns: GB/s */
                        res.interval_gbps[i] = i < r.n_ibytes && len > 0 ? (double) r.ibytes[i] / (double) len : 0;
                }
                res.n_intervals = n;
                res.last_partial = (r.t_end - r.t0) % r.interval_ns != 0;
        }
        *ret = res;
        k = 0;
out:
        /* uring_free() waits for what is still in flight: the slots and the pool outlive it */
        uring_free(r.uring);
        free(r.slots);
        free(r.lat);
        free(r.ibytes);
        return k;
}
