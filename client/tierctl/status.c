/* SPDX-License-Identifier: MIT */
/* status.c: tierctl status (once, or refreshing with --watch) and tierctl jobs. */

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <tier.h>

#include "client/tierctl/tables.h"
#include "client/tierctl/tierctl.h"
#include "util/json.h"
#include "util/size.h"

/* --watch without SEC refreshes this often; SEC may be 0.1 .. 86400. */
#define WATCH_DEFAULT_SEC 2.0
#define WATCH_MIN_SEC 0.1
#define WATCH_MAX_SEC 86400.0

static volatile sig_atomic_t arg_interrupted = 0;

static void on_interrupt(int sig) {
        arg_interrupted = 1;
}

void status_help(FILE *f) {
        fprintf(f,
                "Usage: tierctl status [--json | --prometheus] [--watch [SEC]]\n"
                "\n"
                "Show tierd's tiers, links, NVMe targets and jobs (lingering jobs with the time\n"
                "they have left).  The connection tierctl itself uses is not counted.\n"
                "\n"
                "  --json         one JSON document\n"
                "  --prometheus   the Prometheus text exposition format (as [metrics] textfile)\n"
                "  --watch [SEC]  show it again every SEC seconds (default %g, at least %g) until\n"
                "                 interrupted (Ctrl-C exits 0); on a terminal the screen is\n"
                "                 cleared first, else the outputs are separated by a blank line\n",
                WATCH_DEFAULT_SEC, WATCH_MIN_SEC);
}

/* "2", "0.5": a number of seconds in range; -EINVAL otherwise. */
static int parse_seconds(const char *s, double *ret) {
        char *end;
        double v;

        if (!s || !*s || s[strspn(s, "0123456789.")] != '\0')     /* (no sign, blank, hex, exponent) */
                return -EINVAL;
        errno = 0;
        v = strtod(s, &end);
        if (errno || *end || !isfinite(v) || v < WATCH_MIN_SEC || v > WATCH_MAX_SEC)
                return -EINVAL;
        *ret = v;
        return 0;
}

/* Sleep @sec seconds unless interrupted first. */
static void sleep_interruptible(double sec) {
        struct timespec ts = { .tv_sec = (time_t) sec, .tv_nsec = (long) ((sec - floor(sec)) * 1e9) };

        while (!arg_interrupted && nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
}

int verb_status(int argc, char **argv) {
        enum { ARG_JSON = 0x100, ARG_WATCH, ARG_PROMETHEUS };
        static const struct option options[] = {
                { "json",  no_argument,       NULL, ARG_JSON },
                { "prometheus", no_argument,  NULL, ARG_PROMETHEUS },
                { "watch", optional_argument, NULL, ARG_WATCH },
                { "help",  no_argument,       NULL, 'h' },
                {}
        };
        struct sigaction sa = { .sa_handler = on_interrupt };
        double interval = 0;
        bool watch = false, tty, first = true, prometheus = false;
        tier_client *c = NULL;
        int opt, r, ret = EXIT_SUCCESS;

        optind = 0;
        opterr = 0;
        while ((opt = getopt_long(argc, argv, ":h", options, NULL)) >= 0)
                switch (opt) {
                case ARG_JSON:
                        arg_json = 1;
                        break;
                case ARG_PROMETHEUS:
                        prometheus = true;
                        break;
                case ARG_WATCH:
                        watch = true;
                        interval = WATCH_DEFAULT_SEC;
                        /* "--watch=SEC", or "--watch SEC" when the next word is a number */
                        if (!optarg && optind < argc && parse_seconds(argv[optind], &interval) >= 0)
                                optind++;
                        else if (optarg && parse_seconds(optarg, &interval) < 0) {
                                fprintf(stderr, "tierctl status: --watch takes seconds from %g to %g, not '%s'\n",
                                        WATCH_MIN_SEC, WATCH_MAX_SEC, optarg);
                                return EXIT_USAGE;
                        }
                        break;
                case 'h':
                        status_help(stdout);
                        return EXIT_SUCCESS;
                default:
                        return verb_bad_option("status", opt, argv);
                }
        if (optind < argc) {
                fprintf(stderr, "tierctl status: unexpected argument '%s'%s\n", argv[optind],
                        watch ? " (--watch takes seconds from 0.1 to 86400)" : "");
                return EXIT_USAGE;
        }
        if (prometheus && arg_json) {
                fprintf(stderr, "tierctl status: --json and --prometheus exclude each other\n");
                return EXIT_USAGE;
        }

        if (connect_control(&c) < 0)
                return EXIT_FAILURE;
        if (watch) {
                /* no SA_RESTART: the sleep ends at once */
                sigemptyset(&sa.sa_mask);
                (void) sigaction(SIGINT, &sa, NULL);
                (void) sigaction(SIGTERM, &sa, NULL);
        }
        tty = isatty(STDOUT_FILENO);
        do {
                char *text = NULL;

                if (!first)
                        deadline_start();       /* each refresh gets --timeout (the first: since connecting) */
                r = tier_client_status(c, prometheus ? TIER_STATUS_PROMETHEUS : arg_json ? TIER_STATUS_JSON : TIER_STATUS_TABLE,
                                &text);
                deadline_stop();        /* tierd has answered: writing it out (a full pipe, a pager) is ours */
                if (r < 0) {
                        if (arg_interrupted)
                                break;
                        fprintf(stderr, "tierctl: status failed: %s\n", why(c, r));
                        ret = EXIT_FAILURE;
                        break;
                }
                if (watch && tty)
                        fputs("\033[H\033[2J", stdout);         /* home, clear screen */
                else if (!first)
                        fputc('\n', stdout);
                first = false;
                fputs(text, stdout);
                free(text);
                if (fflush(stdout) != 0) {
                        ret = EXIT_FAILURE;
                        break;
                }
                if (watch)
                        sleep_interruptible(interval);  /* the interval is ours, not tierd's */
        } while (watch && !arg_interrupted);
        disconnect_control(c);
        return ret;
}

/* ---- jobs ----------------------------------------------------------------------------- */

void jobs_help(FILE *f) {
        fprintf(f,
                "Usage: tierctl jobs [--json]\n"
                "\n"
                "One line per job: name, id, owner uid, connections, whether it lingers (no\n"
                "connection left) and for how long still, tensors, bytes used per tier and its\n"
                "weight (share of the links).\n"
                "\n"
                "  --json   one JSON document: {\"jobs\": [...]}\n");
}

static void jobs_json(const struct tier_job_info *jobs, size_t n, JsonWriter *w) {
        json_object_begin(w);
        json_key(w, "jobs");
        json_array_begin(w);
        for (size_t i = 0; i < n; i++) {
                const struct tier_job_info *j = &jobs[i];

                json_object_begin(w);
                json_key(w, "name");
                json_string(w, j->name);
                json_key(w, "id");
                json_uint(w, j->id);
                json_key(w, "uid");
                json_uint(w, j->uid);
                json_key(w, "connections");
                json_uint(w, j->connections);
                json_key(w, "lingering");
                json_bool(w, j->lingering);
                json_key(w, "linger_left_s");
                json_double_fixed(w, j->linger_left_s, 3);
                json_key(w, "tensors");
                json_uint(w, j->tensors);
                json_key(w, "weight");
                json_uint(w, j->weight);
                json_key(w, "usage");
                json_object_begin(w);
                for (int t = 0; t < TIER_LEVEL_MAX; t++) {
                        json_key(w, tier_level_name(t));
                        json_object_begin(w);
                        json_key(w, "used");
                        json_uint(w, j->used[t]);
                        json_key(w, "limit");
                        json_uint(w, j->limit[t]);
                        json_key(w, "pinned");
                        json_uint(w, j->pinned[t]);
                        json_object_end(w);
                }
                json_object_end(w);
                json_object_end(w);
        }
        json_array_end(w);
        json_object_end(w);
}

int verb_jobs(int argc, char **argv) {
        enum { ARG_JSON = 0x100 };
        static const struct option options[] = {
                { "json", no_argument, NULL, ARG_JSON },
                { "help", no_argument, NULL, 'h' },
                {}
        };
        struct tier_job_info *jobs = NULL;
        tier_client *c = NULL;
        size_t n = 0;
        int opt, r;

        optind = 0;
        opterr = 0;
        while ((opt = getopt_long(argc, argv, ":h", options, NULL)) >= 0)
                switch (opt) {
                case ARG_JSON:
                        arg_json = 1;
                        break;
                case 'h':
                        jobs_help(stdout);
                        return EXIT_SUCCESS;
                default:
                        return verb_bad_option("jobs", opt, argv);
                }
        if (optind < argc) {
                fprintf(stderr, "tierctl jobs: unexpected argument '%s' (tierctl tensors JOB lists a job's "
                        "tensors)\n", argv[optind]);
                return EXIT_USAGE;
        }

        if (connect_control(&c) < 0)
                return EXIT_FAILURE;
        r = tier_job_list(c, &jobs, &n);
        if (r < 0) {
                fprintf(stderr, "tierctl: cannot list the jobs: %s\n", why(c, r));
                disconnect_control(c);
                return EXIT_FAILURE;
        }
        disconnect_control(c);
        if (arg_json) {
                JsonWriter w = JSON_WRITER_NULL;

                jobs_json(jobs, n, &w);
                r = json_print(&w);
        } else
                jobs_table(stdout, jobs, n);
        free(jobs);
        if (r < 0 || fflush(stdout) != 0)
                return EXIT_FAILURE;
        return EXIT_SUCCESS;
}
