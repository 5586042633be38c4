/* SPDX-License-Identifier: MIT */
/* tierctl: command-line control of tierd, built on libtier only (and util/ for sizes and JSON). */

/*
 * Every command is one row of the verb table below: adding a command is a
 * function, its help and one line.  Global options come before the verb;
 * each verb parses its own arguments, and every verb takes --help and
 * --json (one JSON document on stdout).  Exit status: 0 ok, 1 failure
 * (tierd refused or could not be reached), 2 bad usage, 3 tierd did not
 * answer within --timeout (deadline_start()).  The verbs live in
 * status.c (status, jobs), job.c (tensors, evict, detach), quota.c and
 * plan.c (no tierd: the arithmetic of planner.c).
 */

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include <tier.h>

#include "client/tierctl/tables.h"
#include "client/tierctl/tierctl.h"
#include "proto/macro.h"
#include "proto/utf8.h"
#include "util/escape.h"
#include "util/json.h"

#ifndef TIERD_VERSION
#define TIERD_VERSION "unknown"
#endif
#ifndef TIERD_DEFAULT_SOCKET
#define TIERD_DEFAULT_SOCKET "/run/tierd/tierd.sock"
#endif

const char *arg_socket = NULL;
int arg_json = 0;
double arg_timeout = TIMEOUT_DEFAULT_SEC;
int arg_timeout_given = 0;

static int verb_help(int argc, char **argv);
static void help_help(FILE *f);

static const Verb verbs[] = {
        { "status",  verb_status,  status_help,  "show tiers, links, NVMe targets and jobs (--watch: refresh)" },
        { "jobs",    verb_jobs,    jobs_help,    "list the jobs: owner, connections, linger, usage, weight" },
        { "tensors", verb_tensors, tensors_help, "list a job's tensors: where each copy is, pins, dirty, last use" },
        { "evict",   verb_evict,   evict_help,   "write a job's unpinned copies down to nvme (or host)" },
        { "detach",  verb_detach,  detach_help,  "end a job now: close its connections, free everything" },
        { "quota",   verb_quota,   quota_help,   "show (get) or change (set) the quotas of jobs, uids and groups" },
        { "plan",    verb_plan,    plan_help,    "predict placement, traffic and step time of a training job" },
        { "trace",   verb_trace,   trace_help,   "record transfers, phases, stalls, decisions as Chrome trace JSON" },
        { "bench",   verb_bench,   bench_help,   "measure the storage under the NVMe targets: bs x qd sweep, fio, cliff" },
        { "help",    verb_help,    help_help,    "show this help, or a command's (help COMMAND)" },
};

static const Verb *verb_find(const char *name) {
        for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++)
                if (strcmp(name, verbs[i].name) == 0)
                        return &verbs[i];
        return NULL;
}

static void help(FILE *f) {
        const char *env = getenv("TIER_SOCKET");

        fprintf(f,
                "Usage: tierctl [OPTIONS] COMMAND [ARGS]\n"
                "\n"
                "Control tierd, the GPU/host/NVMe memory tier daemon.\n"
                "\n"
                "Options:\n"
                "  --socket PATH   talk to tierd at PATH (default: $TIER_SOCKET, else %s)\n"
                "  --timeout SEC   give up when tierd has not answered within SEC seconds (exit 3);\n"
                "                  default %g, 0 waits for ever; evict waits for its write-down\n"
                "                  without a limit unless --timeout is given\n"
                "  --json          print one JSON document (every command but help takes --json too)\n"
                "  -h, --help      show this help\n"
                "      --version   show the version\n"
                "\n"
                "$TIER_SOCKET is %s%s%s.\n"
                "\n"
                "Commands:\n", TIERD_DEFAULT_SOCKET, TIMEOUT_DEFAULT_SEC, env && *env ? "'" : "", env && *env ? env : "not set",
                env && *env ? "'" : "");
        for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++)
                fprintf(f, "  %-8s  %s\n", verbs[i].name, verbs[i].summary);
        fprintf(f,
                "\n"
                "tierctl COMMAND --help (or tierctl help COMMAND) shows a command's options.\n"
                "Exit status: 0 ok, 1 failure (tierd refused or is unreachable), 2 bad usage,\n"
                "3 tierd did not answer within --timeout.\n");
}

static void help_help(FILE *f) {
        fprintf(f,
                "Usage: tierctl help [COMMAND]\n"
                "\n"
                "Show tierctl's help, or that of COMMAND.\n");
}

static int verb_help(int argc, char **argv) {
        const Verb *v;

        if (argc < 2) {
                help(stdout);
                return EXIT_SUCCESS;
        }
        if (argc > 2) {
                fprintf(stderr, "tierctl help: unexpected argument '%s' (tierctl help COMMAND)\n", argv[2]);
                return EXIT_USAGE;
        }
        if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
                help_help(stdout);
                return EXIT_SUCCESS;
        }
        v = verb_find(argv[1]);
        if (!v && argv[1][0] == '-') {
                fprintf(stderr, "tierctl help: takes no option but --help, not '%s' (its text is not JSON; "
                        "tierctl help COMMAND)\n", argv[1]);
                return EXIT_USAGE;
        }
        if (!v) {
                fprintf(stderr, "tierctl help: unknown command '%s' (try tierctl --help)\n", argv[1]);
                return EXIT_USAGE;
        }
        v->help(stdout);
        return EXIT_SUCCESS;
}

/* ---- the deadline ----------------------------------------------------------------------- */

/* What the SIGALRM handler writes and removes: made before the timer runs (the handler only writes). */
static char deadline_text[512];
static size_t deadline_len;
static const char *volatile deadline_path;

static void on_deadline(int sig) {
        const char *path = deadline_path;

        (void) sig;
        if (path)
                (void) unlink(path);
        (void) !write(STDERR_FILENO, deadline_text, deadline_len);
        _exit(EXIT_TIMEOUT);
}

void deadline_unlink(const char *path) {
        deadline_path = path;
}

void deadline_start(void) {
        const char *socket = arg_socket;
        struct sigaction sa = { .sa_handler = on_deadline };
        struct itimerval it = {};
        int n;

        if (arg_timeout <= 0)
                return;
        if (!socket || !*socket)
                socket = getenv("TIER_SOCKET");
        if (!socket || !*socket)
                socket = TIERD_DEFAULT_SOCKET;
        n = snprintf(deadline_text, sizeof(deadline_text), "tierctl: tierd at %s did not answer within %g s: "
                     "it may be stopped or wedged (--timeout SEC waits longer, --timeout 0 for ever); a change "
                     "asked of it (quota set, detach, evict) may have been made all the same: see tierctl "
                     "status or quota get\n",
                     socket, arg_timeout);
        deadline_len = n < 0 ? 0 : MIN((size_t) n, sizeof(deadline_text) - 1);
        if (n >= (int) sizeof(deadline_text))
                deadline_text[deadline_len - 1] = '\n';        /* a very long path: cut short, still a line */
        sigemptyset(&sa.sa_mask);
        (void) sigaction(SIGALRM, &sa, NULL);
        it.it_value.tv_sec = (time_t) arg_timeout;
        it.it_value.tv_usec = (suseconds_t) ((arg_timeout - floor(arg_timeout)) * 1e6);
        if (it.it_value.tv_sec == 0 && it.it_value.tv_usec == 0)
                it.it_value.tv_usec = 1;        /* (0 would disarm it) */
        (void) setitimer(ITIMER_REAL, &it, NULL);
}

void deadline_stop(void) {
        struct itimerval it = {};

        (void) setitimer(ITIMER_REAL, &it, NULL);
}

/* "30", "0.5", "0": seconds for --timeout, 0 .. TIMEOUT_MAX_SEC; -EINVAL otherwise. */
static int parse_timeout(const char *s, double *ret) {
        char *end;
        double v;

        if (!s || !*s || s[strspn(s, "0123456789.")] != '\0')     /* (no sign, blank, hex, exponent) */
                return -EINVAL;
        errno = 0;
        v = strtod(s, &end);
        if (errno || *end || end == s || !isfinite(v) || v < 0 || v > TIMEOUT_MAX_SEC)
                return -EINVAL;
        *ret = v;
        return 0;
}

int connect_control(tier_client **ret) {
        int r;

        deadline_start();
        r = tier_client_new(arg_socket, NULL, 0, ret);
        if (r < 0) {
                const char *w = tier_client_last_error(NULL);
                deadline_stop();
                fprintf(stderr, "tierctl: %s\n", w && *w ? w : tier_strerror(r));
                return r;
        }
        return 0;
}

tier_client *disconnect_control(tier_client *c) {
        tier_client_free(c);
        deadline_stop();
        return NULL;
}

const char *why(const tier_client *c, int r) {
        /* escaped: tierd's reasons may quote a name (CLIENT_ERROR_MAX is 512, each byte at most 6) */
        static char buf[512 * TEXT_ESCAPE_GROWTH + 1];

        return reason_text(buf, sizeof(buf), c ? tier_client_last_error(c) : NULL, r);
}

int json_print(JsonWriter *w) {
        char *text = NULL;
        int r;

        r = json_writer_finish(w, &text, NULL);
        json_writer_deinit(w);
        if (r < 0) {
                fprintf(stderr, "tierctl: cannot write JSON: %s\n", tier_strerror(r));
                return r;
        }
        puts(text);
        free(text);
        return 0;
}

int verb_bad_option(const char *verb, int opt, char **argv) {
        const char *arg = argv[optind - 1];

        if (opt == ':')
                fprintf(stderr, "tierctl %s: option '%s' needs an argument\n", verb, arg);
        else
                fprintf(stderr, "tierctl %s: unknown option '%s' (try tierctl %s --help)\n", verb, arg, verb);
        return EXIT_USAGE;
}

/* The longest escaped job name check_job_name() says (libtier's NAME_REFUSAL_SAY). */
#define NAME_SAY_MAX 256

int check_job_name(const char *verb, const char *name) {
        size_t len = strlen(name);
        char flaw[UTF8_NAME_FLAW_MAX];
        const char *why = NULL;

        if (len == 0)
                why = "is empty";
        else if (len > TIERCTL_NAME_MAX)
                why = "is too long";
        else
                why = utf8_name_flaw(name, len, flaw);  /* (the words of tierd and libtier) */
        if (!why)
                return 0;
        fprintf(stderr, "tierctl %s: the job name %s (a job name is UTF-8 text without control or bidirectional "
                "format characters, 1 to %d bytes)", verb, why, TIERCTL_NAME_MAX);
        if (len <= TIERCTL_NAME_MAX) {
                /*
                 * Not the name itself (it may be anything) but its escaped text, as tierd's refusal says
                 * it (rpc.c check_name()): the name a job an older tierd made under it was restored under,
                 * if not cut with a hash for tierd's max_name (which tierctl does not know).  Bounded:
                 * one longer than NAME_SAY_MAX is not said, nor cut (a cut name is no job's).
                 */
                char e[NAME_SAY_MAX + 1];
                bool say = text_escape_len(name) <= NAME_SAY_MAX;

                if (say)
                        (void) text_escape(e, sizeof(e), name);
                fprintf(stderr, "; a job an older tierd made under such a name was restored under its escaped "
                        "text, %s%s%s (tierctl jobs lists the name it was restored under, if any)",
                        say ? "'" : "", say ? e : "too long to say here", say ? "'" : "");
        }
        fputc('\n', stderr);
        return EXIT_USAGE;
}

/*
 * @r, the exit status of what printed, unless its output did not reach stdout
 * (a full disk, a closed pipe): then a failure, said on stderr.  Every way out
 * of main() that printed goes through here.
 */
static int output_written(int r) {
        errno = 0;
        if (fflush(stdout) != 0 || ferror(stdout)) {
                /* said even after a failure of the verb's own: a verb that flushed and failed said nothing */
                fprintf(stderr, "tierctl: cannot write the output: %s\n",
                        errno ? strerror(errno) : "a write to standard output failed");
                return r == EXIT_SUCCESS ? EXIT_FAILURE : r;
        }
        return r;
}

/*
 * A standard fd the caller closed (tierctl status >&-) is held by /dev/null
 * opened read-only: else the control socket took fd 1, the output went into
 * tierd's socket and tierctl exited 0.  A write to it fails with EBADF, which
 * output_written() reports, as coreutils do.
 */
static void hold_std_fds(void) {
        for (int fd = 0; fd <= 2; fd++)
                if (fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
                        int n = open("/dev/null", O_RDONLY | O_CLOEXEC);

                        if (n >= 0 && n != fd) {        /* (lowest free: it is fd unless a lower one failed) */
                                (void) dup3(n, fd, O_CLOEXEC);
                                (void) close(n);
                        }
                }
}

int main(int argc, char **argv) {
        enum { ARG_SOCKET = 0x100, ARG_JSON, ARG_VERSION, ARG_TIMEOUT };
        static const struct option options[] = {
                { "socket",  required_argument, NULL, ARG_SOCKET },
                { "timeout", required_argument, NULL, ARG_TIMEOUT },
                { "json",    no_argument,       NULL, ARG_JSON },
                { "help",    no_argument,       NULL, 'h' },
                { "version", no_argument,       NULL, ARG_VERSION },
                {}
        };
        const Verb *v;
        int c;

        hold_std_fds();
        /* "+": stop at the verb, whose own arguments are its business. */
        while ((c = getopt_long(argc, argv, "+h", options, NULL)) >= 0) {
                switch (c) {
                case ARG_SOCKET:
                        /* libtier takes "" as "the default": a script's --socket "$UNSET" must not reach it */
                        if (!*optarg) {
                                fprintf(stderr, "tierctl: --socket needs a path, not an empty string (leave "
                                        "--socket out for $TIER_SOCKET or the default socket)\n");
                                return EXIT_USAGE;
                        }
                        arg_socket = optarg;
                        break;
                case ARG_TIMEOUT:
                        if (parse_timeout(optarg, &arg_timeout) < 0) {
                                fprintf(stderr, "tierctl: --timeout takes seconds from 0 (no limit) to %g, "
                                        "not '%s'\n", TIMEOUT_MAX_SEC, optarg);
                                return EXIT_USAGE;
                        }
                        arg_timeout_given = 1;
                        break;
                case ARG_JSON:
                        arg_json = 1;
                        break;
                case 'h':
                        help(stdout);
                        return output_written(EXIT_SUCCESS);
                case ARG_VERSION:
                        printf("tierctl %s (protocol %d)\n", TIERD_VERSION, TIER_PROTOCOL_VERSION);
                        return output_written(EXIT_SUCCESS);
                default:
                        /* getopt_long() has said what was wrong. */
                        fprintf(stderr, "(try tierctl --help)\n");
                        return EXIT_USAGE;
                }
        }

        if (optind >= argc) {
                fprintf(stderr, "tierctl: no command given (try --help)\n");
                return EXIT_USAGE;
        }
        v = verb_find(argv[optind]);
        if (!v) {
                fprintf(stderr, "tierctl: unknown command '%s' (try --help)\n", argv[optind]);
                return EXIT_USAGE;
        }
        return output_written(v->fn(argc - optind, argv + optind));
}
