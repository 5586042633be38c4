/* SPDX-License-Identifier: MIT */
/* quota.c: tierctl quota get|set. */

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tier.h>

#include "client/tierctl/tierctl.h"
#include "util/json.h"
#include "util/size.h"

/* ---- quota ------------------------------------------------------------------------------- */

/* One quota as {"job":NAME,"vram":BYTES,"host":BYTES,"nvme":BYTES,"weight":N}. */
static void quota_json(JsonWriter *w, const char *job, const struct tier_quota *q) {
        json_object_begin(w);
        json_key(w, "job");
        json_string(w, job);
        for (int t = 0; t < TIER_LEVEL_MAX; t++) {
                json_key(w, tier_level_name(t));
                json_uint(w, q->limit[t]);
        }
        json_key(w, "weight");
        json_uint(w, q->weight);
        json_object_end(w);
}

static void quota_print_header(FILE *f, int name_width) {
        fprintf(f, "%-*s  %10s  %10s  %10s  %6s\n", name_width, "JOB", "VRAM", "HOST", "NVME", "WEIGHT");
}

static void quota_print_row(FILE *f, int name_width, const char *job, const struct tier_quota *q) {
        fprintf(f, "%-*s  %10s  %10s  %10s  %6u\n", name_width, job,
                FORMAT_SIZE(q->limit[TIER_VRAM]), FORMAT_SIZE(q->limit[TIER_HOST]),
                FORMAT_SIZE(q->limit[TIER_NVME]), q->weight);
}

/*
 * json_next_string() - the next JSON string value after key @key at or after
 * *@pos in @json, unescaped into a malloc'ed string; *@pos moves past it.
 * NULL at the end (or on a string tierctl cannot decode, which is skipped).
 * Enough for tierd's own status JSON, which escapes only '"', '\\' and
 * control characters (\uXXXX below U+0080).
 */
static char *json_next_string(const char *json, const char **pos, const char *key) {
        char pattern[64];
        const char *p;

        (void) snprintf(pattern, sizeof(pattern), "\"%s\":\"", key);
        while ((p = strstr(*pos, pattern))) {
                size_t len = 0;
                char *out, *o;
                bool ok = true;

                p += strlen(pattern);
                out = malloc(strlen(p) + 1);
                if (!out)
                        return NULL;
                o = out;
                for (; *p && *p != '"'; p++, len++) {
                        if (*p != '\\') {
                                *o++ = *p;
                                continue;
                        }
                        p++;
                        switch (*p) {
                        case '"': case '\\': case '/':
                                *o++ = *p;
                                break;
                        case 'u': {
                                unsigned v = 0;

                                if (sscanf(p + 1, "%4x", &v) != 1 || v == 0 || v >= 0x80) {
                                        ok = false;
                                        v = '?';
                                }
                                *o++ = (char) v;
                                for (int k = 0; k < 4 && p[1]; k++)
                                        p++;
                                break;
                        }
                        case '\0':
                                p--;
                                ok = false;
                                break;
                        default:
                                ok = false;
                                *o++ = '?';
                                break;
                        }
                }
                *o = '\0';
                *pos = *p ? p + 1 : p;
                if (ok)
                        return out;
                free(out);
        }
        return NULL;
}

void quota_help(FILE *f) {
        fprintf(f,
                "Usage: tierctl quota get [--json] [JOB]\n"
                "       tierctl quota set JOB [--vram SIZE] [--host SIZE] [--nvme SIZE] [--weight N]\n"
                "\n"
                "Show the quota of JOB (of every job without JOB), or change it.  SIZE is bytes,\n"
                "with an optional K, M, G, T, P or E suffix (powers of 1024, either case, B or iB\n"
                "may follow: 8G = 8GB = 8GiB); N is 1..1000.  Options not given keep their value.\n"
                "Setting needs root or membership of group tier-admin.\n");
}

/* The names of the jobs tierd has now (from its status), NULL-terminated. */
static int list_jobs(tier_client *c, char ***ret) {
        char *json = NULL, **names = NULL;
        const char *pos;
        size_t n = 0;
        int r;

        r = tier_status(c, TIER_STATUS_JSON, &json);
        if (r < 0)
                return r;
        pos = strstr(json, "\"jobs\":[");
        if (!pos) {
                free(json);
                return -EBADMSG;
        }
        for (;;) {
                char *name = json_next_string(json, &pos, "name"), **x;

                x = realloc(names, (n + 2) * sizeof(char *));
                if (!x) {
                        free(name);
                        r = -ENOMEM;
                        break;
                }
                names = x;
                names[n] = name;
                if (!name)
                        break;
                names[++n] = NULL;
        }
        free(json);
        if (r < 0) {
                for (size_t i = 0; i < n; i++)
                        free(names[i]);
                free(names);
                return r;
        }
        *ret = names;
        return 0;
}

static int quota_get(int argc, char **argv) {
        enum { ARG_JSON = 0x100 };
        static const struct option options[] = {
                { "json", no_argument, NULL, ARG_JSON },
                { "help", no_argument, NULL, 'h' },
                {}
        };
        const char *job = NULL;
        tier_client *c = NULL;
        struct tier_quota q;
        int opt, r, ret = EXIT_SUCCESS;

        optind = 0;
        opterr = 0;
        while ((opt = getopt_long(argc, argv, ":h", options, NULL)) >= 0)
                switch (opt) {
                case ARG_JSON:
                        arg_json = 1;
                        break;
                case 'h':
                        quota_help(stdout);
                        return EXIT_SUCCESS;
                default:
                        return verb_bad_option("quota get", opt, argv);
                }
        if (optind < argc)
                job = argv[optind++];
        if (optind < argc) {
                fprintf(stderr, "tierctl quota get: unexpected argument '%s'\n", argv[optind]);
                return EXIT_USAGE;
        }
        if (job && !*job) {
                fprintf(stderr, "tierctl quota get: the job name is empty\n");
                return EXIT_USAGE;
        }

        if (connect_control(&c) < 0)
                return EXIT_FAILURE;

        if (job) {
                r = tier_quota_get(c, job, &q);
                if (r < 0) {
                        fprintf(stderr, "tierctl: cannot get the quota of job '%s': %s\n", job, why(c, r));
                        tier_client_free(c);
                        return EXIT_FAILURE;
                }
                if (arg_json) {
                        JsonWriter w = JSON_WRITER_NULL;

                        quota_json(&w, job, &q);
                        if (json_print(&w) < 0)
                                ret = EXIT_FAILURE;
                } else {
                        int w = (int) strlen(job);

                        quota_print_header(stdout, w < 3 ? 3 : w);
                        quota_print_row(stdout, w < 3 ? 3 : w, job, &q);
                }
        } else {
                JsonWriter jw = JSON_WRITER_NULL;
                char **names = NULL;
                struct tier_quota *qs;
                size_t n = 0;
                int w = 3;
                bool first = true;

                r = list_jobs(c, &names);
                if (r < 0) {
                        fprintf(stderr, "tierctl: cannot list the jobs: %s\n", why(c, r));
                        tier_client_free(c);
                        return EXIT_FAILURE;
                }
                while (names[n])
                        n++;
                qs = calloc(n + 1, sizeof(*qs));
                if (!qs) {
                        fprintf(stderr, "tierctl: out of memory\n");
                        for (size_t i = 0; i < n; i++)
                                free(names[i]);
                        free(names);
                        tier_client_free(c);
                        return EXIT_FAILURE;
                }
                for (size_t i = 0; i < n; i++) {
                        r = tier_quota_get(c, names[i], &qs[i]);
                        if (r == -ENOENT) {             /* gone since the listing */
                                free(names[i]);
                                names[i] = NULL;
                                continue;
                        }
                        if (r < 0) {
                                fprintf(stderr, "tierctl: cannot get the quota of job '%s': %s\n", names[i],
                                        why(c, r));
                                ret = EXIT_FAILURE;
                                free(names[i]);
                                names[i] = NULL;
                                continue;
                        }
                        if ((int) strlen(names[i]) > w)
                                w = (int) strlen(names[i]);
                }
                if (arg_json) {
                        json_object_begin(&jw);
                        json_key(&jw, "jobs");
                        json_array_begin(&jw);
                } else if (n == 0 && ret == EXIT_SUCCESS)
                        puts("no jobs");
                for (size_t i = 0; i < n; i++) {
                        if (!names[i])
                                continue;
                        if (arg_json)
                                quota_json(&jw, names[i], &qs[i]);
                        else {
                                if (first)
                                        quota_print_header(stdout, w);
                                quota_print_row(stdout, w, names[i], &qs[i]);
                        }
                        first = false;
                }
                if (arg_json) {
                        json_array_end(&jw);
                        json_object_end(&jw);
                        if (json_print(&jw) < 0)
                                ret = EXIT_FAILURE;
                }
                for (size_t i = 0; i < n; i++)
                        free(names[i]);
                free(names);
                free(qs);
        }
        tier_client_free(c);
        if (fflush(stdout) != 0)
                return EXIT_FAILURE;
        return ret;
}

static int quota_set(int argc, char **argv) {
        enum { ARG_VRAM = 0x100, ARG_HOST, ARG_NVME, ARG_WEIGHT, ARG_JSON };
        static const struct option options[] = {
                { "vram",   required_argument, NULL, ARG_VRAM },
                { "host",   required_argument, NULL, ARG_HOST },
                { "nvme",   required_argument, NULL, ARG_NVME },
                { "weight", required_argument, NULL, ARG_WEIGHT },
                { "json",   no_argument,       NULL, ARG_JSON },
                { "help",   no_argument,       NULL, 'h' },
                {}
        };
        struct tier_quota q = {};
        const char *job;
        tier_client *c = NULL;
        bool any = false;
        int opt, r;

        optind = 0;
        opterr = 0;
        while ((opt = getopt_long(argc, argv, ":h", options, NULL)) >= 0) {
                int tier = -1;

                switch (opt) {
                case ARG_VRAM:
                        tier = TIER_VRAM;
                        break;
                case ARG_HOST:
                        tier = TIER_HOST;
                        break;
                case ARG_NVME:
                        tier = TIER_NVME;
                        break;
                case ARG_WEIGHT: {
                        char *end;
                        unsigned long v;

                        errno = 0;
                        v = strtoul(optarg, &end, 10);
                        if (optarg[0] < '0' || optarg[0] > '9' || *end || errno || v < 1 || v > 1000) {
                                fprintf(stderr, "tierctl quota set: --weight must be a number from 1 to 1000, "
                                        "not '%s'\n", optarg);
                                return EXIT_USAGE;
                        }
                        q.weight = (unsigned) v;
                        any = true;
                        continue;
                }
                case ARG_JSON:
                        arg_json = 1;
                        continue;
                case 'h':
                        quota_help(stdout);
                        return EXIT_SUCCESS;
                default:
                        return verb_bad_option("quota set", opt, argv);
                }
                r = size_parse(optarg, &q.limit[tier]);
                if (r < 0 || q.limit[tier] == 0) {
                        fprintf(stderr, "tierctl quota set: --%s must be a %s like 512M, 8G or 1T, not '%s'\n",
                                tier_level_name(tier), r == -ERANGE ? "size below 16 EiB" : "positive size",
                                optarg);
                        return EXIT_USAGE;
                }
                any = true;
        }
        if (optind >= argc) {
                fprintf(stderr, "tierctl quota set: no job given (tierctl quota set JOB [--vram SIZE] "
                        "[--host SIZE] [--nvme SIZE] [--weight N])\n");
                return EXIT_USAGE;
        }
        job = argv[optind++];
        if (optind < argc) {
                fprintf(stderr, "tierctl quota set: unexpected argument '%s'\n", argv[optind]);
                return EXIT_USAGE;
        }
        if (!*job) {
                fprintf(stderr, "tierctl quota set: the job name is empty\n");
                return EXIT_USAGE;
        }
        if (!any) {
                fprintf(stderr, "tierctl quota set: nothing to set (give --vram, --host, --nvme or --weight)\n");
                return EXIT_USAGE;
        }

        if (connect_control(&c) < 0)
                return EXIT_FAILURE;
        r = tier_quota_set(c, job, &q);
        if (r < 0) {
                fprintf(stderr, "tierctl: cannot set the quota of job '%s': %s\n", job, why(c, r));
                tier_client_free(c);
                return EXIT_FAILURE;
        }
        /* show what holds now */
        r = tier_quota_get(c, job, &q);
        if (r < 0) {
                fprintf(stderr, "tierctl: quota of job '%s' set, but reading it back failed: %s\n", job, why(c, r));
                tier_client_free(c);
                return EXIT_FAILURE;
        }
        tier_client_free(c);
        if (arg_json) {
                JsonWriter w = JSON_WRITER_NULL;

                quota_json(&w, job, &q);
                if (json_print(&w) < 0)
                        return EXIT_FAILURE;
        } else {
                int w = (int) strlen(job);

                quota_print_header(stdout, w < 3 ? 3 : w);
                quota_print_row(stdout, w < 3 ? 3 : w, job, &q);
        }
        return fflush(stdout) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

int verb_quota(int argc, char **argv) {
        if (argc < 2) {
                fprintf(stderr, "tierctl quota: say get or set (try tierctl quota --help)\n");
                return EXIT_USAGE;
        }
        if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
                quota_help(stdout);
                return EXIT_SUCCESS;
        }
        if (strcmp(argv[1], "get") == 0)
                return quota_get(argc - 1, argv + 1);
        if (strcmp(argv[1], "set") == 0)
                return quota_set(argc - 1, argv + 1);
        fprintf(stderr, "tierctl quota: unknown subcommand '%s' (get or set)\n", argv[1]);
        return EXIT_USAGE;
}
