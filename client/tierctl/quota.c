/* SPDX-License-Identifier: MIT */
/* quota.c: tierctl quota get|set: the quotas of job names, uids, groups and the default. */

#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <inttypes.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tier.h>

#include "client/tierctl/tables.h"
#include "client/tierctl/tierctl.h"
#include "util/escape.h"
#include "util/json.h"
#include "util/size.h"

/* ---- quota ------------------------------------------------------------------------------- */

/*
 * The names of the jobs tierd has now, NULL-terminated, each exactly as tierd
 * holds it (tier_job_list(): the status's bytes, not its JSON text, which
 * could not give back a name with C1 controls or bytes that are not UTF-8
 * from a tierd older than its name checks: such a job went unlisted).
 */
static int list_jobs(tier_client *c, char ***ret) {
        struct tier_job_info *jobs = NULL;
        char **names;
        size_t n = 0;
        int r;

        r = tier_job_list(c, &jobs, &n);
        if (r < 0)
                return r;
        names = calloc(n + 1, sizeof(char *));
        for (size_t i = 0; names && i < n; i++)
                if (!(names[i] = strdup(jobs[i].name))) {
                        for (size_t k = 0; k < i; k++)
                                free(names[k]);
                        free(names);
                        names = NULL;
                }
        free(jobs);
        if (!names)
                return -ENOMEM;
        *ret = names;
        return 0;
}

/* Whom a quota request is about: a job name, a uid, a group or the default. */
typedef struct QuotaTarget {
        int kind;               /* TIER_QUOTA_* */
        uint32_t id;
        const char *job;        /* TIER_QUOTA_JOB */
} QuotaTarget;

/*
 * One quota as {"job":NAME,"vram":BYTES,"host":BYTES,"nvme":BYTES,"weight":N,
 * "vram_min":BYTES,...,"from":{"vram":"uid 1000",...}} ("uid":N, "group":N or
 * "default":true instead of "job" for those targets).
 */
static void quota_json(JsonWriter *w, const QuotaTarget *t, const struct tier_quota *q,
                       const struct tier_quota_total *tot) {
        json_object_begin(w);
        switch (t->kind) {
        case TIER_QUOTA_JOB:
                json_key(w, "job");
                json_string(w, t->job);
                json_key(w, "running");
                json_bool(w, q->running);
                break;
        case TIER_QUOTA_UID:
        case TIER_QUOTA_GROUP:
                json_key(w, t->kind == TIER_QUOTA_UID ? "uid" : "group");
                json_uint(w, t->id);
                break;
        default:
                json_key(w, "default");
                json_bool(w, true);
                break;
        }
        for (int i = 0; i < TIER_LEVEL_MAX; i++) {
                char key[32];

                json_key(w, tier_level_name(i));
                json_uint(w, q->max[i]);
                (void) snprintf(key, sizeof(key), "%s_min", tier_level_name(i));
                json_key(w, key);
                json_uint(w, q->min[i]);
        }
        json_key(w, "weight");
        json_uint(w, q->weight);
        json_key(w, "from");
        json_object_begin(w);
        for (int i = 0; i < TIER_LEVEL_MAX; i++) {
                char key[32];

                json_key(w, tier_level_name(i));
                json_string(w, q->max_from[i]);
                (void) snprintf(key, sizeof(key), "%s_min", tier_level_name(i));
                json_key(w, key);
                json_string(w, q->min_from[i]);
        }
        json_key(w, "weight");
        json_string(w, q->weight_from);
        json_object_end(w);
        if (q->warning[0]) {
                json_key(w, "warning");
                json_string(w, q->warning);
        }
        if (tot) {
                json_key(w, "totals");
                json_object_begin(w);
                for (int i = 0; i < TIER_LEVEL_MAX; i++) {
                        json_key(w, tier_level_name(i));
                        json_object_begin(w);
                        json_key(w, "total");
                        json_uint(w, tot->total[i]);
                        json_key(w, "used");
                        json_uint(w, tot->used[i]);
                        json_key(w, "from");
                        json_string(w, tot->from[i]);
                        json_object_end(w);
                }
                json_object_end(w);
        }
        json_object_end(w);
}

/* One target's quota, each value with where it comes from. */
static void quota_print(FILE *f, const QuotaTarget *t, const struct tier_quota *q,
                        const struct tier_quota_total *tot) {
        switch (t->kind) {
        case TIER_QUOTA_JOB:
                fputs("job '", f);
                text_escape_fputs(t->job, f, 0);
                fprintf(f, "'%s\n", q->running ? " (running)" : " (not running: its name's quota)");
                break;
        case TIER_QUOTA_UID:
                fprintf(f, "uid %" PRIu32 " (a job of this uid, group quotas aside)\n", t->id);
                break;
        case TIER_QUOTA_GROUP:
                fprintf(f, "group %" PRIu32 " (a job of a member)\n", t->id);
                break;
        default:
                fprintf(f, "default\n");
                break;
        }
        for (int i = 0; i < TIER_LEVEL_MAX; i++) {
                /* (where a value comes from may name a job: "job NAME") */
                fprintf(f, "  %-6s max %s (from: ", tier_level_name(i), FORMAT_SIZE(q->max[i]));
                text_escape_fputs(q->max_from[i], f, 0);
                fprintf(f, "), min %s (from: ", FORMAT_SIZE(q->min[i]));
                text_escape_fputs(q->min_from[i], f, 0);
                fputs(")\n", f);
        }
        fprintf(f, "  weight %u (from: ", q->weight);
        text_escape_fputs(q->weight_from, f, 0);
        fputs(")\n", f);
        for (int i = 0; tot && i < TIER_LEVEL_MAX; i++) {
                if (tot->total[i] == 0)
                        fprintf(f, "  %-6s total: none (from: %s), its jobs use %s\n", tier_level_name(i), tot->from[i],
                                FORMAT_SIZE(tot->used[i]));
                else
                        fprintf(f, "  %-6s total %s for all its jobs (from: %s), they use %s\n", tier_level_name(i),
                                FORMAT_SIZE(tot->total[i]), tot->from[i], FORMAT_SIZE(tot->used[i]));
        }
}

void quota_help(FILE *f) {
        fprintf(f,
                "Usage: tierctl quota get [--json] [JOB | --uid UID | --user NAME | --group GROUP | --default]\n"
                "       tierctl quota set JOB|--uid UID|--user NAME|--group GROUP [--host SIZE] [--host-min SIZE]\n"
                "                         [--vram SIZE] [--vram-min SIZE] [--nvme SIZE] [--nvme-min SIZE]\n"
                "                         [--weight N] [--host-total SIZE] [--vram-total SIZE]\n"
                "                         [--nvme-total SIZE] [--clear] [--json]\n"
                "\n"
                "Show the quota of a job name, a uid, a group or the default (of every job without\n"
                "one), each value with where it comes from; or set it.  A job's quota resolves field\n"
                "by field: its name's quota, else its uid's, else its group's, else the default\n"
                "(tierd.conf's job_limit and default_weight, no minimum).  --host etc. set a tier's\n"
                "maximum, --host-min etc. its guaranteed minimum (0 for none).  A quota set on a job\n"
                "name holds before the job starts and for every later run of that name; tierd keeps\n"
                "what is set across restarts.  --clear drops what was set for the target with\n"
                "tierctl first (tierd.conf's [quota] stays).  SIZE is bytes with an optional K, M,\n"
                "G, T, P or E suffix (powers of 1024, either case, B or iB may follow: 8G = 8GiB);\n"
                "N is 1..1000.  Options not given keep their value.  Setting needs root or group\n"
                "tier-admin; anyone may read their own jobs', uid's and groups' quotas.\n"
                "A uid's or group's --host-total etc. bound all its jobs together (lingering ones\n"
                "too; 0: none); a uid without one gets tierd.conf's uid_share of each tier unless\n"
                "its jobs' creator is root or in tier-admin.  quota get --uid/--group shows them\n"
                "and what the jobs use now.\n");
}

/* Parse a uid or gid: a number, or a name looked up with @lookup ("user", "group"). */
static int parse_target_id(const char *cmd, const char *opt, const char *arg, bool group, uint32_t *ret) {
        char *end;
        unsigned long long v;

        errno = 0;
        v = strtoull(arg, &end, 10);
        if (arg[0] >= '0' && arg[0] <= '9' && !*end && !errno && v < UINT32_MAX) {
                *ret = (uint32_t) v;
                return 0;
        }
        if (arg[0] >= '0' && arg[0] <= '9' && !*end) {
                /* 4294967295 is (uid_t) -1, no one's id */
                fprintf(stderr, "tierctl %s: --%s %s is out of range: an id is 0 to 4294967294\n", cmd, opt, arg);
                return -EINVAL;
        }
        if (strcmp(opt, "uid") == 0) {
                fprintf(stderr, "tierctl %s: --uid must be a number, not '%s' (use --user NAME)\n", cmd, arg);
                return -EINVAL;
        }
        if (group) {
                struct group *g = getgrnam(arg);

                if (g) {
                        *ret = (uint32_t) g->gr_gid;
                        return 0;
                }
                fprintf(stderr, "tierctl %s: no group '%s'\n", cmd, arg);
        } else {
                struct passwd *pw = getpwnam(arg);

                if (pw) {
                        *ret = (uint32_t) pw->pw_uid;
                        return 0;
                }
                fprintf(stderr, "tierctl %s: no user '%s'\n", cmd, arg);
        }
        return -EINVAL;
}

/* Set @t from a target option; a second target is a usage error. */
static int set_target(const char *cmd, QuotaTarget *t, bool *have, int kind, const char *opt, const char *arg) {
        if (*have) {
                fprintf(stderr, "tierctl %s: name one target (JOB, --uid, --user, --group%s)\n", cmd,
                        strcmp(cmd, "quota get") == 0 ? " or --default" : "");
                return -EINVAL;
        }
        *have = true;
        t->kind = kind;
        if (kind == TIER_QUOTA_UID || kind == TIER_QUOTA_GROUP)
                return parse_target_id(cmd, opt, arg, kind == TIER_QUOTA_GROUP, &t->id);
        return 0;
}

static const char *target_name(const QuotaTarget *t, char *buf, size_t size) {
        if (t->kind == TIER_QUOTA_JOB)
                (void) snprintf(buf, size, "job '%s'", t->job);
        else if (t->kind == TIER_QUOTA_DEFAULT)
                (void) snprintf(buf, size, "the default");
        else
                (void) snprintf(buf, size, "%s %" PRIu32, t->kind == TIER_QUOTA_UID ? "uid" : "group", t->id);
        return buf;
}

/* Print one target's quota as text or JSON. */
static int quota_show(const QuotaTarget *t, const struct tier_quota *q, const struct tier_quota_total *tot) {
        if (arg_json) {
                JsonWriter w = JSON_WRITER_NULL;

                quota_json(&w, t, q, tot);
                if (json_print(&w) < 0)
                        return EXIT_FAILURE;
        } else
                quota_print(stdout, t, q, tot);
        return EXIT_SUCCESS;
}

/* Every job's quota (those tierd lets this user read; how many others there are, it says). */
static int quota_get_all(tier_client *c) {
        JsonWriter jw = JSON_WRITER_NULL;
        char **names = NULL;
        struct tier_quota *qs;
        size_t n = 0, others = 0, w;
        int r, ret = EXIT_SUCCESS;
        bool first = true;

        r = list_jobs(c, &names);
        if (r < 0) {
                fprintf(stderr, "tierctl: cannot list the jobs: %s\n", why(c, r));
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
                return EXIT_FAILURE;
        }
        for (size_t i = 0; i < n; i++) {
                r = tier_quota_get(c, TIER_QUOTA_JOB, 0, names[i], &qs[i]);
                if (r == -ENOENT || r == -EPERM) {      /* gone since the listing, or another user's */
                        others += r == -EPERM;
                        free(names[i]);
                        names[i] = NULL;
                        continue;
                }
                if (r < 0) {
                        fputs("tierctl: cannot get the quota of job '", stderr);
                        text_escape_fputs(names[i], stderr, 0);
                        fprintf(stderr, "': %s\n", why(c, r));
                        ret = EXIT_FAILURE;
                        free(names[i]);
                        names[i] = NULL;
                        continue;
                }
        }
        w = quota_name_width(names, n);
        if (arg_json) {
                json_object_begin(&jw);
                json_key(&jw, "jobs");
                json_array_begin(&jw);
        }
        for (size_t i = 0; i < n; i++) {
                QuotaTarget t = { .kind = TIER_QUOTA_JOB, .job = names[i] };

                if (!names[i])
                        continue;
                if (arg_json)
                        quota_json(&jw, &t, &qs[i], NULL);
                else {
                        if (first)
                                quota_print_header(stdout, w);
                        quota_print_row(stdout, w, names[i], &qs[i]);
                }
                first = false;
        }
        if (arg_json) {
                json_array_end(&jw);
                json_key(&jw, "not_shown");
                json_uint(&jw, others);
                json_object_end(&jw);
                if (json_print(&jw) < 0)
                        ret = EXIT_FAILURE;
        } else if (others > 0)
                printf("%s%zu job(s) of other users not shown (needs root or group tier-admin)\n",
                       first ? "" : "\n", others);
        else if (first && ret == EXIT_SUCCESS)
                puts("no jobs");
        for (size_t i = 0; i < n; i++)
                free(names[i]);
        free(names);
        free(qs);
        return ret;
}

static int quota_get(int argc, char **argv) {
        enum { ARG_JSON = 0x100, ARG_UID, ARG_USER, ARG_GROUP, ARG_DEFAULT };
        static const struct option options[] = {
                { "json",    no_argument,       NULL, ARG_JSON },
                { "uid",     required_argument, NULL, ARG_UID },
                { "user",    required_argument, NULL, ARG_USER },
                { "group",   required_argument, NULL, ARG_GROUP },
                { "default", no_argument,       NULL, ARG_DEFAULT },
                { "help",    no_argument,       NULL, 'h' },
                {}
        };
        QuotaTarget t = { .kind = TIER_QUOTA_JOB };
        struct tier_quota_total tot;
        struct tier_quota q;
        tier_client *c = NULL;
        bool have = false;
        char name[300];
        int opt, r, ret;

        optind = 0;
        opterr = 0;
        while ((opt = getopt_long(argc, argv, ":h", options, NULL)) >= 0)
                switch (opt) {
                case ARG_JSON:
                        arg_json = 1;
                        break;
                case ARG_UID:
                case ARG_USER:
                case ARG_GROUP:
                case ARG_DEFAULT:
                        if (set_target("quota get", &t, &have, opt == ARG_GROUP ? TIER_QUOTA_GROUP :
                                       opt == ARG_DEFAULT ? TIER_QUOTA_DEFAULT : TIER_QUOTA_UID,
                                       opt == ARG_UID ? "uid" : opt == ARG_USER ? "user" : "group", optarg) < 0)
                                return EXIT_USAGE;
                        break;
                case 'h':
                        quota_help(stdout);
                        return EXIT_SUCCESS;
                default:
                        return verb_bad_option("quota get", opt, argv);
                }
        if (optind < argc) {
                t.job = argv[optind++];
                if (set_target("quota get", &t, &have, TIER_QUOTA_JOB, "", NULL) < 0)
                        return EXIT_USAGE;
        }
        if (optind < argc) {
                fprintf(stderr, "tierctl quota get: unexpected argument '%s'\n", argv[optind]);
                return EXIT_USAGE;
        }
        if (t.job && check_job_name("quota get", t.job) != 0)
                return EXIT_USAGE;

        if (connect_control(&c) < 0)
                return EXIT_FAILURE;
        if (!have) {
                ret = quota_get_all(c);
                disconnect_control(c);
                return fflush(stdout) == 0 ? ret : EXIT_FAILURE;
        }
        r = tier_quota_get(c, t.kind, t.id, t.job, &q);
        if (r >= 0 && (t.kind == TIER_QUOTA_UID || t.kind == TIER_QUOTA_GROUP))
                r = tier_quota_total_get(c, t.kind, t.id, &tot);
        if (r < 0) {
                fprintf(stderr, "tierctl: cannot get the quota of %s: %s\n", target_name(&t, name, sizeof(name)),
                        why(c, r));
                disconnect_control(c);
                return EXIT_FAILURE;
        }
        disconnect_control(c);
        ret = quota_show(&t, &q, t.kind == TIER_QUOTA_UID || t.kind == TIER_QUOTA_GROUP ? &tot : NULL);
        return fflush(stdout) == 0 ? ret : EXIT_FAILURE;
}

static int quota_set(int argc, char **argv) {
        enum {
                ARG_VRAM = 0x100, ARG_HOST, ARG_NVME, ARG_VRAM_MIN, ARG_HOST_MIN, ARG_NVME_MIN,
                ARG_WEIGHT, ARG_JSON, ARG_UID, ARG_USER, ARG_GROUP, ARG_CLEAR,
                ARG_VRAM_TOTAL, ARG_HOST_TOTAL, ARG_NVME_TOTAL,
        };
        static const struct option options[] = {
                { "vram",     required_argument, NULL, ARG_VRAM },
                { "host",     required_argument, NULL, ARG_HOST },
                { "nvme",     required_argument, NULL, ARG_NVME },
                { "vram-min", required_argument, NULL, ARG_VRAM_MIN },
                { "host-min", required_argument, NULL, ARG_HOST_MIN },
                { "nvme-min", required_argument, NULL, ARG_NVME_MIN },
                { "weight",   required_argument, NULL, ARG_WEIGHT },
                { "uid",      required_argument, NULL, ARG_UID },
                { "user",     required_argument, NULL, ARG_USER },
                { "group",    required_argument, NULL, ARG_GROUP },
                { "clear",    no_argument,       NULL, ARG_CLEAR },
                { "vram-total", required_argument, NULL, ARG_VRAM_TOTAL },
                { "host-total", required_argument, NULL, ARG_HOST_TOTAL },
                { "nvme-total", required_argument, NULL, ARG_NVME_TOTAL },
                { "json",     no_argument,       NULL, ARG_JSON },
                { "help",     no_argument,       NULL, 'h' },
                {}
        };
        QuotaTarget t = { .kind = TIER_QUOTA_JOB };
        struct tier_quota q = {}, now;
        struct tier_quota_total tot_now;
        uint64_t totals[TIER_LEVEL_SLOTS] = {};
        unsigned total_set = 0;
        tier_client *c = NULL;
        bool any = false, have = false;
        char name[300];
        int opt, r, ret;

        optind = 0;
        opterr = 0;
        while ((opt = getopt_long(argc, argv, ":h", options, NULL)) >= 0) {
                int tier = -1;
                bool min = false;

                switch (opt) {
                case ARG_VRAM:
                case ARG_HOST:
                case ARG_NVME:
                        tier = opt - ARG_VRAM;          /* TIER_VRAM, TIER_HOST, TIER_NVME */
                        break;
                case ARG_VRAM_MIN:
                case ARG_HOST_MIN:
                case ARG_NVME_MIN:
                        tier = opt - ARG_VRAM_MIN;
                        min = true;
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
                case ARG_UID:
                case ARG_USER:
                case ARG_GROUP:
                        if (set_target("quota set", &t, &have, opt == ARG_GROUP ? TIER_QUOTA_GROUP : TIER_QUOTA_UID,
                                       opt == ARG_UID ? "uid" : opt == ARG_USER ? "user" : "group", optarg) < 0)
                                return EXIT_USAGE;
                        continue;
                case ARG_CLEAR:
                        q.clear = 1;
                        continue;
                case ARG_VRAM_TOTAL:
                case ARG_HOST_TOTAL:
                case ARG_NVME_TOTAL:
                        tier = opt - ARG_VRAM_TOTAL;
                        if (size_parse(optarg, &totals[tier]) < 0) {
                                fprintf(stderr, "tierctl quota set: --%s-total must be a size like 512M or 8G "
                                        "(0 for none), not '%s'\n", tier_level_name(tier), optarg);
                                return EXIT_USAGE;
                        }
                        total_set |= 1u << tier;
                        continue;
                case ARG_JSON:
                        arg_json = 1;
                        continue;
                case 'h':
                        quota_help(stdout);
                        return EXIT_SUCCESS;
                default:
                        return verb_bad_option("quota set", opt, argv);
                }
                r = size_parse(optarg, min ? &q.min[tier] : &q.max[tier]);
                if (r < 0 || (!min && q.max[tier] == 0)) {
                        fprintf(stderr, "tierctl quota set: --%s%s must be a %s like 512M, 8G or 1T, not '%s'\n",
                                tier_level_name(tier), min ? "-min" : "",
                                r == -ERANGE ? "size below 16 EiB" : min ? "size" : "positive size", optarg);
                        return EXIT_USAGE;
                }
                if (min)
                        q.min_set |= 1u << tier;
                any = true;
        }
        if (optind < argc) {
                t.job = argv[optind++];
                if (set_target("quota set", &t, &have, TIER_QUOTA_JOB, "", NULL) < 0)
                        return EXIT_USAGE;
        }
        if (!have) {
                fprintf(stderr, "tierctl quota set: no target given (tierctl quota set JOB|--uid UID|--user NAME|"
                        "--group GROUP [--host SIZE] [--host-min SIZE] ... [--weight N])\n");
                return EXIT_USAGE;
        }
        if (optind < argc) {
                fprintf(stderr, "tierctl quota set: unexpected argument '%s'\n", argv[optind]);
                return EXIT_USAGE;
        }
        if (t.job && check_job_name("quota set", t.job) != 0)
                return EXIT_USAGE;
        if (!any && !q.clear && !total_set) {
                fprintf(stderr, "tierctl quota set: nothing to set (give --host, --host-min, --vram, --vram-min, "
                        "--nvme, --nvme-min, --weight, --host-total, --vram-total, --nvme-total or --clear)\n");
                return EXIT_USAGE;
        }
        if (total_set && t.kind != TIER_QUOTA_UID && t.kind != TIER_QUOTA_GROUP) {
                fprintf(stderr, "tierctl quota set: --host-total etc. are the total of a uid's or a group's jobs "
                        "together (--uid, --user, --group); a job name has --host etc.\n");
                return EXIT_USAGE;
        }

        if (connect_control(&c) < 0)
                return EXIT_FAILURE;
        /* the fields of each job first (and --clear), then the totals: what the second finds is the first's result */
        if (any || q.clear)
                r = tier_quota_set(c, t.kind, t.id, t.job, &q, &now);
        else
                r = tier_quota_get(c, t.kind, t.id, t.job, &now);
        if (r >= 0 && total_set)
                r = tier_quota_total_set(c, t.kind, t.id, totals, total_set, &tot_now);
        else if (r >= 0 && (t.kind == TIER_QUOTA_UID || t.kind == TIER_QUOTA_GROUP))
                r = tier_quota_total_get(c, t.kind, t.id, &tot_now);
        if (r < 0) {
                fprintf(stderr, "tierctl: cannot set the quota of %s: %s\n", target_name(&t, name, sizeof(name)),
                        why(c, r));
                disconnect_control(c);
                return EXIT_FAILURE;
        }
        disconnect_control(c);
        if (now.warning[0]) {
                fputs("tierctl: warning: ", stderr);
                text_escape_fputs(now.warning, stderr, 0);      /* (tierd's: it may quote a name) */
                fputc('\n', stderr);
        }
        ret = quota_show(&t, &now, t.kind == TIER_QUOTA_UID || t.kind == TIER_QUOTA_GROUP ? &tot_now : NULL);
        return fflush(stdout) == 0 ? ret : EXIT_FAILURE;
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
