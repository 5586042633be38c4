/* SPDX-License-Identifier: MIT */
/* log.c: logging to the journal (structured fields) or to stderr. */

/*
 * Theory of operation: one process-wide sink chosen at start-up.  Under
 * systemd (standard error connected to the journal, see log_setup(), or
 * --log-target=journal) messages go to the journal as native entries with
 * PRIORITY=, CODE_FILE=, CODE_LINE=, CODE_FUNC=, SYSLOG_IDENTIFIER=, ERRNO=
 * and any TIERD_* fields the caller passes (log_fields() with a constant
 * list, log_job()/log_tensor()/log_tier() with names known at run time).
 * Otherwise one line per message goes to standard error.  When the journal
 * cannot be reached the message goes to standard error instead of being
 * lost.  Control characters in a message (names are the clients') are
 * written as text (util/escape.c: "\u001b"); a message longer than 2 KiB
 * so written is cut between escapes and ends in "[cut: longer than 2 KiB]".
 * Logging never changes errno and never fails the caller.
 *
 * Everything runs on the event loop thread except messages of the emulated
 * VRAM mover thread; the sink and the level are plain ints set before that
 * thread starts (the level may change on reload, a benign race).
 */

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
/* sd_journal_sendv() would add CODE_FILE= etc. of this file: we send the caller's */
#define SD_JOURNAL_SUPPRESS_LOCATION
#include <systemd/sd-journal.h>
#include <unistd.h>

/* Where sd_journal_sendv() sends: fixed in libsystemd. */
#define JOURNAL_SOCKET "/run/systemd/journal/socket"

#include "daemon/base/log.h"
#include "util/escape.h"

static int log_max_level = LOG_INFO;
static LogTarget log_target = LOG_TARGET_STDERR;

static const char *const level_names[] = {
        [LOG_EMERG] = "emerg", [LOG_ALERT] = "alert", [LOG_CRIT] = "crit",
        [LOG_ERR] = "err", [LOG_WARNING] = "warning", [LOG_NOTICE] = "notice",
        [LOG_INFO] = "info", [LOG_DEBUG] = "debug",
};

/*
 * Is standard error the journal stream systemd set up?  $JOURNAL_STREAM is
 * "DEVICE:INODE" of that stream; a child whose stderr was redirected still
 * inherits the variable, hence the comparison (as systemd's own log.c does).
 */
static bool stderr_is_journal(void) {
        const char *e = getenv("JOURNAL_STREAM");
        uintmax_t dev, ino;
        struct stat st;

        if (!e || sscanf(e, "%ju:%ju", &dev, &ino) != 2)
                return false;
        if (fstat(STDERR_FILENO, &st) < 0)
                return false;
        return (uintmax_t) st.st_dev == dev && (uintmax_t) st.st_ino == ino;
}

void log_setup(LogTarget target) {
        if (target == LOG_TARGET_AUTO)
                target = stderr_is_journal() ? LOG_TARGET_JOURNAL : LOG_TARGET_STDERR;
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

/*
 * CODE_FILE= relative to the source tree ("daemon/engine/op.c"), whatever path
 * the build passed to the compiler ("../daemon/engine/op.c" from a build
 * directory inside the tree, or longer from one outside it).
 */
static const char *code_file(const char *file) {
        const char *best = file;

        for (const char *p = file; (p = strstr(p, "daemon/")); p++)
                if (p == file || p[-1] == '/')
                        best = p;
        return best;
}

/* The end of a message cut at its 2 KiB (escapes included). */
#define LOG_CUT " [cut: longer than 2 KiB]"

/* Most iovecs of one journal entry: the fixed fields plus the caller's. */
#define LOG_IOV_MAX 24

static int log_fullv(int level, int error, const char *file, int line, const char *func,
                     const char *fields, const char *fmt, va_list ap) _printf_(7, 0);

static int log_fullv(int level, int error, const char *file, int line, const char *func,
                     const char *fields, const char *fmt, va_list ap) {
        int saved = errno, len;
        char raw[2048], msg[2048];
        bool cut;

        errno = error;  /* so %m prints the caller's error */
        len = vsnprintf(raw, sizeof(raw), fmt, ap);
        /*
         * Names are the clients' (a job an older tierd let in may hold CSI or ESC, or RLO, U+202E):
         * control and bidirectional format characters and bytes that are not UTF-8 are written as text
         * (util/escape.c), so that no message puts an escape sequence into a terminal (journalctl,
         * stderr) nor reorders the line after a name.  No format of tierd's holds a newline
         * or a tab of its own: every message is one line.  A message cut (names go up to max_name,
         * 4096 bytes; an escape takes up to 6 per byte) says so: what is left of a name may be no job's.
         */
        cut = len >= (int) sizeof(raw) ||
              (strlen(raw) > (sizeof(msg) - 1) / TEXT_ESCAPE_GROWTH && text_escape_len(raw) >= sizeof(msg));
        text_escape(msg, cut ? sizeof(msg) - strlen(LOG_CUT) : sizeof(msg), raw);
        if (cut)
                strcat(msg, LOG_CUT);

        if (log_target == LOG_TARGET_JOURNAL) {
                struct iovec iov[LOG_IOV_MAX];
                char prio[32], cfile[256], cline[32], cfunc[128], cerr[32];
                char msgfield[sizeof(msg) + 8];
                size_t n = 0;

                snprintf(msgfield, sizeof(msgfield), "MESSAGE=%s", msg);
                snprintf(prio, sizeof(prio), "PRIORITY=%d", level);
                snprintf(cfile, sizeof(cfile), "CODE_FILE=%s", code_file(file));
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
                /*
                 * sd_journal_sendv() reports success when the journal's socket does not exist at all
                 * (no journald: a container, --log-target=journal by hand), and the message is gone:
                 * what it says was sent counts only where the socket is.
                 */
                if (sd_journal_sendv(iov, (int) n) >= 0 && access(JOURNAL_SOCKET, F_OK) == 0)
                        goto out;
                /* journal unreachable: fall through to stderr */
        }

        fprintf(stderr, "tierd[%s]: %s\n", log_level_to_string(level), msg);
out:
        errno = saved;
        return -error;
}

int log_full(int level, int error, const char *file, int line, const char *func,
             const char *fields, const char *fmt, ...) {
        va_list ap;
        int r;

        if (level > log_max_level)
                return -error;
        va_start(ap, fmt);
        r = log_fullv(level, error, file, line, func, fields, fmt, ap);
        va_end(ap);
        return r;
}

/* Append "KEY=VALUE\0" to @buf (NUL-separated list) if @value is set; truncates long values. */
static size_t field_append(char *buf, size_t size, size_t used, const char *key, const char *value) {
        int n;

        if (!value || used + 1 >= size)
                return used;
        n = snprintf(buf + used, size - used - 1, "%s=%s", key, value);
        if (n < 0)
                return used;
        used += MIN((size_t) n, size - used - 2) + 1;
        buf[used - 1] = '\0';
        return used;
}

int log_object_full(int level, int error, const char *file, int line, const char *func,
                    const char *job, const char *tensor, const char *tier, const char *fmt, ...) {
        /* names are limited by [limits] max_name (at most 4096): room for three and the keys */
        char fields[3 * 1024];
        size_t used = 0;
        va_list ap;
        int r;

        if (level > log_max_level)
                return -error;
        if (log_target == LOG_TARGET_JOURNAL) {
                used = field_append(fields, sizeof(fields), used, "TIERD_JOB", job);
                used = field_append(fields, sizeof(fields), used, "TIERD_TENSOR", tensor);
                used = field_append(fields, sizeof(fields), used, "TIERD_TIER", tier);
        }
        fields[used] = '\0';   /* the list ends with an empty string */
        va_start(ap, fmt);
        r = log_fullv(level, error, file, line, func, fields, fmt, ap);
        va_end(ap);
        return r;
}
