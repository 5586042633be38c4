/* SPDX-License-Identifier: MIT */
/* job.c: tierctl tensors, evict and detach: verbs on one job, for its owner, root and tier-admin. */

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tier.h>

#include "client/tierctl/tables.h"
#include "client/tierctl/tierctl.h"
#include "util/json.h"
#include "util/size.h"

/*
 * Parse a verb's options: --json, --help and those in @extra (handled by
 * @fn(@userdata, opt, optarg), which returns EXIT_USAGE after saying why, or 0);
 * then exactly one JOB.  Returns -1 to go on (*@ret_job set), else the exit status.
 */
static int parse_job_args(const char *verb, int argc, char **argv, const struct option *extra, size_t n_extra,
                          int (*fn)(void *userdata, int opt, const char *arg), void *userdata, void (*help)(FILE *),
                          const char **ret_job) {
        enum { ARG_JSON = 0x100 };
        struct option options[8] = {
                { "json", no_argument, NULL, ARG_JSON },
                { "help", no_argument, NULL, 'h' },
        };
        int opt;

        for (size_t i = 0; i < n_extra && i < 5; i++)
                options[2 + i] = extra[i];
        optind = 0;
        opterr = 0;
        while ((opt = getopt_long(argc, argv, ":h", options, NULL)) >= 0)
                switch (opt) {
                case ARG_JSON:
                        arg_json = 1;
                        break;
                case 'h':
                        help(stdout);
                        return EXIT_SUCCESS;
                case ':':
                case '?':
                        return verb_bad_option(verb, opt, argv);
                default:
                        if (!fn || fn(userdata, opt, optarg) != 0)
                                return EXIT_USAGE;
                        break;
                }
        if (optind >= argc) {
                fprintf(stderr, "tierctl %s: no job given (tierctl %s JOB; tierctl jobs lists them)\n", verb, verb);
                return EXIT_USAGE;
        }
        if (optind + 1 < argc) {
                fprintf(stderr, "tierctl %s: unexpected argument '%s' (one job at a time)\n", verb,
                        argv[optind + 1]);
                return EXIT_USAGE;
        }
        if (check_job_name(verb, argv[optind]) != 0)
                return EXIT_USAGE;
        *ret_job = argv[optind];
        return -1;
}

/* ---- tensors ----------------------------------------------------------------------------- */

void tensors_help(FILE *f) {
        fprintf(f,
                "Usage: tierctl tensors [--json] [--min-size SIZE] JOB\n"
                "\n"
                "List JOB's tensors: name, size, the state of its copy in each tier (absent,\n"
                "filling, resident or draining; \"stale\" when it no longer holds the newest data),\n"
                "pins, dirty (the tiers whose copy holds newest data that NVMe lacks: an evict\n"
                "writes it down first) and when it was last used.  Allowed to JOB's owner, root and\n"
                "group tier-admin.\n"
                "\n"
                "  --json            one JSON document\n"
                "  --min-size SIZE   only tensors of at least SIZE (bytes, or with K, M, G, T, P, E,\n"
                "                    optionally followed by B or iB: 64K, 1GiB)\n");
}

static int tensors_opt(void *userdata, int opt, const char *arg) {
        uint64_t *min = userdata;
        int r;

        r = size_parse(arg, min);
        if (r < 0) {
                fprintf(stderr, "tierctl tensors: --min-size must be a size like 4096, 64K or 1GiB%s, not '%s'\n",
                        r == -ERANGE ? " below 16 EiB" : "", arg);
                return EXIT_USAGE;
        }
        return 0;
}

static void tensors_json(const char *job, const struct tier_tensor_info *v, size_t n, uint64_t min,
                         JsonWriter *w) {
        json_object_begin(w);
        json_key(w, "job");
        json_string(w, job);
        json_key(w, "tensors");
        json_array_begin(w);
        for (size_t i = 0; i < n; i++) {
                const struct tier_tensor_info *t = &v[i];
                unsigned pins = 0;
                bool dirty = false;

                if (t->size < min)
                        continue;
                json_object_begin(w);
                json_key(w, "name");
                json_string(w, t->name);
                json_key(w, "id");
                json_uint(w, t->id);
                json_key(w, "size");
                json_uint(w, t->size);
                json_key(w, "copies");
                json_object_begin(w);
                for (int k = 0; k < TIER_LEVEL_MAX; k++) {
                        json_key(w, tier_level_name(k));
                        json_object_begin(w);
                        json_key(w, "state");
                        json_string(w, copy_state_name(t->copy[k].state));
                        json_key(w, "valid");
                        json_bool(w, t->copy[k].valid);
                        json_key(w, "dirty");
                        json_bool(w, t->copy[k].dirty);
                        json_key(w, "pins");
                        json_uint(w, t->copy[k].pins);
                        json_object_end(w);
                        pins += t->copy[k].pins;
                        dirty = dirty || t->copy[k].dirty;
                }
                json_object_end(w);
                json_key(w, "pins");
                json_uint(w, pins);
                json_key(w, "dirty");
                json_bool(w, dirty);
                json_key(w, "idle_s");
                if (t->used)
                        json_double_fixed(w, t->idle_s, 3);
                else
                        json_null(w);
                json_key(w, "state");
                if (tensor_state_name(t->state))
                        json_string(w, tensor_state_name(t->state));
                else
                        json_null(w);
                json_key(w, "lost_why");
                if (t->lost_why)
                        json_string(w, t->lost_why);
                else
                        json_null(w);
                json_object_end(w);
        }
        json_array_end(w);
        json_object_end(w);
}

int verb_tensors(int argc, char **argv) {
        static const struct option extra[] = {
                { "min-size", required_argument, NULL, 0x200 },
        };
        struct tier_tensor_info *v = NULL;
        const char *job = NULL;
        tier_client *c = NULL;
        uint64_t min = 0;
        size_t n = 0;
        int r;

        r = parse_job_args("tensors", argc, argv, extra, 1, tensors_opt, &min, tensors_help, &job);
        if (r >= 0)
                return r;
        if (connect_control(&c) < 0)
                return EXIT_FAILURE;
        r = tier_job_tensors(c, job, &v, &n);
        if (r < 0) {
                fprintf(stderr, "tierctl: cannot list the tensors of job '%s': %s\n", job, why(c, r));
                disconnect_control(c);
                return EXIT_FAILURE;
        }
        disconnect_control(c);
        if (arg_json) {
                JsonWriter w = JSON_WRITER_NULL;

                tensors_json(job, v, n, min, &w);
                r = json_print(&w);
        } else
                tensors_table(stdout, job, v, n, min);
        free(v);
        return r < 0 || fflush(stdout) != 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* ---- evict ------------------------------------------------------------------------------- */

void evict_help(FILE *f) {
        fprintf(f,
                "Usage: tierctl evict [--json] [--to nvme|host] JOB\n"
                "\n"
                "Move all of JOB's unpinned copies down to nvme (the default) or host: a copy that\n"
                "holds the only up-to-date data is written down first, then the copies above are\n"
                "dropped.  Pinned tensors are skipped and counted.  Waits until it is done (with\n"
                "no limit unless tierctl --timeout SEC is given; an evict given up on runs on in\n"
                "tierd) and reports the bytes written down and dropped.  Allowed to JOB's owner,\n"
                "root and group tier-admin.  Exit status 1 when a tensor could not be evicted.\n"
                "\n"
                "  --json          one JSON document\n"
                "  --to TIER       nvme (default) or host\n");
}

static int evict_opt(void *userdata, int opt, const char *arg) {
        int *tier = userdata;

        if (strcmp(arg, "nvme") == 0)
                *tier = TIER_NVME;
        else if (strcmp(arg, "host") == 0)
                *tier = TIER_HOST;
        else {
                fprintf(stderr, "tierctl evict: --to takes nvme or host, not '%s'\n", arg);
                return EXIT_USAGE;
        }
        return 0;
}

int verb_evict(int argc, char **argv) {
        static const struct option extra[] = {
                { "to", required_argument, NULL, 0x200 },
        };
        struct tier_evict_result res;
        int tier = TIER_NVME, r;
        const char *job = NULL;
        tier_client *c = NULL;

        r = parse_job_args("evict", argc, argv, extra, 1, evict_opt, &tier, evict_help, &job);
        if (r >= 0)
                return r;
        if (connect_control(&c) < 0)
                return EXIT_FAILURE;
        /* tierd answers when the write-down is done, however long it takes: only --timeout bounds that */
        if (!arg_timeout_given)
                deadline_stop();
        r = tier_job_evict(c, job, tier, &res);
        if (r < 0) {
                fprintf(stderr, "tierctl: cannot evict job '%s': %s\n", job, why(c, r));
                disconnect_control(c);
                return EXIT_FAILURE;
        }
        if (res.failed > 0)
                fprintf(stderr, "tierctl: evicting job '%s': %s\n", job, why(c, -EIO));
        disconnect_control(c);
        if (arg_json) {
                JsonWriter w = JSON_WRITER_NULL;

                json_object_begin(&w);
                json_key(&w, "job");
                json_string(&w, job);
                json_key(&w, "to");
                json_string(&w, tier_level_name(tier));
                json_key(&w, "evicted");
                json_uint(&w, res.evicted);
                json_key(&w, "bytes_written");
                json_uint(&w, res.bytes_written);
                json_key(&w, "bytes_dropped");
                json_uint(&w, res.bytes_dropped);
                json_key(&w, "pinned");
                json_uint(&w, res.pinned);
                json_key(&w, "pinned_bytes");
                json_uint(&w, res.pinned_bytes);
                json_key(&w, "failed");
                json_uint(&w, res.failed);
                json_object_end(&w);
                if (json_print(&w) < 0)
                        return EXIT_FAILURE;
        } else {
                printf("job '%s': %u tensor(s) evicted to %s: %s written down, %s dropped above it\n", job,
                       res.evicted, tier_level_name(tier), FORMAT_SIZE(res.bytes_written),
                       FORMAT_SIZE(res.bytes_dropped));
                if (res.pinned > 0)
                        printf("skipped %u pinned tensor(s) (%s)\n", res.pinned, FORMAT_SIZE(res.pinned_bytes));
                if (res.failed > 0)
                        printf("%u tensor(s) failed\n", res.failed);
        }
        if (fflush(stdout) != 0)
                return EXIT_FAILURE;
        return res.failed > 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* ---- detach ------------------------------------------------------------------------------- */

void detach_help(FILE *f) {
        fprintf(f,
                "Usage: tierctl detach [--json] JOB\n"
                "\n"
                "End JOB now, as if its linger ran out at once: tierd closes its connections (its\n"
                "processes are told who detached it) and frees all its tensors and memory.  The\n"
                "data is lost.  Allowed to JOB's owner, root and group tier-admin.\n"
                "\n"
                "  --json   one JSON document\n");
}

int verb_detach(int argc, char **argv) {
        struct tier_detach_result res;
        const char *job = NULL;
        tier_client *c = NULL;
        int r;

        r = parse_job_args("detach", argc, argv, NULL, 0, NULL, NULL, detach_help, &job);
        if (r >= 0)
                return r;
        if (connect_control(&c) < 0)
                return EXIT_FAILURE;
        r = tier_job_detach(c, job, &res);
        if (r < 0) {
                fprintf(stderr, "tierctl: cannot detach job '%s': %s\n", job, why(c, r));
                disconnect_control(c);
                return EXIT_FAILURE;
        }
        disconnect_control(c);
        if (arg_json) {
                JsonWriter w = JSON_WRITER_NULL;

                json_object_begin(&w);
                json_key(&w, "job");
                json_string(&w, job);
                json_key(&w, "id");
                json_uint(&w, res.job_id);
                json_key(&w, "connections");
                json_uint(&w, res.connections);
                json_key(&w, "tensors");
                json_uint(&w, res.tensors);
                json_key(&w, "freed");
                json_object_begin(&w);
                for (int t = 0; t < TIER_LEVEL_MAX; t++) {
                        json_key(&w, tier_level_name(t));
                        json_uint(&w, res.freed[t]);
                }
                json_object_end(&w);
                json_object_end(&w);
                if (json_print(&w) < 0)
                        return EXIT_FAILURE;
        } else
                printf("job '%s' (id %" PRIu64 ") detached: %u connection(s) closed, %u tensor(s) freed "
                       "(vram %s, host %s, nvme %s)\n", job, res.job_id, res.connections, res.tensors,
                       FORMAT_SIZE(res.freed[TIER_VRAM]), FORMAT_SIZE(res.freed[TIER_HOST]),
                       FORMAT_SIZE(res.freed[TIER_NVME]));
        return fflush(stdout) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
