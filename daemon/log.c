/* SPDX-License-Identifier: MIT */
/* log.c: logging to the journal (structured fields) or to stderr. */

/*
 * Theory of operation: one process-wide sink chosen at start-up.  Under
 * systemd ($JOURNAL_STREAM set, or --log-target=journal) messages go to the
 * journal with PRIORITY=, CODE_FILE=, CODE_LINE=, CODE_FUNC=, and any
 * TIERD_* fields the caller passes; otherwise one line per message goes to
 * stderr.  Logging never changes errno and never fails the caller.
 */

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <systemd/sd-journal.h>

#include "daemon/log.h"

static int log_max_level = LOG_INFO;
static LogTarget log_target = LOG_TARGET_STDERR;

static const char *const level_names[] = {
        [LOG_EMERG] = "emerg", [LOG_ALERT] = "alert", [LOG_CRIT] = "crit",
        [LOG_ERR] = "err", [LOG_WARNING] = "warning", [LOG_NOTICE] = "notice",
        [LOG_INFO] = "info", [LOG_DEBUG] = "debug",
};

void log_setup(LogTarget target) {
        if (target == LOG_TARGET_AUTO)
                target = getenv("JOURNAL_STREAM") ? LOG_TARGET_JOURNAL : LOG_TARGET_STDERR;
        log_target = target;
}

void log_set_level(int level) {
        log_max_level = level;
}

int log_get_level(void) {
        return log_max_level;
}

LogTarget log_target_from_string(const char *s) {
        if (!s)
                return _LOG_TARGET_INVALID;
        if (strcmp(s, "auto") == 0)
                return LOG_TARGET_AUTO;
        if (strcmp(s, "journal") == 0)
                return LOG_TARGET_JOURNAL;
        if (strcmp(s, "stderr") == 0)
                return LOG_TARGET_STDERR;
        return _LOG_TARGET_INVALID;
}

int log_level_from_string(const char *s) {
        if (!s)
                return -EINVAL;
        for (size_t i = 0; i < ELEMENTSOF(level_names); i++)
                if (level_names[i] && strcmp(level_names[i], s) == 0)
                        return (int) i;
        if (strcmp(s, "error") == 0)
                return LOG_ERR;
        return -EINVAL;
}

const char *log_level_to_string(int level) {
        if (level < 0 || (size_t) level >= ELEMENTSOF(level_names))
                return "?";
        return level_names[level];
}

int log_full(int level, int error, const char *file, int line, const char *func,
             const char *fields, const char *fmt, ...) {
        int saved = errno;
        char msg[2048];
        va_list ap;

        if (level > log_max_level) {
                errno = saved;
                return -error;
        }

        errno = error;  /* so %m prints the caller's error */
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);

        if (log_target == LOG_TARGET_JOURNAL) {
                struct iovec iov[16];
                char prio[32], cfile[256], cline[32], cfunc[128], cerr[32];
                char msgfield[sizeof(msg) + 8];
                size_t n = 0;

                snprintf(msgfield, sizeof(msgfield), "MESSAGE=%s", msg);
                snprintf(prio, sizeof(prio), "PRIORITY=%d", level);
                snprintf(cfile, sizeof(cfile), "CODE_FILE=%s", file);
                snprintf(cline, sizeof(cline), "CODE_LINE=%d", line);
                snprintf(cfunc, sizeof(cfunc), "CODE_FUNC=%s", func);
                iov[n++] = (struct iovec) { msgfield, strlen(msgfield) };
                iov[n++] = (struct iovec) { prio, strlen(prio) };
                iov[n++] = (struct iovec) { cfile, strlen(cfile) };
                iov[n++] = (struct iovec) { cline, strlen(cline) };
                iov[n++] = (struct iovec) { cfunc, strlen(cfunc) };
                iov[n++] = (struct iovec) { (void *) "SYSLOG_IDENTIFIER=tierd", 23 };
                if (error > 0) {
                        snprintf(cerr, sizeof(cerr), "ERRNO=%d", error);
                        iov[n++] = (struct iovec) { cerr, strlen(cerr) };
                }
                for (const char *f = fields; f && *f && n < ELEMENTSOF(iov); f += strlen(f) + 1)
                        iov[n++] = (struct iovec) { (void *) f, strlen(f) };
                if (sd_journal_sendv(iov, (int) n) >= 0)
                        goto out;
                /* journal unreachable: fall through to stderr */
        }

        fprintf(stderr, "tierd[%s]: %s\n", log_level_to_string(level), msg);
out:
        errno = saved;
        return -error;
}
