/* SPDX-License-Identifier: MIT */
/* trace.c: tierctl trace: record what tierd does for N seconds and write it as Chrome Trace Event JSON. */

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <tier.h>

#include "client/tierctl/tierctl.h"
#include "proto/macro.h"
#include "util/json.h"
#include "util/time-util.h"

void trace_help(FILE *f) {
        fprintf(f,
                "Usage: tierctl trace [--seconds N] -o FILE [--buffer RECORDS] [--json-summary]\n"
                "\n"
                "Record every transfer (link, job, tensor, bytes, queued/start/end), every plan's\n"
                "phases and stalls and the scheduler's decisions (prefetches, victims and why) for\n"
                "N seconds, and write them to FILE (\"-\": standard output) as Chrome Trace Event\n"
                "JSON: open it in https://ui.perfetto.dev or chrome://tracing.  Ctrl-C stops early\n"
                "and still writes the file.  Root or group tier-admin only; one trace at a time.\n"
                "\n"
                "  --seconds N          how long to record (1..3600, default 10)\n"
                "  -o, --output FILE    where to write the JSON (required)\n"
                "  --buffer RECORDS     records tierd keeps (default: tierd.conf's [trace] buffer);\n"
                "                       beyond it records are dropped and counted\n"
                "  --json-summary       print a JSON summary (records, dropped, bytes per link)\n");
}

/* The signals that stop the recording early (unless ignored as inherited: nohup). */
static const int stop_signals[] = { SIGINT, SIGTERM, SIGHUP };

/* Whether a signal of @set is pending (blocked, not yet taken). */
static bool signal_pending(const sigset_t *set) {
        sigset_t pending;

        if (sigpending(&pending) < 0)
                return false;
        for (int sig = 1; sig < NSIG; sig++)
                if (sigismember(set, sig) == 1 && sigismember(&pending, sig) == 1)
                        return true;
        return false;
}

/* Wait @seconds, or until a signal of @set (SIGINT/SIGTERM/SIGHUP not ignored: blocked by the caller). */
static void wait_or_signal(const sigset_t *set, unsigned seconds) {
        uint64_t until = now_ns() + (uint64_t) seconds * NSEC_PER_SEC;

        for (;;) {
                uint64_t now = now_ns();
                struct timespec ts;

                if (now >= until)
                        return;
                ts.tv_sec = (time_t) ((until - now) / NSEC_PER_SEC);
                ts.tv_nsec = (long) ((until - now) % NSEC_PER_SEC);
                if (sigtimedwait(set, NULL, &ts) >= 0)
                        return;         /* Ctrl-C: stop early */
                if (errno != EINTR)
                        return;         /* EAGAIN: the time is up */
        }
}

static void print_summary(const char *file, const tier_trace *t) {
        if (arg_json) {         /* (not with -o -: refused, the trace itself goes to stdout) */
                JsonWriter w = JSON_WRITER_NULL;

                json_object_begin(&w);
                json_key(&w, "file");
                json_string(&w, file);
                json_key(&w, "records");
                json_uint(&w, tier_trace_records(t));
                json_key(&w, "dropped");
                json_uint(&w, tier_trace_dropped(t));
                json_key(&w, "links");
                json_object_begin(&w);
                for (int l = 0; l < TIER_LINKS; l++) {
                        json_key(&w, tier_link_name(l));
                        json_object_begin(&w);
                        json_key(&w, "counted");
                        json_uint(&w, tier_trace_link_bytes(t, l));
                        json_key(&w, "traced");
                        json_uint(&w, tier_trace_traced_bytes(t, l));
                        json_object_end(&w);
                }
                json_object_end(&w);
                json_object_end(&w);
                (void) json_print(&w);
                return;
        }
        fprintf(stderr, "Wrote %s: %zu record(s), %" PRIu64 " dropped%s\n", file, tier_trace_records(t),
                tier_trace_dropped(t), tier_trace_dropped(t) ? " (the buffer was full: try a larger --buffer)" : "");
        for (int l = 0; l < TIER_LINKS; l++)
                fprintf(stderr, "  %-10s  %" PRIu64 " bytes traced, %" PRIu64 " counted by tierd\n", tier_link_name(l),
                        tier_trace_traced_bytes(t, l), tier_trace_link_bytes(t, l));
}

int verb_trace(int argc, char **argv) {
        enum { ARG_SECONDS = 0x100, ARG_BUFFER, ARG_JSON_SUMMARY };
        static const struct option options[] = {
                { "seconds",      required_argument, NULL, ARG_SECONDS },
                { "output",       required_argument, NULL, 'o' },
                { "buffer",       required_argument, NULL, ARG_BUFFER },
                { "json-summary", no_argument,       NULL, ARG_JSON_SUMMARY },
                { "json",         no_argument,       NULL, ARG_JSON_SUMMARY },
                { "help",         no_argument,       NULL, 'h' },
                {}
        };
        unsigned long seconds = 10, buffer = 0;
        const char *out = NULL;
        tier_client *c = NULL;
        tier_trace *t = NULL;
        sigset_t set, old;
        int opt, fd = -1, r, ret = EXIT_FAILURE;
        char *end, *tmp = NULL;
        struct stat st;
        bool exists = false, blocked = false;

        optind = 0;
        opterr = 0;
        while ((opt = getopt_long(argc, argv, ":ho:", options, NULL)) >= 0)
                switch (opt) {
                case ARG_SECONDS:
                        errno = 0;
                        seconds = strtoul(optarg, &end, 10);
                        if (errno || *end || end == optarg || !isdigit((unsigned char) *optarg) || seconds < 1 ||
                            seconds > 3600) {
                                fprintf(stderr, "tierctl trace: --seconds '%s' is not a number of seconds from 1 "
                                        "to 3600\n", optarg);
                                return EXIT_USAGE;
                        }
                        break;
                case ARG_BUFFER:
                        errno = 0;
                        buffer = strtoul(optarg, &end, 10);
                        if (errno || *end || end == optarg || !isdigit((unsigned char) *optarg) || buffer < 1 ||
                            buffer > 1024 * 1024) {
                                fprintf(stderr, "tierctl trace: --buffer '%s' is not a number of records from 1 "
                                        "to 1048576\n", optarg);
                                return EXIT_USAGE;
                        }
                        break;
                case 'o':
                        out = optarg;
                        break;
                case ARG_JSON_SUMMARY:
                        arg_json = 1;
                        break;
                case 'h':
                        trace_help(stdout);
                        return EXIT_SUCCESS;
                default:
                        return verb_bad_option("trace", opt, argv);
                }
        if (optind < argc) {
                fprintf(stderr, "tierctl trace: unexpected argument '%s'\n", argv[optind]);
                return EXIT_USAGE;
        }
        if (!out || !*out) {
                fprintf(stderr, "tierctl trace: no output file given (tierctl trace -o trace.json)\n");
                return EXIT_USAGE;
        }
        if (arg_json && strcmp(out, "-") == 0) {
                fprintf(stderr, "tierctl trace: --json-summary with -o -: the trace itself goes to standard "
                        "output; write it to a file (-o trace.json) for a JSON summary there\n");
                return EXIT_USAGE;
        }
        /*
         * Ctrl-C, a TERM or a hangup ends the wait, not tierctl: the trace is still read and written.
         * One ignored as inherited (nohup: SIGHUP; a shell's background job: SIGINT) stays ignored: a
         * blocked signal is kept pending even so, and sigtimedwait() takes it (the hangup nohup was
         * for stopped the recording; one while connecting dropped it, exit 1 without a word).
         */
        sigemptyset(&set);
        for (size_t i = 0; i < ELEMENTSOF(stop_signals); i++) {
                struct sigaction sa;

                if (sigaction(stop_signals[i], NULL, &sa) == 0 && sa.sa_handler == SIG_IGN)
                        continue;
                sigaddset(&set, stop_signals[i]);
        }
        if (strcmp(out, "-") == 0) {
                fd = STDOUT_FILENO;
        } else if ((exists = lstat(out, &st) == 0) && !S_ISREG(st.st_mode)) {
                /* a device, a FIFO, a symbolic link: written through (truncated once the trace is read),
                 * never replaced or removed (a FIFO's open waits for a reader: signals still act) */
                fd = open(out, O_WRONLY | O_CLOEXEC | O_NOCTTY);
                if (fd < 0) {
                        fprintf(stderr, "tierctl trace: cannot open '%s' for writing: %m\n", out);
                        return EXIT_FAILURE;
                }
        }
        /*
         * Connected and started with the signals as they are: Ctrl-C (a TERM, a hangup) while connecting
         * or starting stops tierctl at once, even while tierd does not answer (blocked, it waited for
         * --timeout and was lost), with nothing of ours left: no file is made yet, and a trace ends
         * with its connection.
         */
        if (connect_control(&c) < 0)
                goto finish;
        r = tier_trace_start(c, (unsigned) seconds, (unsigned) buffer);
        if (r < 0) {
                fprintf(stderr, "tierctl: trace failed: %s\n", why(c, r));
                goto finish;
        }
        deadline_stop();                /* tierd answered; the recording time is asked for, not waited out */
        /*
         * blocked from before the file is made until it is renamed or removed: a signal that killed
         * tierctl meanwhile left OUT.XXXXXX behind for good (a hangup during the recording, a second
         * Ctrl-C while the trace was written)
         */
        sigprocmask(SIG_BLOCK, &set, &old);
        blocked = true;
        if (fd < 0) {
                /*
                 * a file: written beside it and renamed over it once whole (a failed trace leaves it be);
                 * with the mode of the file it replaces, else the owner's alone: a trace names every
                 * job's tensors
                 */
                mode_t mask = umask(0), mode;

                umask(mask);
                mode = exists ? st.st_mode & 0777 : 0600 & ~mask;
                if (asprintf(&tmp, "%s.XXXXXX", out) < 0) {
                        tmp = NULL;
                        fprintf(stderr, "tierctl trace: out of memory\n");
                        goto finish;
                }
                fd = mkostemp(tmp, O_CLOEXEC);
                if (fd < 0 || fchmod(fd, mode) < 0) {
                        fprintf(stderr, "tierctl trace: cannot write a file beside '%s': %m\n", out);
                        if (fd >= 0) {
                                close(fd);
                                fd = -1;
                                (void) unlink(tmp);
                        }
                        free(tmp);
                        tmp = NULL;
                        goto finish;
                }
        }
        deadline_unlink(tmp);           /* (NULL: no file of ours) */
        if (signal_pending(&set)) {
                /*
                 * a signal between the start and the file (now blocked): it asked to stop tierctl, not
                 * to stop a recording early (the wait would take it at once and write an empty trace
                 * over the file).  The recording is dropped; the signal acts once unblocked, below,
                 * with nothing of ours left.
                 */
                deadline_start();
                (void) tier_trace_stop(c, &t);
                goto finish;
        }
        /* on stderr even with --json-summary: it says when the recording runs */
        fprintf(stderr, "Tracing tierd for %lu s (Ctrl-C stops early)...\n", seconds);
        wait_or_signal(&set, (unsigned) seconds);
        deadline_start();
        r = tier_trace_stop(c, &t);
        deadline_stop();                /* what follows writes the trace: tierd is done */
        if (r < 0) {
                fprintf(stderr, "tierctl: reading the trace failed: %s\n", why(c, r));
                goto finish;
        }
        if (!tmp && fd != STDOUT_FILENO && ftruncate(fd, 0) < 0 && errno != EINVAL) {
                fprintf(stderr, "tierctl trace: cannot write '%s': %m\n", out);
                goto finish;
        }
        r = tier_trace_write_json(t, fd);
        if (r < 0) {
                fprintf(stderr, "tierctl trace: cannot write '%s': %s\n", out, strerror(-r));
                goto finish;
        }
        if (fd != STDOUT_FILENO && fsync(fd) < 0 && errno != EINVAL) {
                fprintf(stderr, "tierctl trace: cannot write '%s': %m\n", out);
                goto finish;
        }
        if (tmp && rename(tmp, out) < 0) {
                fprintf(stderr, "tierctl trace: cannot write '%s': %m\n", out);
                goto finish;
        }
        if (tmp) {
                free(tmp);
                tmp = NULL;             /* renamed: nothing to remove */
        }
        print_summary(out, t);
        ret = EXIT_SUCCESS;
finish:
        tier_trace_free(t);
        disconnect_control(c);
        deadline_unlink(NULL);
        if (fd > STDOUT_FILENO && close(fd) < 0 && ret == EXIT_SUCCESS) {
                fprintf(stderr, "tierctl trace: cannot write '%s': %m\n", out);
                ret = EXIT_FAILURE;
        }
        if (tmp) {
                (void) unlink(tmp);     /* never the output itself: what was there stays */
                free(tmp);
        }
        if (blocked)
                sigprocmask(SIG_SETMASK, &old, NULL);   /* a signal that came meanwhile acts now: nothing of ours is left */
        return ret;
}
