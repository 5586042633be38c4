/* SPDX-License-Identifier: MIT */
/* tierctl.h: what tierctl's verbs share: global options, the connection, errors, JSON output. */
#pragma once

#include <stdio.h>

#include <tier.h>

#include "util/json.h"

#define EXIT_USAGE 2
/* tierd did not answer within --timeout: it is stopped, wedged or overloaded */
#define EXIT_TIMEOUT 3
/* --timeout's default; see deadline_start() */
#define TIMEOUT_DEFAULT_SEC 30.0
#define TIMEOUT_MAX_SEC 86400.0

/* Global options (before the verb); a verb's own --json sets arg_json too. */
extern const char *arg_socket;
extern int arg_json;
/* --timeout SECONDS (0: no limit), and whether it was given (evict waits without one) */
extern double arg_timeout;
extern int arg_timeout_given;

/* One verb: its function gets argv[0] = the verb's name; @help prints its usage. */
typedef struct Verb {
        const char *name;
        int (*fn)(int argc, char **argv);
        void (*help)(FILE *f);
        const char *summary;
} Verb;

/*
 * Open a control connection (no job), or say why not on stderr.  Starts the
 * deadline (deadline_start()): it runs until disconnect_control().
 */
int connect_control(tier_client **ret);
/* Close @c (may be NULL) and stop the deadline; NULL. */
tier_client *disconnect_control(tier_client *c);
/*
 * The deadline for tierd's answers: from deadline_start() on, tierctl waits
 * --timeout seconds for tierd (connecting, its Hello, the requests) before it
 * says so, naming the socket and the seconds, and exits EXIT_TIMEOUT (from a
 * SIGALRM handler: libtier waits in poll() without a limit).  A verb that
 * waits on purpose (status --watch between refreshes, trace while it
 * records, bench while it measures) stops it first and starts it again.
 * deadline_unlink(): a file to remove should the deadline pass (NULL: none).
 */
void deadline_start(void);
void deadline_stop(void);
void deadline_unlink(const char *path);
/*
 * Reason of the last failure on @c: tierd's when it gave one, escaped
 * (util/escape.c: it may quote a name); in a buffer the next call reuses.
 */
const char *why(const tier_client *c, int r);
/* Print the document in @w and a newline; the writer is emptied either way. */
int json_print(JsonWriter *w);
/*
 * getopt_long() with opterr = 0 found a problem at argv[optind - 1]: say
 * so (naming "tierctl @verb --help") and return EXIT_USAGE.
 */
int verb_bad_option(const char *verb, int opt, char **argv);
/*
 * Could @name be a job's (as libtier and tierd check names: 1 to
 * TIERCTL_NAME_MAX bytes of UTF-8 without control or bidirectional format
 * characters: proto/utf8.h utf8_name_flaw())?  0, or
 * EXIT_USAGE after saying why on stderr, naming "tierctl @verb".
 */
int check_job_name(const char *verb, const char *name);
/* The largest [limits] max_name tierd takes: no job has a longer name. */
#define TIERCTL_NAME_MAX 4096

/* status.c */
int verb_status(int argc, char **argv);
void status_help(FILE *f);
int verb_jobs(int argc, char **argv);
void jobs_help(FILE *f);

/* job.c */
int verb_tensors(int argc, char **argv);
void tensors_help(FILE *f);
int verb_evict(int argc, char **argv);
void evict_help(FILE *f);
int verb_detach(int argc, char **argv);
void detach_help(FILE *f);

/* quota.c */
int verb_quota(int argc, char **argv);
void quota_help(FILE *f);

/* plan.c (no tierd needed) */
int verb_plan(int argc, char **argv);
void plan_help(FILE *f);

/* trace.c */
int verb_trace(int argc, char **argv);
void trace_help(FILE *f);

/* bench.c (tierd only for its targets' paths) */
int verb_bench(int argc, char **argv);
void bench_help(FILE *f);
