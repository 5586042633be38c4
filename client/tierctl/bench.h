/* SPDX-License-Identifier: MIT */
/* bench.h: tierctl bench: the storage sweep's types, its I/O runs and its helpers. */
#pragma once

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

typedef struct sd_event sd_event;

/* Most targets (tierd's own limit on registered files is 16). */
#define BENCH_TARGETS_MAX 16
/* Most entries of --bs and --qd. */
#define BENCH_LIST_MAX 32
/* Largest --bs: tierd's largest extent. */
#define BENCH_BS_MAX (64ull << 20)
/* Largest --qd (tierd's queue_depth goes to 4096; a sweep past 1024 shows nothing new). */
#define BENCH_QD_MAX 1024u
/*
 * The I/O buffer: one registered buffer, as tierd registers each host
 * segment; requests in flight share its blocks (the bytes do not matter,
 * only that DMA goes to and from real memory), so memory stays bounded
 * whatever bs x qd is.
 */
#define BENCH_POOL_BYTES (64ull << 20)
/* Latency samples kept per run (p50 of the first ones when there are more). */
#define BENCH_LAT_MAX (1u << 22)

typedef enum BenchOp {
        BENCH_READ,
        BENCH_WRITE,
        _BENCH_OP_MAX,
} BenchOp;

typedef struct BenchTarget {
        char name[8];           /* "t0" */
        char *path;             /* what was benched: a tierd target or a PATH given */
        char *scratch;          /* the file written and read */
        int fd;                 /* O_DIRECT, CLOEXEC */
        bool remove;            /* we created @scratch: unlinked at exit */
        double link_gbps;       /* GB/s of the link, 0: unknown */
} BenchTarget;

/* What one run of requests did (bench_run()). */
typedef struct BenchResult {
        uint64_t bytes;
        uint64_t n_io;
        double seconds;
        double gbps;            /* 1e9 bytes/s */
        double iops;
        double lat_us_p50;
        bool registered;        /* through a registered (fixed) buffer, as tierd does */
        /* per interval (sustained phase), when asked for */
        double *interval_gbps;  /* malloc()ed */
        size_t n_intervals;
        bool last_partial;      /* the last interval is shorter (the run ended in it) */
} BenchResult;

/* One run: requests of @bs bytes, @qd in flight, over blocks striped round-robin over @fds. */
typedef struct BenchRunSpec {
        const int *fds;
        unsigned n_fds;
        uint64_t area;          /* bytes usable per file, a multiple of @bs */
        uint64_t bs;
        unsigned qd;
        BenchOp op;
        uint64_t first_block;   /* where to start (wraps at the end of the area) */
        uint64_t max_bytes;     /* stop issuing after this many (at least @qd requests go) */
        double max_seconds;     /* ... or after this long; 0: no bound */
        double interval_s;      /* > 0: throughput per interval in BenchResult.interval_gbps */
} BenchRunSpec;

/*
 * bench_run() - one run through tierd's io_uring path (util/uring.c:
 * a fresh Uring of depth @qd on @event, the files as fixed files, @pool as
 * a registered buffer when the memlock limit allows, else plain).  @stop,
 * set from a signal handler, ends it early (the requests in flight are
 * waited for).  Returns 0, or -errno with *@ret_error saying what failed.
 */
int bench_run(sd_event *event, const BenchRunSpec *spec, uint8_t *pool, size_t pool_size,
              volatile sig_atomic_t *stop, BenchResult *ret, char **ret_error);
void bench_result_deinit(BenchResult *r);

/* ---- bench-sys.c: what the sweep needs from the system --------------------------------------- */

/* "128K,1M": up to BENCH_LIST_MAX sizes, each a positive multiple of 4096 up to BENCH_BS_MAX. */
int bench_parse_bs_list(const char *s, uint64_t *ret, size_t *ret_n, char *err, size_t err_size);
/* "1,2,4": up to BENCH_LIST_MAX depths in 1..BENCH_QD_MAX. */
int bench_parse_qd_list(const char *s, unsigned *ret, size_t *ret_n, char *err, size_t err_size);

/*
 * The GB/s of the PCIe link of the NVMe drive holding @dev (a block device
 * number), from @sysfs ("/sys"); 0 when it is not on an NVMe drive or the
 * link does not say.
 */
double bench_link_gbps(const char *sysfs, unsigned major, unsigned minor);
/* PCIe "current_link_speed" ("8.0 GT/s PCIe") and width to GB/s of payload; 0 if unreadable. */
double bench_pcie_gbps(const char *speed, unsigned width);

/*
 * The "path" of every entry of "targets" in tierd's status JSON @json:
 * *@ret (malloc()ed strings, up to BENCH_TARGETS_MAX), -EBADMSG if @json is
 * not what tierd writes.
 */
int bench_status_targets(const char *json, char ***ret, size_t *ret_n);

/*
 * bench_cliff() - where a sustained write's throughput fell: the first
 * interval (past the second, and not the last: one slow interval is no
 * cliff) whose throughput, and the mean of every one from it on, are below
 * 60% of the mean of those before it.  Returns its index, or -1 for none.
 */
ssize_t bench_cliff(const double *gbps, size_t n);

/* Shortest fio run whose whole-millisecond runtime is trusted (1 ms in it: half a per cent). */
#define FIO_MIN_MS 200u
/* Most runs again with more bytes when one is shorter than that. */
#define FIO_LONGER_TRIES 3u

/*
 * Run fio (from $PATH): @op, @bs, @qd, O_DIRECT through io_uring on
 * @files (round-robin), @size bytes per file, at most @max_bytes and
 * @seconds; a run under FIO_MIN_MS is run again with more bytes
 * (bench_fio_longer(), at most FIO_LONGER_TRIES times).  *@ret_gbps (io_bytes / runtime) and *@ret_ms (its
 * runtime); -ENOENT (no fio) or -EIO with *@ret_error.
 */
int bench_fio(char *const *files, unsigned n, BenchOp op, uint64_t bs, unsigned qd, uint64_t size,
              uint64_t max_bytes, double seconds, bool fixedbufs, double *ret_gbps, uint64_t *ret_ms,
              char **ret_error);
/*
 * io_bytes and runtime (ms; 1 for a run under a millisecond) of the "read" or
 * "write" part of fio's JSON output; -EBADMSG if absent.
 */
int bench_fio_parse(const char *json, BenchOp op, uint64_t *ret_bytes, uint64_t *ret_ms);
/* GB/s of @bytes in @ms (0 for 0 ms). */
double bench_fio_gbps(uint64_t bytes, uint64_t ms);
/* The bytes to run again when @bytes took @ms < FIO_MIN_MS, else 0. */
uint64_t bench_fio_longer(uint64_t bytes, uint64_t ms);

/* ---- the sweep (bench.c) and its report (bench-report.c) ------------------------------------ */

/* A cell's target: an index into Bench.targets, or this for all of them striped. */
#define BENCH_STRIPED (-1)

typedef struct BenchCell {
        int target;             /* index, or BENCH_STRIPED */
        BenchOp op;
        uint64_t bs;
        unsigned qd;
        BenchResult res;
        bool suspect;           /* faster than the link: a cache answered */
} BenchCell;

typedef struct BenchBest {
        bool set;
        int target;
        uint64_t bs;
        unsigned qd;
        double gbps;
} BenchBest;

typedef struct Bench {
        /* options */
        uint64_t size;                  /* scratch bytes per target */
        uint64_t bs[BENCH_LIST_MAX];
        size_t n_bs;
        unsigned qd[BENCH_LIST_MAX];
        size_t n_qd;
        double seconds_per_cell;
        uint64_t bytes_per_cell;
        uint64_t sustain_bytes;         /* sustained phase: bytes, or ... */
        double sustain_seconds;         /* ... seconds (both 0: none) */
        double interval_s;
        double link_gbps;               /* --link-gbps; < 0: from sysfs */
        bool fio;

        /* results */
        char time[32];                  /* ISO 8601, UTC */
        BenchTarget targets[BENCH_TARGETS_MAX];
        unsigned n_targets;
        bool registered;                /* every run had a registered buffer */
        BenchResult prefill[BENCH_TARGETS_MAX];
        BenchCell *cells;
        size_t n_cells;
        BenchBest best[_BENCH_OP_MAX];
        BenchBest target_best[BENCH_TARGETS_MAX][_BENCH_OP_MAX];
        struct {
                bool ran;
                char *reason;           /* why not, when !ran */
                int target[_BENCH_OP_MAX];      /* each op's best cell's target */
                uint64_t ms[_BENCH_OP_MAX];     /* fio's runtime */
                double gbps[_BENCH_OP_MAX];
                uint64_t bs[_BENCH_OP_MAX];
                unsigned qd[_BENCH_OP_MAX];
        } fio_result;
        struct {
                bool ran;
                int target;
                uint64_t bs;
                unsigned qd;
                BenchResult res;
                ssize_t cliff;          /* interval index, -1: none */
                uint64_t cliff_bytes;
        } sustained;
        struct {
                bool set;
                uint64_t extent_size;
                unsigned queue_depth;
                int target;
                double read_gbps, write_gbps;
                char why[160];          /* when !set */
        } config;
} Bench;

/* The name of a cell's target: "t0" or "striped". */
const char *bench_target_name(const Bench *b, int target);
/* The link speed of @target (striped: the sum, 0 if any is unknown); 0: unknown. */
double bench_target_link(const Bench *b, int target);

/*
 * bench_choose_config() - the [nvme] extent_size and queue_depth for
 * tierd: over the cells of the striped set (the one target when there is
 * one), the smallest power-of-two bs, then the smallest qd, whose mean of
 * read and write GB/s is within 5% of the best mean.
 */
void bench_choose_config(Bench *b);
/* The results as one JSON document (the schema of tierctl(1)). */
int bench_json(const Bench *b, char **ret);
/* The results as tables, for people. */
void bench_print(const Bench *b, FILE *f);
/* A tierd.conf drop-in with the chosen settings to @path; -errno with *@ret_error. */
int bench_write_config(const Bench *b, const char *path, char **ret_error);
/* Write @text to @path (through a temporary file renamed over it), making the directory if needed. */
int bench_save(const char *path, const char *text, bool mkdirs, char **ret_error);
/* Whether bench_save() without mkdirs can write @path, so that a wrong --save or --write-config
 * fails before the benchmark runs: its directory must exist and take new files (a temporary one
 * renamed over @path).  0, or -errno with *@ret_error naming the directory. */
int bench_save_check(const char *path, char **ret_error);
