/* SPDX-License-Identifier: MIT */
/* bench-io.c: host<->NVMe bandwidth through tierd, against fio on the same directory. */

/*
 * Theory of operation
 *
 * The program is a client of a running tierd whose NVMe tier is backed by
 * file(s) in --dir (bench/run sets that up).  It creates T tensors, pins each
 * in HOST, fills it with a pattern derived from a per-run seed, and unpins it
 * dirty.  Then, in each of --repeat rounds, timed:
 *
 *   write:     tier_evict_async(NVME) for every tensor, then tier_fence_wait on
 *              every fence: the dirty host copies are written to NVMe and
 *              dropped.
 *   read:      tier_prefetch_async(HOST) for every tensor, then wait on all.
 *   fio write, fio read: the baseline (below).
 *
 * Rounds after the first re-pin and unpin every tensor dirty first, so that
 * each write pass writes everything again.  After the last round it pins
 * each tensor and checks sample words of every 1 MiB (every word with
 * --verify-all), so a fast but wrong data path shows as "verified":false.
 *
 * The baseline is fio on the same directory with the same byte count, set up
 * as tierd's I/O path is: 1 MiB blocks (bench/run's extent_size), io_uring,
 * O_DIRECT, the queue depth of tierd's ring in this run (--queue-depth, which
 * bench/run passes from the [nvme] queue_depth it wrote), registered buffers
 * and files (--fixedbufs --registerfiles): --rw=write, then --rw=read of the
 * file just written.  A shallower queue or plain buffers would measure fio
 * below the drive and make tierd look faster than it.  The ratios are paired:
 * tierd / fio of each round (the two ran back to back), then the median of
 * those, so that a round where the device was slow for both does not pair
 * one pass's median with another's.  tierd and fio alternate inside each round so that drift of the
 * device hits both alike; the figures are the medians of the rounds, and the
 * ratios (medians of the rounds' ratios) say how much of the raw drive
 * bandwidth tierd delivers.  Nothing is
 * asserted: figures and baseline are printed as one JSON line on stdout.
 */

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tier.h>

#include "bench/common.h"
#include "proto/macro.h"
#include "util/size.h"
#include "util/time-util.h"

/* Verification unit: of each MiB of a tensor, the first, the last and one random word are checked. */
#define VERIFY_STRIDE (UINT64_C(1) << 20)
/* fio's block size: the extent size of bench/run's config. */
#define FIO_BS "1M"
/* tierd's [nvme] queue_depth when --queue-depth is not given (its default, and bench/run's). */
#define DEFAULT_QUEUE_DEPTH 64
/* fio's JSON report is a few KiB; anything much larger is not what we asked for. */
#define FIO_REPORT_MAX (UINT64_C(16) << 20)
/* Most rounds of --repeat. */
#define MAX_REPEAT 100

typedef struct Args {
        const char *socket;
        const char *job;
        const char *dir;
        const char *fio;
        uint64_t total;
        uint64_t tensor_size;
        uint64_t targets;
        uint64_t repeat;
        uint64_t queue_depth;
        bool verify_all;
        bool no_fio;
} Args;

static uint64_t splitmix64(uint64_t x) {
        x += UINT64_C(0x9e3779b97f4a7c15);
        x = (x ^ (x >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
        x = (x ^ (x >> 27)) * UINT64_C(0x94d049bb133111eb);
        return x ^ (x >> 31);
}

/* The expected value of word @w of tensor @i. */
static inline uint64_t pattern(uint64_t seed, uint64_t i, uint64_t w) {
        return splitmix64(seed ^ (i << 40) ^ w);
}

static void log_tier_error(tier_client *c, int r, const char *what, const char *name) {
        const char *why = c ? tier_client_last_error(c) : "";

        bench_log("%s \"%s\" failed: %s%s%s", what, name ? name : "", tier_strerror(r),
                  why && *why ? ": " : "", why && *why ? why : "");
}

/* ---- fio baseline ------------------------------------------------------- */

/* Find `"key" : {` (any whitespace) at or after @s. */
static const char *json_find_object(const char *s, const char *key) {
        size_t klen = strlen(key);

        for (const char *p = s; (p = strstr(p, "\"")) != NULL; p++) {
                const char *q;

                if (strncmp(p + 1, key, klen) != 0 || p[1 + klen] != '"')
                        continue;
                q = p + 2 + klen;
                q += strspn(q, " \t\r\n");
                if (*q != ':')
                        continue;
                q++;
                q += strspn(q, " \t\r\n");
                if (*q == '{')
                        return q;
        }
        return NULL;
}

/*
 * fio_parse_bw() - jobs[0].<rw>.bw_bytes of a fio --output-format=json report.
 * bw_bytes is a plain member of the "read"/"write" object and comes before
 * its nested objects, so the first one after the object's brace is its own.
 */
static int fio_parse_bw(const char *report, const char *rw, uint64_t *ret_bps) {
        const char *jobs, *obj, *p;
        uint64_t v;
        char *end;

        jobs = strstr(report, "\"jobs\"");
        if (!jobs)
                return -EBADMSG;
        obj = json_find_object(jobs, rw);
        if (!obj)
                return -EBADMSG;
        p = strstr(obj, "\"bw_bytes\"");
        if (!p)
                return -EBADMSG;
        p += strlen("\"bw_bytes\"");
        p += strspn(p, " \t\r\n");
        if (*p != ':')
                return -EBADMSG;
        p++;
        p += strspn(p, " \t\r\n");
        errno = 0;
        v = strtoull(p, &end, 10);
        if (errno != 0 || end == p)
                return -EBADMSG;
        *ret_bps = v;
        return 0;
}

static int read_file(const char *path, char **ret) {
        _cleanup_close_ int fd = -1;
        _cleanup_free_ char *buf = NULL;
        struct stat st;
        size_t len = 0;

        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return negative_errno();
        if (fstat(fd, &st) < 0)
                return negative_errno();
        if ((uint64_t) st.st_size > FIO_REPORT_MAX)
                return -EFBIG;
        buf = malloc((size_t) st.st_size + 1);
        if (!buf)
                return -ENOMEM;
        while (len < (size_t) st.st_size) {
                ssize_t n = read(fd, buf + len, (size_t) st.st_size - len);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return negative_errno();
                }
                if (n == 0)
                        break;
                len += (size_t) n;
        }
        buf[len] = '\0';
        *ret = TAKE_PTR(buf);
        return 0;
}

/*
 * run_fio() - one fio pass (@rw: "write" or "read") over a->total bytes of
 * <dir>/fio-bench.dat; *ret_bps in bytes/s.
 * fio's own messages go to stderr; its JSON report to a file that is removed.
 */
static int run_fio(const Args *a, const char *rw, uint64_t *ret_bps) {
        _cleanup_free_ char *directory = NULL, *size = NULL, *iodepth = NULL, *output = NULL, *report_path = NULL;
        _cleanup_free_ char *report = NULL;
        char *argv[16];
        size_t n = 0;
        pid_t pid;
        int status, r;

        if (asprintf(&directory, "--directory=%s", a->dir) < 0 ||
            asprintf(&size, "--size=%" PRIu64, a->total) < 0 ||
            asprintf(&iodepth, "--iodepth=%" PRIu64, a->queue_depth) < 0 ||
            asprintf(&report_path, "%s/fio-%s.json", a->dir, rw) < 0 ||
            asprintf(&output, "--output=%s", report_path) < 0)
                return -ENOMEM;

        argv[n++] = (char *) a->fio;
        argv[n++] = (char *) "--name=w";
        argv[n++] = directory;
        argv[n++] = (char *) "--filename=fio-bench.dat";
        argv[n++] = size;
        argv[n++] = (char *) "--bs=" FIO_BS;
        argv[n++] = iodepth;
        argv[n++] = (char *) "--ioengine=io_uring";
        argv[n++] = (char *) "--direct=1";
        /* as tierd's ring: its host segments and targets are registered */
        argv[n++] = (char *) "--fixedbufs";
        argv[n++] = (char *) "--registerfiles";
        argv[n++] = (char *) (strcmp(rw, "write") == 0 ? "--rw=write" : "--rw=read");
        argv[n++] = (char *) "--output-format=json";
        argv[n++] = output;
        argv[n] = NULL;

        fflush(stderr);
        pid = fork();
        if (pid < 0)
                return negative_errno();
        if (pid == 0) {
                /* Keep our stdout for the one JSON line; die with us (bench/run interrupted). */
                (void) dup2(STDERR_FILENO, STDOUT_FILENO);
                (void) prctl(PR_SET_PDEATHSIG, SIGTERM);
                execvp(argv[0], argv);
                fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
                _exit(127);
        }
        while (waitpid(pid, &status, 0) < 0)
                if (errno != EINTR)
                        return negative_errno();
        if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
                bench_log("fio not found (\"%s\"): install fio (./scripts/test installs it)", a->fio);
                (void) unlink(report_path);
                return -ENOENT;
        }
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                bench_log("fio --rw=%s failed (status 0x%x)", rw, (unsigned) status);
                (void) unlink(report_path);
                return -EIO;
        }
        r = read_file(report_path, &report);
        (void) unlink(report_path);
        if (r < 0) {
                bench_log("reading fio report %s: %s", report_path, strerror(-r));
                return r;
        }
        r = fio_parse_bw(report, rw, ret_bps);
        if (r < 0) {
                bench_log("no %s.bw_bytes in fio's JSON report", rw);
                return r;
        }
        return 0;
}

/* ---- tierd passes -------------------------------------------------------- */

typedef struct Run {
        tier_client *client;
        tier_tensor **tensors;
        tier_fence *fences;
        size_t n;
        uint64_t seed;
} Run;

static int fill_all(Run *run, uint64_t size) {
        for (size_t i = 0; i < run->n; i++) {
                struct tier_grant g;
                uint64_t *w;
                int r;

                r = tier_pin(run->tensors[i], TIER_HOST, TIER_READ_WRITE, &g);
                if (r < 0) {
                        log_tier_error(run->client, r, "pin in host", tier_tensor_name(run->tensors[i]));
                        return r;
                }
                if (!g.ptr || g.length < size) {
                        bench_log("pin of \"%s\" in host gave no mapping", tier_tensor_name(run->tensors[i]));
                        (void) tier_unpin(run->tensors[i], TIER_HOST, 0);
                        return -EPROTO;
                }
                w = g.ptr;
                for (uint64_t k = 0; k < size / 8; k++)
                        w[k] = pattern(run->seed, i, k);
                r = tier_unpin(run->tensors[i], TIER_HOST, 1);
                if (r < 0) {
                        log_tier_error(run->client, r, "unpin", tier_tensor_name(run->tensors[i]));
                        return r;
                }
        }
        return 0;
}

/* Count tensors whose copy in @tier is not absent. */
static int count_present(Run *run, int tier, size_t *ret) {
        size_t k = 0;

        for (size_t i = 0; i < run->n; i++) {
                struct tier_stat st;
                int r;

                r = tier_tensor_stat(run->tensors[i], &st);
                if (r < 0) {
                        log_tier_error(run->client, r, "stat", tier_tensor_name(run->tensors[i]));
                        return r;
                }
                if (st.state[tier] != 0)
                        k++;
        }
        *ret = k;
        return 0;
}

/* Evict (or prefetch) every tensor, then wait for every fence; *ret_ns is the wall time. */
static int timed_pass(Run *run, bool evict, uint64_t *ret_ns) {
        uint64_t t0 = now_ns();
        int r;

        for (size_t i = 0; i < run->n; i++) {
                r = evict ? tier_evict_async(run->tensors[i], TIER_NVME, &run->fences[i])
                          : tier_prefetch_async(run->tensors[i], TIER_HOST, &run->fences[i]);
                if (r < 0) {
                        log_tier_error(run->client, r, evict ? "evict to nvme" : "prefetch to host",
                                       tier_tensor_name(run->tensors[i]));
                        return r;
                }
        }
        for (size_t i = 0; i < run->n; i++) {
                r = tier_fence_wait(run->client, run->fences[i], -1);
                if (r < 0) {
                        log_tier_error(run->client, r, evict ? "wait for evict" : "wait for prefetch",
                                       tier_tensor_name(run->tensors[i]));
                        return r;
                }
        }
        *ret_ns = now_ns() - t0;
        return 0;
}

static int verify_tensors(Run *run, uint64_t size, bool every_word, bool *ret_ok, uint64_t *ret_words) {
        uint64_t words = size / 8, checked = 0, rnd = run->seed;
        bool ok = true;

        for (size_t i = 0; i < run->n; i++) {
                struct tier_grant g;
                const uint64_t *w;
                int r;

                r = tier_pin(run->tensors[i], TIER_HOST, TIER_READ_WRITE, &g);
                if (r < 0) {
                        log_tier_error(run->client, r, "pin for verify", tier_tensor_name(run->tensors[i]));
                        return r;
                }
                if (!g.ptr || g.length < size) {
                        (void) tier_unpin(run->tensors[i], TIER_HOST, 0);
                        return -EPROTO;
                }
                w = g.ptr;
                for (uint64_t base = 0; base < words; base += VERIFY_STRIDE / 8) {
                        uint64_t span = MIN(VERIFY_STRIDE / 8, words - base);
                        uint64_t idx[3];
                        size_t n_idx = 0;

                        if (every_word) {
                                for (uint64_t k = base; k < base + span; k++)
                                        if (w[k] != pattern(run->seed, i, k)) {
                                                if (ok)
                                                        bench_log("mismatch: tensor %zu word %" PRIu64, i, k);
                                                ok = false;
                                        }
                                checked += span;
                                continue;
                        }
                        rnd = splitmix64(rnd);
                        idx[n_idx++] = base;
                        idx[n_idx++] = base + span - 1;
                        idx[n_idx++] = base + rnd % span;
                        for (size_t k = 0; k < n_idx; k++) {
                                if (w[idx[k]] != pattern(run->seed, i, idx[k])) {
                                        if (ok)
                                                bench_log("mismatch: tensor %zu word %" PRIu64 ": %#" PRIx64
                                                          " != %#" PRIx64, i, idx[k], w[idx[k]],
                                                          pattern(run->seed, i, idx[k]));
                                        ok = false;
                                }
                                checked++;
                        }
                }
                r = tier_unpin(run->tensors[i], TIER_HOST, 0);
                if (r < 0) {
                        log_tier_error(run->client, r, "unpin after verify", tier_tensor_name(run->tensors[i]));
                        return r;
                }
        }
        *ret_ok = ok;
        *ret_words = checked;
        return 0;
}

static double gbps(uint64_t bytes, uint64_t ns) {
        return ns ? (double) bytes / (double) ns : 0; /* bytes/ns == GB/s (1e9) */
}

static void usage(void) {
        fprintf(stderr,
                "usage: %s --dir DIR [options]\n"
                "  --socket PATH       tierd socket (default $TIER_SOCKET, else the built-in one)\n"
                "  --dir DIR           directory of tierd's NVMe target(s); fio runs there too\n"
                "  --total SIZE        bytes moved per pass (default 1G)\n"
                "  --tensor-size SIZE  bytes per tensor (default 16M)\n"
                "  --targets N         number of target files tierd stripes over (reported only)\n"
                "  --job NAME          job name (default bench-io-PID)\n"
                "  --fio PATH          fio binary (default fio)\n"
                "  --no-fio            skip the fio baseline (its fields are null)\n"
                "  --queue-depth N     tierd's [nvme] queue_depth in this run: fio's iodepth (default %d)\n"
                "  --repeat N          rounds of tierd write+read and fio write+read (default 3);\n"
                "                      the figures are medians\n"
                "  --verify-all        check every word after the last read pass, not a sample\n"
                "Prints one JSON line on stdout; progress on stderr.\n",
                program_invocation_short_name, DEFAULT_QUEUE_DEPTH);
}

static int parse_args(int argc, char **argv, Args *a) {
        enum { ARG_SOCKET = 0x100, ARG_DIR, ARG_TOTAL, ARG_TENSOR_SIZE, ARG_TARGETS, ARG_JOB, ARG_FIO,
               ARG_NO_FIO, ARG_VERIFY_ALL, ARG_REPEAT, ARG_QUEUE_DEPTH };
        static const struct option options[] = {
                { "help", no_argument, NULL, 'h' },
                { "socket", required_argument, NULL, ARG_SOCKET },
                { "dir", required_argument, NULL, ARG_DIR },
                { "total", required_argument, NULL, ARG_TOTAL },
                { "tensor-size", required_argument, NULL, ARG_TENSOR_SIZE },
                { "targets", required_argument, NULL, ARG_TARGETS },
                { "job", required_argument, NULL, ARG_JOB },
                { "fio", required_argument, NULL, ARG_FIO },
                { "no-fio", no_argument, NULL, ARG_NO_FIO },
                { "verify-all", no_argument, NULL, ARG_VERIFY_ALL },
                { "repeat", required_argument, NULL, ARG_REPEAT },
                { "queue-depth", required_argument, NULL, ARG_QUEUE_DEPTH },
                {}
        };
        int c, r;

        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
                switch (c) {
                case 'h':
                        usage();
                        exit(EXIT_SUCCESS);
                case ARG_SOCKET:
                        a->socket = optarg;
                        break;
                case ARG_DIR:
                        a->dir = optarg;
                        break;
                case ARG_TOTAL:
                        r = size_parse(optarg, &a->total);
                        if (r < 0 || a->total == 0) {
                                bench_log("bad --total \"%s\"", optarg);
                                return -EINVAL;
                        }
                        break;
                case ARG_TENSOR_SIZE:
                        r = size_parse(optarg, &a->tensor_size);
                        if (r < 0 || a->tensor_size == 0 || a->tensor_size % 8 != 0) {
                                bench_log("bad --tensor-size \"%s\" (a non-zero multiple of 8)", optarg);
                                return -EINVAL;
                        }
                        break;
                case ARG_TARGETS:
                        r = bench_parse_uint(optarg, 1, 16, &a->targets);
                        if (r < 0) {
                                bench_log("bad --targets \"%s\" (1..16)", optarg);
                                return -EINVAL;
                        }
                        break;
                case ARG_JOB:
                        a->job = optarg;
                        break;
                case ARG_FIO:
                        a->fio = optarg;
                        break;
                case ARG_NO_FIO:
                        a->no_fio = true;
                        break;
                case ARG_VERIFY_ALL:
                        a->verify_all = true;
                        break;
                case ARG_REPEAT:
                        r = bench_parse_uint(optarg, 1, MAX_REPEAT, &a->repeat);
                        if (r < 0) {
                                bench_log("bad --repeat \"%s\" (1..%d)", optarg, MAX_REPEAT);
                                return -EINVAL;
                        }
                        break;
                case ARG_QUEUE_DEPTH:
                        /* tierd's own range for [nvme] queue_depth */
                        r = bench_parse_uint(optarg, 1, 4096, &a->queue_depth);
                        if (r < 0) {
                                bench_log("bad --queue-depth \"%s\" (1..4096)", optarg);
                                return -EINVAL;
                        }
                        break;
                default:
                        return -EINVAL;
                }
        }
        if (optind < argc) {
                bench_log("unexpected argument \"%s\"", argv[optind]);
                return -EINVAL;
        }
        if (!a->dir && !a->no_fio) {
                bench_log("--dir DIR is required: the fio baseline runs on tierd's target directory");
                return -EINVAL;
        }
        if (a->total % a->tensor_size != 0 || a->total / a->tensor_size > 65536) {
                bench_log("--total must be a multiple of --tensor-size, at most 65536 tensors");
                return -EINVAL;
        }
        return 0;
}

/* Mark every tensor's host copy dirty again, so that the next evict writes it. */
static int dirty_all(Run *run) {
        for (size_t i = 0; i < run->n; i++) {
                struct tier_grant g;
                int r;

                r = tier_pin(run->tensors[i], TIER_HOST, TIER_READ_WRITE, &g);
                if (r < 0) {
                        log_tier_error(run->client, r, "pin in host", tier_tensor_name(run->tensors[i]));
                        return r;
                }
                r = tier_unpin(run->tensors[i], TIER_HOST, 1);
                if (r < 0) {
                        log_tier_error(run->client, r, "unpin", tier_tensor_name(run->tensors[i]));
                        return r;
                }
        }
        return 0;
}

/* One repetition: tierd write and read, then fio write and read; GB/s into the arrays. */
static int one_round(const Args *a, Run *run, unsigned k, double *tw, double *tr, double *fw, double *fr,
                     size_t *nvme_before, size_t *host_after) {
        uint64_t ns, bps;
        size_t n;
        int r;

        if (k > 0) {
                r = dirty_all(run);
                if (r < 0)
                        return r;
        }
        /* A copy already on NVMe (write-behind) would make the write figure too good. */
        r = count_present(run, TIER_NVME, &n);
        if (r < 0)
                return r;
        if (n > 0)
                bench_log("%zu tensors already have an NVMe copy before the write pass", n);
        *nvme_before = MAX(*nvme_before, n);

        r = timed_pass(run, true, &ns);
        if (r < 0)
                return r;
        tw[k] = gbps(a->total, ns);

        /* A host copy that survived eviction would make the read figure meaningless. */
        r = count_present(run, TIER_HOST, &n);
        if (r < 0)
                return r;
        if (n > 0)
                bench_log("%zu tensors still have a host copy after eviction", n);
        *host_after = MAX(*host_after, n);

        r = timed_pass(run, false, &ns);
        if (r < 0)
                return r;
        tr[k] = gbps(a->total, ns);
        bench_log("round %u: tierd write %.3f GB/s, read %.3f GB/s", k + 1, tw[k], tr[k]);

        if (a->no_fio)
                return 0;
        r = run_fio(a, "write", &bps);
        if (r < 0)
                return r;
        fw[k] = bps / 1e9;
        r = run_fio(a, "read", &bps);
        if (r < 0)
                return r;
        fr[k] = bps / 1e9;
        bench_log("round %u: fio   write %.3f GB/s, read %.3f GB/s", k + 1, fw[k], fr[k]);
        return 0;
}

int main(int argc, char **argv) {
        Args a = {
                .fio = "fio",
                .total = UINT64_C(1) << 30,
                .tensor_size = UINT64_C(16) << 20,
                .targets = 1,
                .repeat = 3,
                .queue_depth = DEFAULT_QUEUE_DEPTH,
        };
        Run run = {};
        char job[64], name[32];
        double tw[MAX_REPEAT], tr[MAX_REPEAT], fw[MAX_REPEAT], fr[MAX_REPEAT], wr[MAX_REPEAT], rr[MAX_REPEAT];
        double write_gbps, read_gbps, fio_write_gbps = NAN, fio_read_gbps = NAN, write_ratio = NAN, read_ratio = NAN;
        uint64_t verified_words = 0;
        size_t nvme_before = 0, host_after = 0;
        bool verified = false;
        unsigned rounds;
        BenchJson j;
        int r;

        r = parse_args(argc, argv, &a);
        if (r < 0)
                return 2;
        rounds = (unsigned) a.repeat;
        if (!a.job) {
                (void) snprintf(job, sizeof(job), "bench-io-%ld", (long) getpid());
                a.job = job;
        }
        a.socket = bench_socket_path(a.socket);

        run.n = (size_t) (a.total / a.tensor_size);
        run.seed = splitmix64(now_ns() ^ (uint64_t) getpid());
        run.tensors = calloc(run.n, sizeof(*run.tensors));
        run.fences = calloc(run.n, sizeof(*run.fences));
        if (!run.tensors || !run.fences) {
                bench_log("out of memory");
                return 1;
        }

        r = bench_connect(&run.client, a.socket, a.job, 0, 10000);
        if (r < 0) {
                bench_log("connecting to tierd at %s: %s", a.socket, tier_strerror(r));
                return 1;
        }

        bench_log("%zu tensors of %" PRIu64 " bytes, job %s, vram backend %s, %u round(s)", run.n,
                  a.tensor_size, a.job, tier_client_vram_backend(run.client), rounds);
        for (size_t i = 0; i < run.n; i++) {
                (void) snprintf(name, sizeof(name), "io-%05zu", i);
                r = tier_tensor_create(run.client, name, a.tensor_size, &run.tensors[i]);
                if (r < 0) {
                        log_tier_error(run.client, r, "create", name);
                        goto finish;
                }
        }

        r = fill_all(&run, a.tensor_size);
        if (r < 0)
                goto finish;

        /* tierd and fio alternate, so that drift of the device hits both alike. */
        for (unsigned k = 0; k < rounds; k++) {
                r = one_round(&a, &run, k, tw, tr, fw, fr, &nvme_before, &host_after);
                if (r < 0)
                        goto finish;
        }

        r = verify_tensors(&run, a.tensor_size, a.verify_all, &verified, &verified_words);
        if (r < 0)
                goto finish;
        bench_log("verified %" PRIu64 " words: %s", verified_words, verified ? "yes" : "NO");

finish:
        for (size_t i = 0; i < run.n; i++)
                if (run.tensors[i]) {
                        int k = tier_tensor_destroy(run.tensors[i]);
                        if (k < 0)
                                log_tier_error(run.client, k, "destroy", NULL);
                }
        run.client = tier_client_free(run.client);
        free(run.tensors);
        free(run.fences);
        if (!a.no_fio) {
                _cleanup_free_ char *path = NULL;

                if (asprintf(&path, "%s/fio-bench.dat", a.dir) >= 0)
                        (void) unlink(path);
        }
        if (r < 0)
                return 1;

        bench_json_init(&j, "io");
        bench_json_u64(&j, "bytes", a.total);
        bench_json_u64(&j, "tensors", run.n);
        bench_json_u64(&j, "tensor_size", a.tensor_size);
        bench_json_u64(&j, "targets", a.targets);
        bench_json_u64(&j, "rounds", rounds);
        /* Medians of the rounds; the rounds themselves follow. */
        write_gbps = bench_median(tw, rounds);
        read_gbps = bench_median(tr, rounds);
        if (!a.no_fio) {
                fio_write_gbps = bench_median(fw, rounds);
                fio_read_gbps = bench_median(fr, rounds);
                /* paired: each round's tierd over the fio passes that ran right after it */
                for (unsigned k = 0; k < rounds; k++) {
                        wr[k] = tw[k] / fw[k];
                        rr[k] = tr[k] / fr[k];
                }
                write_ratio = bench_median(wr, rounds);
                read_ratio = bench_median(rr, rounds);
        }
        bench_json_double(&j, "write_gbps", write_gbps);
        bench_json_double(&j, "read_gbps", read_gbps);
        bench_json_double(&j, "fio_write_gbps", fio_write_gbps);
        bench_json_double(&j, "fio_read_gbps", fio_read_gbps);
        bench_json_double(&j, "write_ratio", write_ratio);
        bench_json_double(&j, "read_ratio", read_ratio);
        bench_json_bool(&j, "verified", verified);
        bench_json_u64(&j, "verified_words", verified_words);
        bench_json_u64(&j, "nvme_copies_before_write", nvme_before);
        bench_json_u64(&j, "host_copies_after_evict", host_after);
        bench_json_double_array(&j, "write_gbps_rounds", tw, rounds);
        bench_json_double_array(&j, "read_gbps_rounds", tr, rounds);
        if (!a.no_fio) {
                bench_json_double_array(&j, "fio_write_gbps_rounds", fw, rounds);
                bench_json_double_array(&j, "fio_read_gbps_rounds", fr, rounds);
                bench_json_double_array(&j, "write_ratio_rounds", wr, rounds);
                bench_json_double_array(&j, "read_ratio_rounds", rr, rounds);
        }
        bench_json_string(&j, "fio_bs", FIO_BS);
        bench_json_u64(&j, "fio_iodepth", a.queue_depth);
        bench_json_bool(&j, "fio_fixedbufs", true);
        bench_json_bool(&j, "fio_registerfiles", true);
        r = bench_json_print(&j);
        if (r < 0) {
                bench_log("printing the result: %s", strerror(-r));
                return 1;
        }
        return 0;
}
