/* SPDX-License-Identifier: MIT */
/* bench-sys.c: what tierctl bench needs besides the I/O: its lists, the link speed, tierd's targets, fio. */

/*
 * Theory of operation: small pure helpers, each testable on its own (the
 * sysfs root and the texts are parameters).  The link speed is that of the
 * PCIe link of the NVMe controller a block device hangs off (walking up
 * from /sys/dev/block/MAJ:MIN to the first directory with
 * current_link_speed), and only for NVMe: a virtio or SATA disk's PCIe link
 * says nothing about the disk.  tierd's targets come from its status JSON
 * (libtier's tier_client_status()), read with a scanner that knows just enough
 * JSON to find "targets"[i]."path" (tierctl does not link a JSON parser).
 * fio runs as a child with its JSON output on a pipe, of which only the
 * "io_bytes" and "runtime" of the "read" or "write" part are read.  fio
 * counts runtime (and computes bw_bytes from it) in whole milliseconds, so
 * a run of a few ms is off by tens of per cent (16 MiB in "3 ms"); a run
 * shorter than FIO_MIN_MS is repeated with more bytes (wrapping over the
 * files, up to FIO_LONGER_TRIES times), so that the whole ms err by under
 * half a per cent.
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/tierctl/bench.h"
#include "proto/macro.h"
#include "util/size.h"

extern char **environ;

static int errf(char *err, size_t err_size, const char *fmt, ...) _printf_(3, 4);
static int errf(char *err, size_t err_size, const char *fmt, ...) {
        va_list ap;

        va_start(ap, fmt);
        (void) vsnprintf(err, err_size, fmt, ap);
        va_end(ap);
        return -EINVAL;
}

/* Split @s at commas into at most BENCH_LIST_MAX non-empty items, each handed to @item. */
static int parse_list(const char *s, const char *what, char *err, size_t err_size,
                      int (*item)(const char *tok, size_t i, void *ret, char *err, size_t err_size), void *ret,
                      size_t *ret_n) {
        char tok[64];
        size_t n = 0;
        const char *p = s;

        if (!s || !*s)
                return errf(err, err_size, "the %s list is empty", what);
        for (;;) {
                const char *c = strchr(p, ',');
                size_t len = c ? (size_t) (c - p) : strlen(p);
                int r;

                if (len == 0)
                        return errf(err, err_size, "empty item in the %s list '%s'", what, s);
                if (len >= sizeof(tok))
                        return errf(err, err_size, "item '%.*s...' of the %s list is too long", 16, p, what);
                if (n >= BENCH_LIST_MAX)
                        return errf(err, err_size, "the %s list '%s' has more than %d items", what, s, BENCH_LIST_MAX);
                memcpy(tok, p, len);
                tok[len] = '\0';
                r = item(tok, n, ret, err, err_size);
                if (r < 0)
                        return r;
                n++;
                if (!c)
                        break;
                p = c + 1;
        }
        *ret_n = n;
        return 0;
}

static int bs_item(const char *tok, size_t i, void *ret, char *err, size_t err_size) {
        uint64_t v = 0;

        if (size_parse(tok, &v) < 0)
                return errf(err, err_size, "'%s' is not a size (e.g. 128K, 1M)", tok);
        if (v == 0 || v % 4096 != 0)
                return errf(err, err_size, "block size '%s' is not a positive multiple of 4096 (O_DIRECT needs "
                            "aligned blocks)", tok);
        if (v > BENCH_BS_MAX)
                return errf(err, err_size, "block size '%s' is larger than 64M (tierd's largest extent)", tok);
        ((uint64_t *) ret)[i] = v;
        return 0;
}

static int qd_item(const char *tok, size_t i, void *ret, char *err, size_t err_size) {
        char *end;
        unsigned long v;

        if (tok[0] < '0' || tok[0] > '9')
                return errf(err, err_size, "queue depth '%s' is not a number", tok);
        errno = 0;
        v = strtoul(tok, &end, 10);
        if (errno || *end)
                return errf(err, err_size, "queue depth '%s' is not a number", tok);
        if (v < 1 || v > BENCH_QD_MAX)
                return errf(err, err_size, "queue depth %s is out of range (1..%u)", tok, BENCH_QD_MAX);
        ((unsigned *) ret)[i] = (unsigned) v;
        return 0;
}

int bench_parse_bs_list(const char *s, uint64_t *ret, size_t *ret_n, char *err, size_t err_size) {
        return parse_list(s, "--bs", err, err_size, bs_item, ret, ret_n);
}

int bench_parse_qd_list(const char *s, unsigned *ret, size_t *ret_n, char *err, size_t err_size) {
        return parse_list(s, "--qd", err, err_size, qd_item, ret, ret_n);
}

/* ---- link speed ----------------------------------------------------------------------------- */

double bench_pcie_gbps(const char *speed, unsigned width) {
        double gt, enc;
        char *end;

        if (!speed || width == 0 || width > 32)
                return 0;
        gt = strtod(speed, &end);
        if (end == speed || !isfinite(gt) || gt <= 0 || strncmp(end, " GT/s", 5) != 0)
                return 0;
        /* line coding: 8b/10b up to 5 GT/s, 128b/130b up to 32 GT/s, then FLIT mode (242/256) */
        enc = gt <= 5.0 ? 0.8 : gt <= 32.0 ? 128.0 / 130.0 : 242.0 / 256.0;
        return gt * enc / 8.0 * width;
}

static int read_line(const char *path, char *buf, size_t size) {
        FILE *f = fopen(path, "re");
        size_t n;

        if (!f)
                return -errno;
        if (!fgets(buf, (int) size, f)) {
                fclose(f);
                return -EIO;
        }
        fclose(f);
        n = strlen(buf);
        while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
                buf[--n] = '\0';
        return 0;
}

double bench_link_gbps(const char *sysfs, unsigned major, unsigned minor) {
        char path[PATH_MAX], real[PATH_MAX], f[PATH_MAX + 32], speed[64], width[16];
        char *slash;

        if (snprintf(path, sizeof(path), "%s/dev/block/%u:%u", sysfs, major, minor) >= (int) sizeof(path))
                return 0;
        if (!realpath(path, real))
                return 0;
        /* an NVMe namespace: .../0000:01:00.0/nvme/nvme0/nvme0n1[/nvme0n1p1] */
        if (!strstr(real, "/nvme/nvme"))
                return 0;
        while ((slash = strrchr(real, '/')) && slash > real) {
                *slash = '\0';
                (void) snprintf(f, sizeof(f), "%s/current_link_speed", real);
                if (read_line(f, speed, sizeof(speed)) < 0)
                        continue;
                (void) snprintf(f, sizeof(f), "%s/current_link_width", real);
                if (read_line(f, width, sizeof(width)) < 0)
                        return 0;
                return bench_pcie_gbps(speed, (unsigned) strtoul(width, NULL, 10));
        }
        return 0;
}

/* ---- tierd's targets from its status JSON ------------------------------------------------- */

/* Past the JSON string at @p (at its opening quote); its contents unescaped into *@ret if @ret. */
static const char *json_skip_string(const char *p, char **ret) {
        char *out = NULL;
        size_t n = 0;

        if (*p != '"')
                return NULL;
        if (ret) {
                out = malloc(strlen(p) + 1);
                if (!out)
                        return NULL;
        }
        for (p++; *p && *p != '"'; p++) {
                char c = *p;

                if (c == '\\') {
                        p++;
                        switch (*p) {
                        case 'n': c = '\n'; break;
                        case 't': c = '\t'; break;
                        case 'r': c = '\r'; break;
                        case 'b': c = '\b'; break;
                        case 'f': c = '\f'; break;
                        case '"': case '\\': case '/': c = *p; break;
                        case 'u': {
                                /* tierd escapes control characters only: \u00XX */
                                unsigned v = 0;

                                if (sscanf(p + 1, "%4x", &v) != 1 || v > 0x7f) {
                                        free(out);
                                        return NULL;
                                }
                                c = (char) v;
                                p += 4;
                                break;
                        }
                        default:
                                free(out);
                                return NULL;
                        }
                }
                if (out)
                        out[n++] = c;
        }
        if (*p != '"') {
                free(out);
                return NULL;
        }
        if (ret) {
                out[n] = '\0';
                *ret = out;
        }
        return p + 1;
}

int bench_status_targets(const char *json, char ***ret, size_t *ret_n) {
        char **paths = NULL;
        size_t n = 0;
        unsigned depth = 0;     /* inside "targets": 1 the array, 2 an entry */
        const char *p;
        int r = -EBADMSG;

        /* the top-level key: at depth 1 of the document */
        {
                unsigned d = 0;

                for (p = json; *p; p++) {
                        if (*p == '"') {
                                const char *e = json_skip_string(p, NULL);

                                if (!e)
                                        return -EBADMSG;
                                if (d == 1 && e - p == 9 && strncmp(p, "\"targets\"", 9) == 0) {
                                        p = e;
                                        break;
                                }
                                p = e - 1;
                        } else if (*p == '{' || *p == '[')
                                d++;
                        else if (*p == '}' || *p == ']')
                                d--;
                }
                if (!*p)
                        return -EBADMSG;
        }
        while (*p == ' ' || *p == ':')
                p++;
        if (*p != '[')
                return -EBADMSG;
        paths = calloc(BENCH_TARGETS_MAX, sizeof(char *));
        if (!paths)
                return -ENOMEM;
        for (; *p; p++) {
                if (*p == '"') {
                        const char *e = json_skip_string(p, NULL);

                        if (!e)
                                goto fail;
                        if (depth == 2 && e - p == 6 && strncmp(p, "\"path\"", 6) == 0) {
                                for (p = e; *p == ' ' || *p == ':'; p++)
                                        ;
                                if (n >= BENCH_TARGETS_MAX) {
                                        r = -E2BIG;
                                        goto fail;
                                }
                                e = json_skip_string(p, &paths[n]);
                                if (!e)
                                        goto fail;
                                n++;
                        }
                        p = e - 1;
                } else if (*p == '{' || *p == '[')
                        depth++;
                else if (*p == '}' || *p == ']') {
                        if (--depth == 0)
                                break;
                }
        }
        if (depth != 0)
                goto fail;
        *ret = paths;
        *ret_n = n;
        return 0;
fail:
        for (size_t i = 0; i < n; i++)
                free(paths[i]);
        free(paths);
        return r;
}

/* ---- the cliff of a sustained write --------------------------------------------------------- */

ssize_t bench_cliff(const double *gbps, size_t n) {
        for (size_t i = 2; i + 1 < n; i++) {
                double before = 0, after = 0;

                for (size_t j = 0; j < i; j++)
                        before += gbps[j];
                before /= (double) i;
                for (size_t j = i; j < n; j++)
                        after += gbps[j];
                after /= (double) (n - i);
                if (gbps[i] < 0.6 * before && after < 0.6 * before)
                        return (ssize_t) i;
        }
        return -1;
}

/* ---- fio ------------------------------------------------------------------------------------ */

/* The unsigned integer of member @key at or after @p (up to @end); -EBADMSG if absent. */
static int fio_member(const char *p, const char *key, uint64_t *ret) {
        char *end;
        uint64_t v;

        p = strstr(p, key);
        if (!p)
                return -EBADMSG;
        p += strlen(key);
        while (*p == ' ' || *p == ':' || *p == '\t' || *p == '\n')
                p++;
        if (*p < '0' || *p > '9')
                return -EBADMSG;
        errno = 0;
        v = strtoull(p, &end, 10);
        if (errno != 0 || end == p)
                return -EBADMSG;
        *ret = v;
        return 0;
}

int bench_fio_parse(const char *json, BenchOp op, uint64_t *ret_bytes, uint64_t *ret_ms) {
        const char *key = op == BENCH_READ ? "\"read\"" : "\"write\"";
        const char *p = json;

        while ((p = strstr(p, key))) {
                const char *q = p + strlen(key);
                uint64_t bytes, ms;

                while (*q == ' ' || *q == '\t' || *q == '\n')
                        q++;
                if (*q++ != ':') {
                        p++;
                        continue;
                }
                while (*q == ' ' || *q == '\t' || *q == '\n')
                        q++;
                if (*q != '{') {
                        p++;
                        continue;
                }
                /* plain members of the object, before its nested ones */
                if (fio_member(q, "\"io_bytes\"", &bytes) < 0 || fio_member(q, "\"runtime\"", &ms) < 0)
                        return -EBADMSG;
                if (ms == 0 && bytes > 0)
                        ms = 1;         /* under a millisecond: as short as fio can say */
                *ret_bytes = bytes;
                *ret_ms = ms;
                return 0;
        }
        return -EBADMSG;
}

double bench_fio_gbps(uint64_t bytes, uint64_t ms) {
        return ms ? (double) bytes / ((double) ms * 1e6) : 0;
}

uint64_t bench_fio_longer(uint64_t bytes, uint64_t ms) {
        if (ms >= FIO_MIN_MS || bytes == 0)
                return 0;
        /* a quarter more than the proportion, at least twice as many */
        return bytes * MAX((uint64_t) 2, (FIO_MIN_MS * 5 / 4 + MAX(ms, (uint64_t) 1) - 1) / MAX(ms, (uint64_t) 1));
}

static int fio_errorf(char **ret_error, int r, const char *fmt, ...) _printf_(3, 4);
static int fio_errorf(char **ret_error, int r, const char *fmt, ...) {
        va_list ap;

        va_start(ap, fmt);
        if (vasprintf(ret_error, fmt, ap) < 0)
                *ret_error = NULL;
        va_end(ap);
        return r;
}

/* Is @name an executable in $PATH? */
static bool in_path(const char *name) {
        const char *path = getenv("PATH");
        char buf[PATH_MAX];

        if (!path || !*path)
                path = "/usr/local/bin:/usr/bin:/bin";
        while (*path) {
                size_t len = strcspn(path, ":");

                if (len > 0 && snprintf(buf, sizeof(buf), "%.*s/%s", (int) len, path, name) < (int) sizeof(buf) &&
                    access(buf, X_OK) == 0)
                        return true;
                path += len;
                if (*path == ':')
                        path++;
        }
        return false;
}

/* Most fio output read (its JSON for one job is a few KiB). */
#define FIO_OUTPUT_MAX (4u << 20)

/* One fio run of at most @io_bytes: its io_bytes and runtime (ms). */
static int fio_once(const char *a_file, BenchOp op, uint64_t bs, unsigned qd, uint64_t size, uint64_t io_bytes,
                    double seconds, bool fixedbufs, uint64_t *ret_bytes, uint64_t *ret_ms, char **ret_error) {
        char a_bs[64], a_qd[64], a_size[64], a_io[64], a_rt[64];
        const char *argv[24];
        posix_spawn_file_actions_t fa;
        posix_spawnattr_t attr;
        sigset_t none;
        _cleanup_free_ char *out = NULL;
        size_t len = 0, k = 0;
        int pipefd[2], status = 0, r;
        pid_t pid;

        (void) snprintf(a_bs, sizeof(a_bs), "--bs=%" PRIu64, bs);
        (void) snprintf(a_qd, sizeof(a_qd), "--iodepth=%u", qd);
        (void) snprintf(a_size, sizeof(a_size), "--size=%" PRIu64, size);
        (void) snprintf(a_io, sizeof(a_io), "--io_size=%" PRIu64, io_bytes);
        (void) snprintf(a_rt, sizeof(a_rt), "--runtime=%u", (unsigned) MAX(1.0, ceil(seconds)));
        argv[k++] = "fio";
        argv[k++] = "--name=tierctl-bench";
        argv[k++] = "--filename";
        argv[k++] = (char *) a_file;
        argv[k++] = op == BENCH_READ ? "--rw=read" : "--rw=write";
        argv[k++] = a_bs;
        argv[k++] = a_qd;
        argv[k++] = a_size;
        argv[k++] = a_io;
        argv[k++] = a_rt;
        argv[k++] = "--direct=1";
        argv[k++] = "--ioengine=io_uring";
        argv[k++] = "--allow_file_create=0";
        argv[k++] = "--fallocate=none";
        argv[k++] = "--file_service_type=roundrobin";
        argv[k++] = "--output-format=json";
        /* as tierctl's runs (and tierd): the files registered, the buffer too when it could be */
        argv[k++] = "--registerfiles";
        if (fixedbufs)
                argv[k++] = "--fixedbufs";
        argv[k] = NULL;

        if (pipe2(pipefd, O_CLOEXEC) < 0)
                return fio_errorf(ret_error, -errno, "Cannot make a pipe for fio: %m");
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, pipefd[1], STDOUT_FILENO);
        posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
        posix_spawnattr_init(&attr);
        /* tierctl blocks SIGINT and SIGTERM for its event loop: fio gets them back */
        sigemptyset(&none);
        posix_spawnattr_setsigmask(&attr, &none);
        posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
        r = posix_spawnp(&pid, "fio", &fa, &attr, (char *const *) argv, environ);
        posix_spawn_file_actions_destroy(&fa);
        posix_spawnattr_destroy(&attr);
        close(pipefd[1]);
        if (r != 0) {
                close(pipefd[0]);
                return fio_errorf(ret_error, -r, "Cannot start fio: %s", strerror(r));
        }
        for (;;) {
                char *p;
                ssize_t got;

                if (len + 65536 > FIO_OUTPUT_MAX)
                        break;
                p = realloc(out, len + 65536 + 1);
                if (!p)
                        break;
                out = p;
                got = read(pipefd[0], out + len, 65536);
                if (got < 0 && errno == EINTR)
                        continue;
                if (got <= 0)
                        break;
                len += (size_t) got;
        }
        if (out)
                out[len] = '\0';
        close(pipefd[0]);
        while (waitpid(pid, &status, 0) < 0)
                if (errno != EINTR)
                        return fio_errorf(ret_error, -errno, "Cannot wait for fio: %m");
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
                return fio_errorf(ret_error, -EIO, "fio failed (%s %d; its messages are above)",
                                  WIFEXITED(status) ? "exit status" : "signal",
                                  WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
        if (!out || bench_fio_parse(out, op, ret_bytes, ret_ms) < 0)
                return fio_errorf(ret_error, -EIO, "fio's output has no %s io_bytes and runtime",
                                  op == BENCH_READ ? "read" : "write");
        return 0;
}

int bench_fio(char *const *files, unsigned n, BenchOp op, uint64_t bs, unsigned qd, uint64_t size,
              uint64_t max_bytes, double seconds, bool fixedbufs, double *ret_gbps, uint64_t *ret_ms,
              char **ret_error) {
        char a_file[PATH_MAX * 2];
        uint64_t io = MAX(max_bytes, bs * qd), bytes = 0, ms = 0, more;
        size_t used = 0;
        int r;

        if (!in_path("fio"))
                return fio_errorf(ret_error, -ENOENT, "fio is not installed (Debian package fio)");
        for (unsigned i = 0; i < n; i++) {
                /* fio separates files with ':' (a ':' in a name would be "\:") */
                if (strchr(files[i], ':'))
                        return fio_errorf(ret_error, -EINVAL, "fio cannot be given '%s': its name has a ':'", files[i]);
                r = snprintf(a_file + used, sizeof(a_file) - used, "%s%s", i ? ":" : "", files[i]);
                if (r < 0 || (size_t) r >= sizeof(a_file) - used)
                        return fio_errorf(ret_error, -ENAMETOOLONG, "the scratch file names are too long for fio");
                used += (size_t) r;
        }
        r = fio_once(a_file, op, bs, qd, size * n, io, seconds, fixedbufs, &bytes, &ms, ret_error);
        if (r < 0)
                return r;
        /*
         * too short for fio's whole milliseconds: again with more bytes (the same time bound), a few
         * times, since a short first run is mostly ramp-up and says little of the speed after it
         */
        for (unsigned tries = 0; tries < FIO_LONGER_TRIES && (more = bench_fio_longer(bytes, ms)) > 0; tries++) {
                r = fio_once(a_file, op, bs, qd, size * n, more, seconds, fixedbufs, &bytes, &ms, ret_error);
                if (r < 0)
                        return r;
        }
        *ret_gbps = bench_fio_gbps(bytes, ms);
        *ret_ms = ms;
        return 0;
}
