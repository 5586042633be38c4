/* SPDX-License-Identifier: MIT */
/* bench.c: tierctl bench: how fast the storage under tierd's NVMe targets is, honestly. */

/*
 * Theory of operation: every target gets a scratch file (never a target's
 * own data): a PATH given is a directory (the scratch goes inside), a file
 * that does not exist yet, or, with --overwrite, an existing file or block
 * device; with no PATH, tierd's targets are asked for (its status) and the
 * scratch goes next to each, on the same filesystem.  Scratch files tierctl
 * made are removed at exit, also on SIGINT and SIGTERM: both are blocked
 * and served by the sd-event loop the I/O runs on, which then stops the
 * sweep, waits for the requests in flight and cleans up.
 *
 * Cold: a scratch file is opened O_DIRECT (the page cache never holds it),
 * fallocate()d, and written whole once (the prefill, 1M blocks at depth 16)
 * before anything reads it: a read of a never-written extent is answered
 * by the filesystem with zeros, without the device.  Then, per target and
 * then all targets striped (two or more), every bs x qd cell writes, then
 * every cell reads, each as bench_run() (bench-run.c: tierd's uring.c),
 * each starting where the one before stopped.  Then fio, at the best read
 * and the best write cell, each on that cell's scratch files; then the sustained
 * write, at the best write cell, wrapping over the scratch until its bytes
 * or seconds are done.  bench-report.c writes the results.
 */

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/fs.h>
#include <linux/magic.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#include <systemd/sd-event.h>
#include <time.h>
#include <unistd.h>

#include <tier.h>

#include "client/tierctl/bench.h"
#include "client/tierctl/tierctl.h"
#include "proto/macro.h"
#include "util/size.h"

/* Defaults: small enough for a laptop, large enough that 8M x 128 is more than one queue's worth. */
#define DEFAULT_SIZE (1ull << 30)
#define DEFAULT_BS "128K,256K,512K,1M,2M,4M,8M"
#define DEFAULT_QD "1,2,4,8,16,32,64,128"
#define DEFAULT_SECONDS_PER_CELL 2.0
#define DEFAULT_SUSTAIN_SECONDS 30.0
#define DEFAULT_INTERVAL 1.0
/* The prefill's requests: large and many, to fill the scratch fast. */
#define PREFILL_BS (1ull << 20)
#define PREFILL_QD 16u

static volatile sig_atomic_t arg_stop = 0;

void bench_help(FILE *f) {
        fprintf(f,
                "Usage: tierctl bench [OPTIONS] [PATH...]\n"
                "\n"
                "Measure the storage under tierd's NVMe targets through tierd's own io_uring code:\n"
                "every block size x queue depth, write then read, O_DIRECT on a scratch file\n"
                "written before it is read (cold), per target and all targets striped; then fio\n"
                "at the best settings, then a sustained write (the SSD's write-cache cliff).\n"
                "\n"
                "PATH is a directory (a scratch file is made inside), a file that does not\n"
                "exist (made, and removed at the end), or with --overwrite an existing file or\n"
                "block device, whose contents are destroyed.  Without PATH, tierd's targets\n"
                "are benched through scratch files next to them (root or group tier-admin).\n"
                "\n"
                "  --size SIZE              scratch bytes per target (default 1G)\n"
                "  --bs LIST                block sizes, multiples of 4096 (default %s)\n"
                "  --qd LIST                queue depths, 1..%u (default %s)\n"
                "  --seconds-per-cell SEC   stop a cell after SEC seconds (default %g)\n"
                "  --bytes-per-cell SIZE    ... or after SIZE bytes (default: --size, one pass)\n"
                "  --sustain SIZE|SECs      sustained write: bytes, or seconds with an 's'\n"
                "                           (default %gs; 0: none)\n"
                "  --interval SEC           its reporting interval (default %g)\n"
                "  --link-gbps GB/s         the device's link speed; faster cells are suspect\n"
                "                           (default: the PCIe link of an NVMe drive, if found)\n"
                "  --no-fio                 do not run fio\n"
                "  --overwrite              allow an existing file or block device as PATH\n"
                "  --json                   print the results as one JSON document\n"
                "  --save FILE              also save the JSON to FILE (it always goes to\n"
                "                           $XDG_CACHE_HOME/tierd/bench.json, for tierctl plan)\n"
                "  --write-config FILE      write the best settings as a tierd.conf drop-in\n"
                "\n"
                "GB/s are 1e9 bytes per second.  See tierctl(1).\n",
                DEFAULT_BS, BENCH_QD_MAX, DEFAULT_QD, DEFAULT_SECONDS_PER_CELL, DEFAULT_SUSTAIN_SECONDS,
                DEFAULT_INTERVAL);
}

static int on_signal(sd_event_source *s, const struct signalfd_siginfo *si, void *userdata) {
        arg_stop = 1;
        return 0;
}

static int parse_seconds(const char *s, double min, double *ret) {
        char *end;
        double v;

        if (!s || !((*s >= '0' && *s <= '9') || *s == '.'))
                return -EINVAL;
        errno = 0;
        v = strtod(s, &end);
        if (errno || *end || !isfinite(v) || v < min || v > 86400.0 * 365)
                return -EINVAL;
        *ret = v;
        return 0;
}

/* "0", "10G" or "30s". */
static int parse_sustain(const char *s, Bench *b) {
        size_t n = strlen(s);

        if (n > 1 && s[n - 1] == 's') {
                char buf[64];

                if (n >= sizeof(buf))
                        return -EINVAL;
                memcpy(buf, s, n - 1);
                buf[n - 1] = '\0';
                b->sustain_bytes = 0;
                return parse_seconds(buf, 0, &b->sustain_seconds);
        }
        b->sustain_seconds = 0;
        return size_parse(s, &b->sustain_bytes);
}

static bool is_admin(void) {
        struct group *g;
        gid_t groups[256];
        int n;

        if (geteuid() == 0)
                return true;
        g = getgrnam("tier-admin");
        if (!g)
                return false;
        if (getegid() == g->gr_gid)
                return true;
        n = getgroups((int) ELEMENTSOF(groups), groups);
        for (int i = 0; i < n; i++)
                if (groups[i] == g->gr_gid)
                        return true;
        return false;
}

/* tierd's target paths, from its status; prints why not and returns < 0. */
static int tierd_targets(char ***ret, size_t *ret_n) {
        tier_client *c = NULL;
        char *json = NULL;
        int r;

        r = connect_control(&c);
        if (r < 0) {
                fprintf(stderr, "tierctl bench: without a PATH tierd's targets are benched, and tierd cannot be "
                        "reached; give a PATH to bench a directory or file\n");
                return r;
        }
        r = tier_client_status(c, TIER_STATUS_JSON, &json);
        if (r < 0)
                fprintf(stderr, "tierctl bench: cannot read tierd's status: %s\n", why(c, r));
        disconnect_control(c);
        if (r < 0)
                return r;
        r = bench_status_targets(json, ret, ret_n);
        free(json);
        if (r < 0)
                fprintf(stderr, "tierctl bench: cannot read the targets from tierd's status: %s\n", strerror(-r));
        else if (*ret_n == 0) {
                fprintf(stderr, "tierctl bench: tierd has no NVMe targets; give a PATH to bench\n");
                free(*ret);
                r = -ENOENT;
        }
        return r;
}

/* The name of a scratch file in directory @dir. */
static char *scratch_in(const char *dir, unsigned i) {
        char *s;

        if (asprintf(&s, "%s/.tierctl-bench-%d-%u.scratch", dir, (int) getpid(), i) < 0)
                return NULL;
        return s;
}

/*
 * Set up target @i of @b for @path: the scratch to use (given: @path as
 * PATH; else next to tierd's target @path).  Prints why not.
 */
static int target_setup(Bench *b, unsigned i, const char *path, bool given, bool overwrite) {
        BenchTarget *t = &b->targets[i];
        struct stat st;
        struct statfs sf;
        int fd, flags = O_RDWR | O_CLOEXEC | O_DIRECT;
        bool exists = stat(path, &st) >= 0;
        int stat_errno = exists ? 0 : errno;

        (void) snprintf(t->name, sizeof(t->name), "t%u", i);
        t->fd = -1;
        t->path = strdup(path);
        if (!t->path)
                return -ENOMEM;
        if (!exists && stat_errno != ENOENT) {
                fprintf(stderr, "tierctl bench: cannot look at '%s': %s\n", path, strerror(stat_errno));
                return -stat_errno;
        }
        if (given && exists && S_ISDIR(st.st_mode)) {
                t->scratch = scratch_in(path, i);
                t->remove = true;
        } else if (given && !exists) {
                t->scratch = strdup(path);
                t->remove = true;
        } else if (given) {
                if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) {
                        fprintf(stderr, "tierctl bench: '%s' is neither a directory, a file nor a block device\n",
                                path);
                        return -EINVAL;
                }
                if (!overwrite) {
                        fprintf(stderr, "tierctl bench: '%s' exists; benching writes over it: give --overwrite if its "
                                "contents may go, or a directory or a new file name\n", path);
                        return -EEXIST;
                }
                t->scratch = strdup(path);
        } else {
                /* tierd's target: never its data */
                _cleanup_free_ char *dir = strdup(path);
                char *slash;

                if (!dir)
                        return -ENOMEM;
                if (exists && S_ISBLK(st.st_mode)) {
                        fprintf(stderr, "tierctl bench: tierd's target '%s' is a block device, which holds tierd's "
                                "data: there is no room for a scratch file next to it; give a scratch PATH on the "
                                "same drive instead (tierctl bench PATH)\n", path);
                        return -EBUSY;
                }
                slash = strrchr(dir, '/');
                if (!slash) {
                        fprintf(stderr, "tierctl bench: tierd's target '%s' is not an absolute path\n", path);
                        return -EINVAL;
                }
                slash[slash == dir ? 1 : 0] = '\0';
                t->scratch = scratch_in(dir, i);
                t->remove = true;
        }
        if (!t->scratch)
                return -ENOMEM;

        if (t->remove)
                flags |= O_CREAT | O_EXCL;
        fd = open(t->scratch, flags, 0600);
        if (fd < 0) {
                int r = -errno;
                _cleanup_free_ char *dir = strdup(t->scratch);
                char *slash = dir ? strrchr(dir, '/') : NULL;

                if (slash)
                        slash[slash == dir ? 1 : 0] = '\0';
                if (r == -EINVAL && statfs(slash ? dir : ".", &sf) >= 0 && sf.f_type == TMPFS_MAGIC)
                        fprintf(stderr, "tierctl bench: '%s' refuses O_DIRECT (it is on a tmpfs): tierd could not "
                                "use it either; bench a directory on a disk filesystem\n", t->scratch);
                else if (r == -EINVAL && statfs(slash ? dir : ".", &sf) >= 0)
                        fprintf(stderr, "tierctl bench: '%s' refuses O_DIRECT (filesystem type 0x%lx): tierd could "
                                "not use it either; bench a directory on a disk filesystem\n",
                                t->scratch, (unsigned long) sf.f_type);
                else if (r == -EINVAL)
                        fprintf(stderr, "tierctl bench: '%s' refuses O_DIRECT: bench a directory on a disk "
                                "filesystem\n", t->scratch);
                else
                        fprintf(stderr, "tierctl bench: cannot %s '%s': %s\n", t->remove ? "create" : "open",
                                t->scratch, strerror(-r));
                if (r == -EEXIST)
                        t->remove = false;      /* not ours */
                return r;
        }
        t->fd = fd;
        if (fstat(fd, &st) < 0)
                return -errno;
        /* a tmpfs that takes O_DIRECT (Linux 6.6 on) is memory all the same: tierd refuses a target there */
        if (fstatfs(fd, &sf) >= 0 && ((uint64_t) sf.f_type == TMPFS_MAGIC || (uint64_t) sf.f_type == RAMFS_MAGIC)) {
                fprintf(stderr, "tierctl bench: '%s' is on a %s: that is memory, not a drive, and tierd refuses "
                        "targets there; bench a directory on a disk filesystem\n", t->scratch,
                        (uint64_t) sf.f_type == TMPFS_MAGIC ? "tmpfs" : "ramfs");
                return -EINVAL;
        }
        if (S_ISBLK(st.st_mode)) {
                uint64_t bytes = 0;

                if (ioctl(fd, BLKGETSIZE64, &bytes) < 0 || bytes < b->size) {
                        fprintf(stderr, "tierctl bench: block device '%s' is smaller than --size %s\n", t->scratch,
                                FORMAT_SIZE_EXACT(b->size));
                        return -ENOSPC;
                }
        } else if ((uint64_t) st.st_size < b->size && fallocate(fd, 0, 0, (off_t) b->size) < 0) {
                int r = -errno;

                fprintf(stderr, "tierctl bench: cannot allocate %s for '%s': %s%s\n", FORMAT_SIZE_EXACT(b->size),
                        t->scratch, strerror(-r), r == -ENOSPC ? " (give a smaller --size)" : "");
                return r;
        }
        if (b->link_gbps >= 0)
                t->link_gbps = b->link_gbps;
        else {
                dev_t d = S_ISBLK(st.st_mode) ? st.st_rdev : st.st_dev;

                t->link_gbps = bench_link_gbps("/sys", major(d), minor(d));
        }
        return 0;
}

static void targets_cleanup(Bench *b) {
        for (unsigned i = 0; i < b->n_targets; i++) {
                BenchTarget *t = &b->targets[i];

                t->fd = safe_close(t->fd);
                if (t->remove && t->scratch && unlink(t->scratch) < 0 && errno != ENOENT)
                        fprintf(stderr, "tierctl bench: cannot remove scratch file '%s': %m\n", t->scratch);
                free(t->path);
                free(t->scratch);
        }
        b->n_targets = 0;
}

/* The per-file area of a run of @bs-byte blocks: whole blocks of the scratch. */
static uint64_t area_for(const Bench *b, uint64_t bs) {
        return b->size / bs * bs;
}

/* The fds of @target (BENCH_STRIPED: all) into @fds; their number. */
static unsigned target_fds(const Bench *b, int target, int *fds) {
        if (target != BENCH_STRIPED) {
                fds[0] = b->targets[target].fd;
                return 1;
        }
        for (unsigned i = 0; i < b->n_targets; i++)
                fds[i] = b->targets[i].fd;
        return b->n_targets;
}

static void progress(const char *fmt, ...) _printf_(1, 2);
static void progress(const char *fmt, ...) {
        va_list ap;

        if (!isatty(STDERR_FILENO))
                return;
        fputs("\r\033[K", stderr);
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fflush(stderr);
}

/* One run; prints why it failed.  @cursor: where the set's last run stopped (blocks of the run's bs). */
static int run_one(Bench *b, sd_event *event, uint8_t *pool, int target, BenchOp op, uint64_t bs, unsigned qd,
                   uint64_t max_bytes, double max_seconds, double interval_s, uint64_t *cursor, BenchResult *ret) {
        int fds[BENCH_TARGETS_MAX];
        BenchRunSpec spec = {
                .fds = fds,
                .n_fds = target_fds(b, target, fds),
                .area = area_for(b, bs),
                .bs = bs,
                .qd = qd,
                .op = op,
                .first_block = *cursor / bs,
                .max_bytes = max_bytes,
                .max_seconds = max_seconds,
                .interval_s = interval_s,
        };
        _cleanup_free_ char *err = NULL;
        int r;

        r = bench_run(event, &spec, pool, BENCH_POOL_BYTES, &arg_stop, ret, &err);
        if (r < 0) {
                fprintf(stderr, "%stierctl bench: %s %s, %s blocks at depth %u: %s\n", isatty(STDERR_FILENO) ? "\n" : "",
                        bench_target_name(b, target), op == BENCH_READ ? "read" : "write", FORMAT_SIZE_EXACT(bs), qd,
                        err ? err : strerror(-r));
                return r;
        }
        *cursor += ret->n_io * bs;
        if (!ret->registered)
                b->registered = false;
        return 0;
}

static int sweep(Bench *b, sd_event *event, uint8_t *pool) {
        unsigned n_sets = b->n_targets > 1 ? b->n_targets + 1 : 1;
        uint64_t cursor[BENCH_TARGETS_MAX + 1] = {};
        size_t k = 0;
        int r;

        b->n_cells = (size_t) n_sets * _BENCH_OP_MAX * b->n_bs * b->n_qd;
        b->cells = calloc(b->n_cells, sizeof(BenchCell));
        if (!b->cells)
                return -ENOMEM;

        /* cold: every block is written before anything reads it */
        for (unsigned i = 0; i < b->n_targets; i++) {
                uint64_t c = 0;

                progress("%s: writing the scratch file once (%s)", b->targets[i].name, FORMAT_SIZE_EXACT(b->size));
                r = run_one(b, event, pool, (int) i, BENCH_WRITE, PREFILL_BS, PREFILL_QD, b->size, 0, 0, &c,
                            &b->prefill[i]);
                if (r < 0 || arg_stop)
                        return r < 0 ? r : -EINTR;
        }
        for (unsigned s = 0; s < n_sets; s++) {
                int target = s < b->n_targets ? (int) s : BENCH_STRIPED;

                for (int op = BENCH_WRITE; op >= BENCH_READ; op--)
                        for (size_t i = 0; i < b->n_bs; i++)
                                for (size_t j = 0; j < b->n_qd; j++) {
                                        BenchCell *cell = &b->cells[k++];
                                        double link = bench_target_link(b, target);

                                        *cell = (BenchCell) {
                                                .target = target,
                                                .op = (BenchOp) op,
                                                .bs = b->bs[i],
                                                .qd = b->qd[j],
                                        };
                                        progress("%s: %s %s x %u", bench_target_name(b, target),
                                                 op == BENCH_READ ? "read" : "write", FORMAT_SIZE_EXACT(b->bs[i]), b->qd[j]);
                                        r = run_one(b, event, pool, target, (BenchOp) op, b->bs[i], b->qd[j],
                                                    b->bytes_per_cell, b->seconds_per_cell, 0, &cursor[s], &cell->res);
                                        if (r < 0 || arg_stop)
                                                return r < 0 ? r : -EINTR;
                                        cell->suspect = link > 0 && cell->res.gbps > link;
                                }
        }
        progress("%s", "");
        return 0;
}

static void find_best(Bench *b) {
        for (size_t k = 0; k < b->n_cells; k++) {
                const BenchCell *c = &b->cells[k];
                BenchBest *best = &b->best[c->op];
                BenchBest cand = { .set = true, .target = c->target, .bs = c->bs, .qd = c->qd, .gbps = c->res.gbps };

                if (!best->set || c->res.gbps > best->gbps)
                        *best = cand;
                if (c->target != BENCH_STRIPED) {
                        BenchBest *tb = &b->target_best[c->target][c->op];

                        if (!tb->set || c->res.gbps > tb->gbps)
                                *tb = cand;
                }
        }
}

static void run_fio(Bench *b) {
        for (int op = BENCH_WRITE; op >= BENCH_READ; op--) {
                const BenchBest *best = &b->best[op];
                char *files[BENCH_TARGETS_MAX];
                unsigned n = 0;
                char *err = NULL;
                int r;

                /* each op on its own best cell's files (striped: all of them) */
                b->fio_result.target[op] = best->target;
                for (unsigned i = 0; i < b->n_targets; i++)
                        if (best->target == BENCH_STRIPED || (int) i == best->target)
                                files[n++] = b->targets[i].scratch;

                progress("fio: %s %s x %u", op == BENCH_READ ? "read" : "write", FORMAT_SIZE_EXACT(best->bs), best->qd);
                r = bench_fio(files, n, (BenchOp) op, best->bs, best->qd, area_for(b, best->bs), b->bytes_per_cell,
                              b->seconds_per_cell, b->registered, &b->fio_result.gbps[op], &b->fio_result.ms[op],
                              &err);
                if (r < 0) {
                        progress("%s", "");
                        b->fio_result.reason = err ? err : strdup(strerror(-r));
                        if (!arg_json)
                                fprintf(stderr, "tierctl bench: no fio comparison: %s\n",
                                        b->fio_result.reason ? b->fio_result.reason : "out of memory");
                        return;
                }
                b->fio_result.bs[op] = best->bs;
                b->fio_result.qd[op] = best->qd;
        }
        progress("%s", "");
        b->fio_result.ran = true;
}

static int run_sustained(Bench *b, sd_event *event, uint8_t *pool) {
        const BenchBest *best = &b->best[BENCH_WRITE];
        uint64_t cursor = 0, done = 0;
        int r;

        progress("sustained write: %s x %u on %s", FORMAT_SIZE_EXACT(best->bs), best->qd, bench_target_name(b, best->target));
        b->sustained.target = best->target;
        b->sustained.bs = best->bs;
        b->sustained.qd = best->qd;
        r = run_one(b, event, pool, best->target, BENCH_WRITE, best->bs, best->qd,
                    b->sustain_bytes ? b->sustain_bytes : UINT64_MAX, b->sustain_seconds, b->interval_s, &cursor,
                    &b->sustained.res);
        progress("%s", "");
        if (r < 0)
                return r;
        b->sustained.ran = true;
        /* a last, shorter interval holds the drain of the queue: no evidence of a cliff */
        b->sustained.cliff = bench_cliff(b->sustained.res.interval_gbps,
                                         b->sustained.res.n_intervals - b->sustained.res.last_partial);
        for (ssize_t i = 0; i < b->sustained.cliff; i++)
                done += (uint64_t) llround(b->sustained.res.interval_gbps[i] * b->interval_s * 1e9);
        b->sustained.cliff_bytes = done;
        return arg_stop ? -EINTR : 0;
}

/* $XDG_CACHE_HOME/tierd/bench.json, else ~/.cache/tierd/bench.json; NULL if neither is known. */
static char *default_save_path(void) {
        const char *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
        char *s = NULL;

        if (x && x[0] == '/')
                return asprintf(&s, "%s/tierd/bench.json", x) < 0 ? NULL : s;
        if (h && h[0] == '/')
                return asprintf(&s, "%s/.cache/tierd/bench.json", h) < 0 ? NULL : s;
        return NULL;
}

static int parse_options(Bench *b, int argc, char **argv, const char **save, const char **write_config,
                         bool *overwrite) {
        enum {
                ARG_SIZE = 0x100, ARG_BS, ARG_QD, ARG_SECONDS, ARG_BYTES, ARG_SUSTAIN, ARG_INTERVAL, ARG_LINK,
                ARG_NO_FIO, ARG_OVERWRITE, ARG_JSON, ARG_SAVE, ARG_WRITE_CONFIG,
        };
        static const struct option options[] = {
                { "size",             required_argument, NULL, ARG_SIZE },
                { "bs",               required_argument, NULL, ARG_BS },
                { "qd",               required_argument, NULL, ARG_QD },
                { "seconds-per-cell", required_argument, NULL, ARG_SECONDS },
                { "bytes-per-cell",   required_argument, NULL, ARG_BYTES },
                { "sustain",          required_argument, NULL, ARG_SUSTAIN },
                { "interval",         required_argument, NULL, ARG_INTERVAL },
                { "link-gbps",        required_argument, NULL, ARG_LINK },
                { "no-fio",           no_argument,       NULL, ARG_NO_FIO },
                { "overwrite",        no_argument,       NULL, ARG_OVERWRITE },
                { "json",             no_argument,       NULL, ARG_JSON },
                { "save",             required_argument, NULL, ARG_SAVE },
                { "write-config",     required_argument, NULL, ARG_WRITE_CONFIG },
                { "help",             no_argument,       NULL, 'h' },
                {}
        };
        char err[256];
        int c;

        optind = 0;
        opterr = 0;
        while ((c = getopt_long(argc, argv, ":h", options, NULL)) >= 0) {
                switch (c) {
                case ARG_SIZE:
                        if (size_parse(optarg, &b->size) < 0 || b->size == 0 || b->size % (1u << 20) != 0) {
                                fprintf(stderr, "tierctl bench: --size '%s' is not a positive multiple of 1M\n",
                                        optarg);
                                return EXIT_USAGE;
                        }
                        break;
                case ARG_BS:
                        if (bench_parse_bs_list(optarg, b->bs, &b->n_bs, err, sizeof(err)) < 0) {
                                fprintf(stderr, "tierctl bench: --bs: %s\n", err);
                                return EXIT_USAGE;
                        }
                        break;
                case ARG_QD:
                        if (bench_parse_qd_list(optarg, b->qd, &b->n_qd, err, sizeof(err)) < 0) {
                                fprintf(stderr, "tierctl bench: --qd: %s\n", err);
                                return EXIT_USAGE;
                        }
                        break;
                case ARG_SECONDS:
                        if (parse_seconds(optarg, 0.01, &b->seconds_per_cell) < 0) {
                                fprintf(stderr, "tierctl bench: --seconds-per-cell '%s' is not a number of seconds "
                                        "(at least 0.01)\n", optarg);
                                return EXIT_USAGE;
                        }
                        break;
                case ARG_BYTES:
                        if (size_parse(optarg, &b->bytes_per_cell) < 0 || b->bytes_per_cell == 0) {
                                fprintf(stderr, "tierctl bench: --bytes-per-cell '%s' is not a positive size\n", optarg);
                                return EXIT_USAGE;
                        }
                        break;
                case ARG_SUSTAIN:
                        if (parse_sustain(optarg, b) < 0) {
                                fprintf(stderr, "tierctl bench: --sustain '%s' is neither a size (10G) nor seconds "
                                        "(60s); 0 turns it off\n", optarg);
                                return EXIT_USAGE;
                        }
                        break;
                case ARG_INTERVAL:
                        if (parse_seconds(optarg, 0.001, &b->interval_s) < 0) {
                                fprintf(stderr, "tierctl bench: --interval '%s' is not a number of seconds (at least "
                                        "0.001)\n", optarg);
                                return EXIT_USAGE;
                        }
                        break;
                case ARG_LINK:
                        if (parse_seconds(optarg, 0.001, &b->link_gbps) < 0) {
                                fprintf(stderr, "tierctl bench: --link-gbps '%s' is not a positive number of GB/s\n",
                                        optarg);
                                return EXIT_USAGE;
                        }
                        break;
                case ARG_NO_FIO:
                        b->fio = false;
                        break;
                case ARG_OVERWRITE:
                        *overwrite = true;
                        break;
                case ARG_JSON:
                        arg_json = 1;
                        break;
                case ARG_SAVE:
                        *save = optarg;
                        break;
                case ARG_WRITE_CONFIG:
                        *write_config = optarg;
                        break;
                case 'h':
                        bench_help(stdout);
                        return -1;
                default:
                        return verb_bad_option("bench", c, argv);
                }
        }
        for (size_t i = 0; i < b->n_bs; i++)
                if (b->bs[i] > b->size) {
                        fprintf(stderr, "tierctl bench: block size %s is larger than --size %s\n",
                                FORMAT_SIZE_EXACT(b->bs[i]), FORMAT_SIZE_EXACT(b->size));
                        return EXIT_USAGE;
                }
        if (argc - optind > BENCH_TARGETS_MAX) {
                fprintf(stderr, "tierctl bench: at most %d PATHs\n", BENCH_TARGETS_MAX);
                return EXIT_USAGE;
        }
        if (b->bytes_per_cell == 0)
                b->bytes_per_cell = b->size;
        return 0;
}

static void bench_deinit(Bench *b) {
        targets_cleanup(b);
        for (size_t k = 0; k < b->n_cells; k++)
                bench_result_deinit(&b->cells[k].res);
        free(b->cells);
        bench_result_deinit(&b->sustained.res);
        free(b->fio_result.reason);
}

static int save_results(const Bench *b, const char *save, const char *write_config) {
        _cleanup_free_ char *json = NULL, *cache = default_save_path();
        char *err = NULL;
        int r;

        r = bench_json(b, &json);
        if (r < 0) {
                fprintf(stderr, "tierctl bench: cannot write the results as JSON: %s\n", strerror(-r));
                return r;
        }
        if (cache) {
                if (bench_save(cache, json, true, &err) < 0)
                        fprintf(stderr, "tierctl bench: warning: cannot save the results for tierctl plan: %s\n",
                                err ? err : "out of memory");
                err = mfree(err);
        }
        if (save && bench_save(save, json, false, &err) < 0) {
                fprintf(stderr, "tierctl bench: cannot save the results: %s\n", err ? err : "out of memory");
                free(err);
                return -EIO;
        }
        if (write_config && bench_write_config(b, write_config, &err) < 0) {
                fprintf(stderr, "tierctl bench: cannot write the configuration: %s\n", err ? err : "out of memory");
                free(err);
                return -EIO;
        }
        if (arg_json)
                puts(json);
        else
                bench_print(b, stdout);
        return 0;
}

int verb_bench(int argc, char **argv) {
        Bench b = {
                .size = DEFAULT_SIZE,
                .seconds_per_cell = DEFAULT_SECONDS_PER_CELL,
                .sustain_seconds = DEFAULT_SUSTAIN_SECONDS,
                .interval_s = DEFAULT_INTERVAL,
                .link_gbps = -1,
                .fio = true,
                .registered = true,
        };
        const char *save = NULL, *write_config = NULL;
        bool overwrite = false;
        char **tierd_paths = NULL;
        size_t n_paths = 0;
        sd_event *event = NULL;
        uint8_t *pool = NULL;
        sigset_t mask;
        char err[256];
        int r, ret = EXIT_FAILURE;

        (void) bench_parse_bs_list(DEFAULT_BS, b.bs, &b.n_bs, err, sizeof(err));
        (void) bench_parse_qd_list(DEFAULT_QD, b.qd, &b.n_qd, err, sizeof(err));
        r = parse_options(&b, argc, argv, &save, &write_config, &overwrite);
        if (r != 0)
                return r < 0 ? EXIT_SUCCESS : r;
        /* where the results go, checked before any I/O: not a sweep of minutes, then nowhere to put it */
        for (unsigned i = 0; i < 2; i++) {
                const char *path = i == 0 ? save : write_config;
                char *error = NULL;

                if (path && bench_save_check(path, &error) < 0) {
                        fprintf(stderr, "tierctl bench: cannot write %s %s\n", i == 0 ? "--save" : "--write-config",
                                error ? error : "(out of memory)");
                        free(error);
                        return EXIT_FAILURE;
                }
        }

        /* the signals are served by the loop the I/O runs on: the scratch files always go */
        sigemptyset(&mask);
        sigaddset(&mask, SIGINT);
        sigaddset(&mask, SIGTERM);
        sigprocmask(SIG_BLOCK, &mask, NULL);
        r = sd_event_new(&event);
        if (r >= 0)
                r = sd_event_add_signal(event, NULL, SIGINT, on_signal, NULL);
        if (r >= 0)
                r = sd_event_add_signal(event, NULL, SIGTERM, on_signal, NULL);
        if (r < 0) {
                fprintf(stderr, "tierctl bench: cannot set up an event loop: %s\n", strerror(-r));
                goto out;
        }

        if (optind >= argc) {
                if (!is_admin()) {
                        fprintf(stderr, "tierctl bench: benching tierd's targets needs root or group tier-admin (it "
                                "writes scratch files next to them); give a PATH to bench a directory of yours\n");
                        goto out;
                }
                if (tierd_targets(&tierd_paths, &n_paths) < 0)
                        goto out;
        }
        /* one at a time: the clean-up sees only targets that were set up (or half) */
        for (unsigned i = 0, n = optind < argc ? (unsigned) (argc - optind) : (unsigned) n_paths; i < n; i++) {
                b.n_targets = i + 1;
                r = target_setup(&b, i, optind < argc ? argv[optind + i] : tierd_paths[i], optind < argc, overwrite);
                if (r < 0)
                        goto out;
        }
        {
                time_t now = time(NULL);
                struct tm tm;

                (void) strftime(b.time, sizeof(b.time), "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
        }

        if (posix_memalign((void **) &pool, 4096, BENCH_POOL_BYTES) != 0) {
                fprintf(stderr, "tierctl bench: out of memory for the %s I/O buffer\n", FORMAT_SIZE_EXACT(BENCH_POOL_BYTES));
                pool = NULL;
                goto out;
        }
        /* not zeros: some drives compress or skip them */
        {
                uint64_t x = 0x9e3779b97f4a7c15ull ^ (uint64_t) getpid();

                for (size_t i = 0; i < BENCH_POOL_BYTES / 8; i++) {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        memcpy(pool + i * 8, &x, 8);
                }
        }

        r = sweep(&b, event, pool);
        if (r < 0)
                goto out;
        find_best(&b);
        if (b.fio) {
                run_fio(&b);
                /* a Ctrl-C meant for fio too: serve the signal, blocked while fio ran */
                (void) sd_event_run(event, 0);
        } else
                b.fio_result.reason = strdup("not run (--no-fio)");
        if (arg_stop)
                goto out;
        if (b.sustain_bytes > 0 || b.sustain_seconds > 0) {
                r = run_sustained(&b, event, pool);
                if (r < 0)
                        goto out;
        }
        bench_choose_config(&b);
        if (save_results(&b, save, write_config) < 0)
                goto out;
        ret = EXIT_SUCCESS;
out:
        bench_deinit(&b);
        if (arg_stop)
                fprintf(stderr, "tierctl bench: interrupted; the scratch files made are removed\n");
        for (size_t i = 0; i < n_paths; i++)
                free(tierd_paths[i]);
        free(tierd_paths);
        free(pool);
        sd_event_unref(event);
        return ret;
}
