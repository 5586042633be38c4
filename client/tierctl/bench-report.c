/* SPDX-License-Identifier: MIT */
/* bench-report.c: tierctl bench's results: JSON, tables, the tierd.conf drop-in, the saved file. */

/*
 * Theory of operation: everything here reads a finished Bench (bench.c).
 * The JSON is the schema of tierctl(1), which tierctl plan --bench reads:
 * every cell of (each target, and "striped" with two or more) x op x bs x
 * qd, in that order.  The drop-in carries the settings tierd has for its
 * NVMe I/O: [nvme] extent_size (each extent is one request: the block
 * size) and queue_depth (the one ring's depth, all targets together: the
 * striped queue depth), chosen by bench_choose_config().  Files are written
 * to a temporary name in the same directory and renamed over the target,
 * so a reader never sees half a file.
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/tierctl/bench.h"
#include "proto/macro.h"
#include "util/json.h"
#include "util/size.h"

static const char *const op_names[_BENCH_OP_MAX] = {
        [BENCH_READ] = "read",
        [BENCH_WRITE] = "write",
};

const char *bench_target_name(const Bench *b, int target) {
        return target == BENCH_STRIPED ? "striped" : b->targets[target].name;
}

double bench_target_link(const Bench *b, int target) {
        double sum = 0;

        if (target != BENCH_STRIPED)
                return b->targets[target].link_gbps;
        for (unsigned i = 0; i < b->n_targets; i++) {
                if (b->targets[i].link_gbps <= 0)
                        return 0;
                sum += b->targets[i].link_gbps;
        }
        return sum;
}

static const BenchCell *cell_find(const Bench *b, int target, BenchOp op, uint64_t bs, unsigned qd) {
        for (size_t k = 0; k < b->n_cells; k++) {
                const BenchCell *c = &b->cells[k];

                if (c->target == target && c->op == op && c->bs == bs && c->qd == qd)
                        return c;
        }
        return NULL;
}

static bool is_pow2(uint64_t v) {
        return v && !(v & (v - 1));
}

void bench_choose_config(Bench *b) {
        int set = b->n_targets > 1 ? BENCH_STRIPED : 0;
        double best = -1;

        /* pass 1: the best mean; pass 2: the first (smallest bs, then qd) within 5% of it */
        for (int pass = 0; pass < 2; pass++)
                for (size_t i = 0; i < b->n_bs; i++)
                        for (size_t j = 0; j < b->n_qd; j++) {
                                const BenchCell *r = cell_find(b, set, BENCH_READ, b->bs[i], b->qd[j]);
                                const BenchCell *w = cell_find(b, set, BENCH_WRITE, b->bs[i], b->qd[j]);
                                double mean;

                                /* extent_size is a power of two in 4K..64M (config.c) */
                                if (!r || !w || !is_pow2(b->bs[i]))
                                        continue;
                                mean = (r->res.gbps + w->res.gbps) / 2;
                                if (pass == 0 && mean > best)
                                        best = mean;
                                if (pass == 1 && mean >= 0.95 * best &&
                                    (!b->config.set || b->bs[i] < b->config.extent_size ||
                                     (b->bs[i] == b->config.extent_size && b->qd[j] < b->config.queue_depth))) {
                                        b->config.set = true;
                                        b->config.extent_size = b->bs[i];
                                        b->config.queue_depth = b->qd[j];
                                        b->config.target = set;
                                        b->config.read_gbps = r->res.gbps;
                                        b->config.write_gbps = w->res.gbps;
                                }
                        }
        if (!b->config.set)
                (void) snprintf(b->config.why, sizeof(b->config.why),
                                "no block size of --bs is a power of two, as [nvme] extent_size must be");
}

static void json_best(JsonWriter *w, const Bench *b, const BenchBest *best) {
        json_object_begin(w);
        json_key(w, "target");
        json_string(w, bench_target_name(b, best->target));
        json_key(w, "bs");
        json_uint(w, best->bs);
        json_key(w, "qd");
        json_uint(w, best->qd);
        json_key(w, "gbps");
        json_double(w, best->gbps);
        json_object_end(w);
}

static void json_link(JsonWriter *w, double gbps) {
        if (gbps > 0)
                json_double(w, gbps);
        else
                json_null(w);
}

static void json_cells(JsonWriter *w, const Bench *b) {
        json_key(w, "cells");
        json_array_begin(w);
        for (size_t k = 0; k < b->n_cells; k++) {
                const BenchCell *c = &b->cells[k];

                json_object_begin(w);
                json_key(w, "target");
                json_string(w, bench_target_name(b, c->target));
                json_key(w, "op");
                json_string(w, op_names[c->op]);
                json_key(w, "bs");
                json_uint(w, c->bs);
                json_key(w, "qd");
                json_uint(w, c->qd);
                json_key(w, "gbps");
                json_double(w, c->res.gbps);
                json_key(w, "iops");
                json_double(w, c->res.iops);
                json_key(w, "lat_us_p50");
                json_double(w, c->res.lat_us_p50);
                json_key(w, "suspect");
                json_bool(w, c->suspect);
                json_key(w, "bytes");
                json_uint(w, c->res.bytes);
                json_key(w, "seconds");
                json_double(w, c->res.seconds);
                json_object_end(w);
        }
        json_array_end(w);
}

/* The last whole interval of a sustained write (the last one if it is the only one). */
static size_t last_full(const BenchResult *r) {
        return r->n_intervals - 1 - (r->last_partial && r->n_intervals > 1);
}

static void json_sustained(JsonWriter *w, const Bench *b) {
        const BenchResult *r = &b->sustained.res;

        json_key(w, "sustained");
        if (!b->sustained.ran) {
                json_null(w);
                return;
        }
        json_object_begin(w);
        json_key(w, "target");
        json_string(w, bench_target_name(b, b->sustained.target));
        json_key(w, "bs");
        json_uint(w, b->sustained.bs);
        json_key(w, "qd");
        json_uint(w, b->sustained.qd);
        json_key(w, "bytes");
        json_uint(w, r->bytes);
        json_key(w, "seconds");
        json_double(w, r->seconds);
        json_key(w, "interval_s");
        json_double(w, b->interval_s);
        json_key(w, "gbps");
        json_array_begin(w);
        for (size_t i = 0; i < r->n_intervals; i++)
                json_double(w, r->interval_gbps[i]);
        json_array_end(w);
        json_key(w, "gbps_first");
        json_double(w, r->n_intervals ? r->interval_gbps[0] : 0);
        json_key(w, "gbps_last");
        json_double(w, r->n_intervals ? r->interval_gbps[last_full(r)] : 0);
        json_key(w, "last_partial");
        json_bool(w, r->last_partial);
        json_key(w, "cliff_at_bytes");
        if (b->sustained.cliff >= 0)
                json_uint(w, b->sustained.cliff_bytes);
        else
                json_null(w);
        json_object_end(w);
}

int bench_json(const Bench *b, char **ret) {
        JsonWriter w = JSON_WRITER_NULL;
        int r;

        json_object_begin(&w);
        json_key(&w, "bench");
        json_string(&w, "storage");
        json_key(&w, "version");
        json_uint(&w, 1);
        json_key(&w, "time");
        json_string(&w, b->time);
        json_key(&w, "size");
        json_uint(&w, b->size);

        json_key(&w, "targets");
        json_array_begin(&w);
        for (unsigned i = 0; i < b->n_targets; i++) {
                json_object_begin(&w);
                json_key(&w, "name");
                json_string(&w, b->targets[i].name);
                json_key(&w, "path");
                json_string(&w, b->targets[i].path);
                json_key(&w, "scratch");
                json_string(&w, b->targets[i].scratch);
                json_key(&w, "link_gbps");
                json_link(&w, b->targets[i].link_gbps);
                json_key(&w, "prefill_gbps");
                json_double(&w, b->prefill[i].gbps);
                json_object_end(&w);
        }
        json_array_end(&w);

        json_cells(&w, b);

        json_key(&w, "best");
        json_object_begin(&w);
        for (int op = BENCH_READ; op < _BENCH_OP_MAX; op++) {
                json_key(&w, op_names[op]);
                json_best(&w, b, &b->best[op]);
        }
        json_object_end(&w);

        json_key(&w, "per_target_best");
        json_array_begin(&w);
        for (unsigned i = 0; i < b->n_targets; i++) {
                json_object_begin(&w);
                json_key(&w, "target");
                json_string(&w, b->targets[i].name);
                json_key(&w, "read_gbps");
                json_double(&w, b->target_best[i][BENCH_READ].gbps);
                json_key(&w, "write_gbps");
                json_double(&w, b->target_best[i][BENCH_WRITE].gbps);
                json_object_end(&w);
        }
        json_array_end(&w);

        json_key(&w, "fio");
        if (b->fio_result.ran) {
                json_object_begin(&w);
                json_key(&w, "read_gbps");
                json_double(&w, b->fio_result.gbps[BENCH_READ]);
                json_key(&w, "write_gbps");
                json_double(&w, b->fio_result.gbps[BENCH_WRITE]);
                json_key(&w, "bs");
                json_uint(&w, b->fio_result.bs[BENCH_READ]);
                json_key(&w, "qd");
                json_uint(&w, b->fio_result.qd[BENCH_READ]);
                json_key(&w, "write_bs");
                json_uint(&w, b->fio_result.bs[BENCH_WRITE]);
                json_key(&w, "write_qd");
                json_uint(&w, b->fio_result.qd[BENCH_WRITE]);
                json_key(&w, "target");
                json_string(&w, bench_target_name(b, b->fio_result.target[BENCH_READ]));
                json_key(&w, "write_target");
                json_string(&w, bench_target_name(b, b->fio_result.target[BENCH_WRITE]));
                json_key(&w, "runtime_ms");
                json_uint(&w, b->fio_result.ms[BENCH_READ]);
                json_key(&w, "write_runtime_ms");
                json_uint(&w, b->fio_result.ms[BENCH_WRITE]);
                json_object_end(&w);
        } else {
                json_null(&w);
                json_key(&w, "fio_reason");
                json_string(&w, b->fio_result.reason ? b->fio_result.reason : "not run");
        }

        json_sustained(&w, b);

        json_key(&w, "registered_buffers");
        json_bool(&w, b->registered);
        json_key(&w, "config");
        if (b->config.set) {
                json_object_begin(&w);
                json_key(&w, "extent_size");
                json_uint(&w, b->config.extent_size);
                json_key(&w, "queue_depth");
                json_uint(&w, b->config.queue_depth);
                json_key(&w, "target");
                json_string(&w, bench_target_name(b, b->config.target));
                json_object_end(&w);
        } else
                json_null(&w);
        json_object_end(&w);

        r = json_writer_finish(&w, ret, NULL);
        json_writer_deinit(&w);
        return r;
}

/* One table: @op of @target, bs down, qd across. */
static void print_table(const Bench *b, FILE *f, int target, BenchOp op) {
        fprintf(f, "\n%s %s, GB/s\n  %8s", bench_target_name(b, target), op_names[op], "bs \\ qd");
        for (size_t j = 0; j < b->n_qd; j++)
                fprintf(f, " %7u", b->qd[j]);
        fputc('\n', f);
        for (size_t i = 0; i < b->n_bs; i++) {
                fprintf(f, "  %8s", FORMAT_SIZE_EXACT(b->bs[i]));
                for (size_t j = 0; j < b->n_qd; j++) {
                        const BenchCell *c = cell_find(b, target, op, b->bs[i], b->qd[j]);

                        fprintf(f, " %6.2f%c", c ? c->res.gbps : 0.0, c && c->suspect ? '!' : ' ');
                }
                fputc('\n', f);
        }
}

static void print_best(const Bench *b, FILE *f, const char *what, const BenchBest *best) {
        fprintf(f, "best %-5s  %6.2f GB/s  %s, %s x %u\n", what, best->gbps, bench_target_name(b, best->target),
                FORMAT_SIZE_EXACT(best->bs), best->qd);
}

void bench_print(const Bench *b, FILE *f) {
        bool suspect = false;

        fprintf(f, "Storage bench %s: cold O_DIRECT through tierd's io_uring code, %s scratch per target, %s buffer\n",
                b->time, FORMAT_SIZE_EXACT(b->size), b->registered ? "registered" : "plain (memlock limit)");
        for (unsigned i = 0; i < b->n_targets; i++) {
                const BenchTarget *t = &b->targets[i];

                fprintf(f, "  %s  %s  scratch %s  link ", t->name, t->path, t->scratch);
                if (t->link_gbps > 0)
                        fprintf(f, "%.2f GB/s", t->link_gbps);
                else
                        fputs("unknown", f);
                fprintf(f, "  first write %.2f GB/s\n", b->prefill[i].gbps);
        }
        for (unsigned s = 0; s < (b->n_targets > 1 ? b->n_targets + 1 : 1); s++)
                for (int op = BENCH_WRITE; op >= BENCH_READ; op--)
                        print_table(b, f, s < b->n_targets ? (int) s : BENCH_STRIPED, (BenchOp) op);
        for (size_t k = 0; k < b->n_cells; k++)
                suspect = suspect || b->cells[k].suspect;
        if (suspect)
                fputs("  ! faster than the link: a cache answered, not the drive (suspect)\n", f);
        fputc('\n', f);
        print_best(b, f, "read", &b->best[BENCH_READ]);
        print_best(b, f, "write", &b->best[BENCH_WRITE]);
        if (b->fio_result.ran)
                fprintf(f, "fio         %6.2f GB/s read (%s x %u, on %s), %.2f GB/s write (%s x %u, on %s)\n",
                        b->fio_result.gbps[BENCH_READ], FORMAT_SIZE_EXACT(b->fio_result.bs[BENCH_READ]),
                        b->fio_result.qd[BENCH_READ], bench_target_name(b, b->fio_result.target[BENCH_READ]),
                        b->fio_result.gbps[BENCH_WRITE], FORMAT_SIZE_EXACT(b->fio_result.bs[BENCH_WRITE]),
                        b->fio_result.qd[BENCH_WRITE], bench_target_name(b, b->fio_result.target[BENCH_WRITE]));
        else
                fprintf(f, "fio         none: %s\n", b->fio_result.reason ? b->fio_result.reason : "not run");
        if (b->sustained.ran) {
                const BenchResult *r = &b->sustained.res;

                fprintf(f, "sustained   %s in %.1f s (%s, %s x %u): %.2f GB/s overall, first %.2f, last %.2f GB/s; ",
                        FORMAT_SIZE(r->bytes), r->seconds, bench_target_name(b, b->sustained.target),
                        FORMAT_SIZE_EXACT(b->sustained.bs), b->sustained.qd, r->gbps,
                        r->n_intervals ? r->interval_gbps[0] : 0.0,
                        r->n_intervals ? r->interval_gbps[last_full(r)] : 0.0);
                if (b->sustained.cliff >= 0)
                        fprintf(f, "cliff after %s\n", FORMAT_SIZE(b->sustained.cliff_bytes));
                else
                        fputs("no cliff\n", f);
                if (r->n_intervals > 1) {
                        fprintf(f, "  per %g s:", b->interval_s);
                        for (size_t i = 0; i < r->n_intervals; i++)
                                fprintf(f, " %.2f", r->interval_gbps[i]);
                        fputc('\n', f);
                }
        } else
                fputs("sustained   not run\n", f);
        if (b->config.set)
                fprintf(f, "for tierd   [nvme] extent_size = %s, queue_depth = %u (%s: read %.2f, write %.2f GB/s)\n",
                        FORMAT_SIZE_EXACT(b->config.extent_size), b->config.queue_depth,
                        bench_target_name(b, b->config.target), b->config.read_gbps, b->config.write_gbps);
        else
                fprintf(f, "for tierd   nothing: %s\n", b->config.why);
}

/* @path's directory made if missing (one level: ~/.cache/tierd under an existing ~/.cache made too). */
static int mkdir_parents(const char *path) {
        _cleanup_free_ char *dir = strdup(path);
        char *p;

        if (!dir)
                return -ENOMEM;
        for (p = strchr(dir + 1, '/'); p; p = strchr(p + 1, '/')) {
                *p = '\0';
                if (mkdir(dir, 0755) < 0 && errno != EEXIST)
                        return -errno;
                *p = '/';
        }
        return 0;
}

int bench_save(const char *path, const char *text, bool mkdirs, char **ret_error) {
        _cleanup_free_ char *tmp = NULL;
        size_t len = strlen(text);
        int fd, r = 0;

        if (mkdirs && (r = mkdir_parents(path)) < 0)
                goto fail;
        if (asprintf(&tmp, "%s.XXXXXX", path) < 0) {
                tmp = NULL;
                return -ENOMEM;
        }
        fd = mkostemp(tmp, O_CLOEXEC);
        if (fd < 0) {
                r = -errno;
                goto fail;
        }
        if (fchmod(fd, 0644) < 0 || write(fd, text, len) != (ssize_t) len || write(fd, "\n", 1) != 1 ||
            fsync(fd) < 0) {
                r = errno ? -errno : -EIO;
                close(fd);
                unlink(tmp);
                goto fail;
        }
        close(fd);
        if (rename(tmp, path) < 0) {
                r = -errno;
                unlink(tmp);
                goto fail;
        }
        return 0;
fail:
        if (asprintf(ret_error, "%s: %s", path, strerror(-r)) < 0)
                *ret_error = NULL;
        return r;
}

int bench_save_check(const char *path, char **ret_error) {
        _cleanup_free_ char *dir = NULL;
        const char *slash = strrchr(path, '/');
        struct stat st;
        int r = 0;

        if (!slash)
                dir = strdup(".");
        else
                dir = strndup(path, slash == path ? 1 : (size_t) (slash - path));
        if (!dir)
                return -ENOMEM;
        if (stat(dir, &st) < 0)
                r = -errno;
        else if (!S_ISDIR(st.st_mode))
                r = -ENOTDIR;
        else if (access(dir, W_OK | X_OK) < 0)
                r = -errno;
        if (r < 0 && asprintf(ret_error, "%s: directory %s: %s (nothing was run)", path, dir, strerror(-r)) < 0)
                *ret_error = NULL;
        return r;
}

int bench_write_config(const Bench *b, const char *path, char **ret_error) {
        _cleanup_free_ char *text = NULL;
        char *p = NULL;
        size_t len = 0;
        FILE *f;
        int r;

        if (!b->config.set) {
                if (asprintf(ret_error, "%s: %s", path, b->config.why) < 0)
                        *ret_error = NULL;
                return -EINVAL;
        }
        f = open_memstream(&p, &len);
        if (!f)
                return -ENOMEM;
        fprintf(f, "# tierd.conf drop-in written by tierctl bench at %s (see tierctl(1)).\n", b->time);
        fprintf(f, "# Measured: cold O_DIRECT writes and reads through tierd's io_uring code,\n"
                "# %s scratch per target, on:\n", FORMAT_SIZE_EXACT(b->size));
        for (unsigned i = 0; i < b->n_targets; i++)
                fprintf(f, "#   %s %s (scratch %s)\n", b->targets[i].name, b->targets[i].path, b->targets[i].scratch);
        for (int op = BENCH_READ; op < _BENCH_OP_MAX; op++)
                fprintf(f, "# Best %s: %.2f GB/s (%s, %s blocks at depth %u).\n", op_names[op], b->best[op].gbps,
                        bench_target_name(b, b->best[op].target), FORMAT_SIZE_EXACT(b->best[op].bs), b->best[op].qd);
        fprintf(f, "# Chosen on %s: the smallest block size, then depth, within 5%% of the best\n"
                "# mean of read and write: read %.2f GB/s, write %.2f GB/s.\n"
                "# [host] segment_size must stay a multiple of extent_size.\n",
                b->config.target == BENCH_STRIPED ? "all targets striped" : "the one target",
                b->config.read_gbps, b->config.write_gbps);
        fprintf(f, "[nvme]\nextent_size = %s\nqueue_depth = %u\n", FORMAT_SIZE_EXACT(b->config.extent_size),
                b->config.queue_depth);
        if (fclose(f) != 0 || !p) {
                free(p);
                return -ENOMEM;
        }
        text = p;
        /* bench_save() adds a newline: drop ours */
        if (len > 0 && text[len - 1] == '\n')
                text[len - 1] = '\0';
        r = bench_save(path, text, false, ret_error);
        return r;
}
