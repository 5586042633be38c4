/* SPDX-License-Identifier: MIT */
/* test-journal.c: journal entries with structured fields (PRIORITY, CODE_*, TIERD_JOB, TIERD_TIER). */

/*
 * journald is not needed: in a private mount namespace (root only) a tmpfs
 * covers /run and the test binds the journal's socket,
 * /run/systemd/journal/socket, itself.  tierd, started with
 * --log-target=journal, sends its native-protocol datagrams there, and the
 * test reads them field by field.
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <cmocka.h>

#include <tier.h>

#include "tests/helpers/harness.h"

#define JOURNAL_SOCKET "/run/systemd/journal/socket"
#define ENTRIES_MAX 4096

static const char *const CONFIG =
        "[host]\n"
        "capacity = 32M\n"
        "segment_size = 8M\n"
        "job_limit = 16M\n"
        "[vram]\n"
        "backend = emulated\n"
        "capacity = 16M\n"
        "chunk_size = 4M\n"
        "job_limit = 8M\n"
        "[nvme]\n"
        "target = @DIR@/t0.img:64M\n";

static TestDaemon d;
static int journal_fd = -1;
/* Each entry: its fields as "KEY=VALUE\n" lines (binary-encoded fields decoded). */
static char *entries[ENTRIES_MAX];
static size_t n_entries;

static int setup(void **state) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        int size = 8 << 20;

        if (geteuid() != 0 || unshare(CLONE_NEWNS) < 0) {
                printf("cannot make a private mount namespace (%s): skipped\n",
                       geteuid() != 0 ? "not root" : strerror(errno));
                exit(TEST_SKIP);
        }
        if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
            mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755") < 0) {
                printf("cannot mount a tmpfs on /run in the namespace (%s): skipped\n", strerror(errno));
                exit(TEST_SKIP);
        }
        if (mkdir("/run/systemd", 0755) < 0 || mkdir("/run/systemd/journal", 0755) < 0)
                return -1;
        journal_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (journal_fd < 0)
                return -1;
        (void) setsockopt(journal_fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof(size));
        strcpy(sa.sun_path, JOURNAL_SOCKET);
        if (bind(journal_fd, (struct sockaddr *) &sa, sizeof(sa)) < 0)
                return -1;
        return 0;
}

static int group_teardown(void **state) {
        for (size_t i = 0; i < n_entries; i++)
                free(entries[i]);
        if (journal_fd >= 0)
                close(journal_fd);
        return 0;
}

static int teardown(void **state) {
        test_daemon_cleanup(&d);
        return 0;
}

/* Decode one native-protocol datagram into "KEY=VALUE\n" lines. */
static char *decode(const char *p, size_t n) {
        char *out = malloc(2 * n + 2), *o = out;
        const char *end = p + n;

        if (!out)
                return NULL;
        while (p < end) {
                const char *nl = memchr(p, '\n', (size_t) (end - p));
                const char *eq = memchr(p, '=', (size_t) ((nl ? nl : end) - p));

                if (eq) {               /* KEY=VALUE\n */
                        size_t len = (size_t) ((nl ? nl : end) - p);

                        memcpy(o, p, len);
                        o += len;
                        *o++ = '\n';
                        p += len + 1;
                } else if (nl && end - nl > 8) {        /* KEY\n, le64 size, VALUE, \n */
                        uint64_t len = 0;

                        memcpy(o, p, (size_t) (nl - p));
                        o += nl - p;
                        *o++ = '=';
                        for (int i = 7; i >= 0; i--)
                                len = (len << 8) | (uint8_t) nl[1 + i];
                        if (len > (uint64_t) (end - nl - 9))
                                break;
                        memcpy(o, nl + 9, len);
                        o += len;
                        *o++ = '\n';
                        p = nl + 9 + len + 1;
                } else
                        break;
        }
        *o = 0;
        return out;
}

static void journal_read(int ms) {
        for (int waited = 0; waited <= ms; waited += 50) {
                struct pollfd p = { .fd = journal_fd, .events = POLLIN };

                (void) poll(&p, 1, 50);
                for (;;) {
                        static char buf[256 * 1024];
                        ssize_t n = recv(journal_fd, buf, sizeof(buf), MSG_DONTWAIT);

                        if (n < 0)
                                break;
                        if (n_entries < ENTRIES_MAX && (entries[n_entries] = decode(buf, (size_t) n)))
                                n_entries++;
                }
        }
}

/* Does @entry have the field line "KEY=VALUE" (@field, exact) or, with a trailing '*', one that starts so? */
static bool has_field(const char *entry, const char *field) {
        size_t n = strlen(field);
        bool prefix = n > 0 && field[n - 1] == '*';

        if (prefix)
                n--;
        for (const char *l = entry; *l; l = strchr(l, '\n') + 1) {
                size_t len = (size_t) (strchr(l, '\n') - l);

                if (prefix ? strncmp(l, field, n) == 0 : (len == n && strncmp(l, field, n) == 0))
                        return true;
        }
        return false;
}

/* How many fields of @entry are named @key. */
static unsigned count_key(const char *entry, const char *key) {
        size_t n = strlen(key);
        unsigned k = 0;

        for (const char *l = entry; *l; l = strchr(l, '\n') + 1)
                if (strncmp(l, key, n) == 0 && l[n] == '=')
                        k++;
        return k;
}

/* The first entry whose MESSAGE contains @text, or NULL. */
static const char *find_entry(const char *text) {
        for (size_t i = 0; i < n_entries; i++) {
                const char *m = strstr(entries[i], "MESSAGE=");

                if (m && (m == entries[i] || m[-1] == '\n')) {
                        const char *e = strchr(m, '\n');

                        if (strstr(m, text) && strstr(m, text) < e)
                                return entries[i];
                }
        }
        return NULL;
}

static void reload_and_wait(void) {
        kill(d.pid, SIGHUP);
        assert_true(test_daemon_wait_notify(&d, "RELOADING=1", 10000) >= 0);
        assert_true(test_daemon_wait_notify(&d, "READY=1", 10000) >= 0);
}

static void test_journal_fields(void **state) {
        TestDaemonOptions o = { .log_level = "debug", .wait_ready = true };
        const char *e;
        tier_client *c = NULL;

        assert_int_equal(test_daemon_init(&d, CONFIG), 0);
        o.args = (const char *const[]) { "--log-target", "journal", NULL };
        assert_int_equal(test_daemon_spawn(&d, &o), 0);
        journal_read(200);
        printf("%zu journal entries after start-up\n", n_entries);

        /* the start-up message, with the standard fields */
        e = find_entry("ready on");
        assert_non_null(e);
        printf("---- start-up entry ----\n%s", e);
        assert_true(has_field(e, "PRIORITY=6"));
        assert_true(has_field(e, "SYSLOG_IDENTIFIER=tierd"));
        assert_true(has_field(e, "CODE_FILE=daemon/core/main.c"));
        assert_true(has_field(e, "CODE_LINE=*"));
        assert_true(has_field(e, "CODE_FUNC=run"));
        /* the caller's location only, not also log.c's */
        assert_int_equal(count_key(e, "CODE_FILE"), 1);
        assert_int_equal(count_key(e, "CODE_LINE"), 1);
        assert_int_equal(count_key(e, "CODE_FUNC"), 1);
        /* nothing of it went to stderr */
        assert_false(test_daemon_log_contains(&d, "ready on"));

        /* a message about one job in one tier carries TIERD_JOB= and TIERD_TIER= */
        assert_int_equal(tier_client_new(d.socket, "journal-job", 0, &c), 0);
        assert_int_equal(test_daemon_write_config(&d, NULL,
                                                "[host]\ncapacity = 32M\nsegment_size = 8M\njob_limit = 8M\n"
                                                "[vram]\nbackend = emulated\ncapacity = 16M\nchunk_size = 4M\n"
                                                "job_limit = 8M\n[nvme]\ntarget = @DIR@/t0.img:64M\n"), 0);
        reload_and_wait();
        journal_read(200);
        e = find_entry("Job 'journal-job': host limit 16M -> 8M");
        assert_non_null(e);
        printf("---- job entry ----\n%s", e);
        assert_true(has_field(e, "TIERD_JOB=journal-job"));
        assert_true(has_field(e, "TIERD_TIER=host"));
        assert_false(has_field(e, "TIERD_TENSOR=*"));
        assert_true(has_field(e, "PRIORITY=6"));
        assert_true(has_field(e, "CODE_FILE=daemon/state/quota.c"));
        assert_int_equal(count_key(e, "CODE_FILE"), 1);

        /* a refused reload is an error (PRIORITY=3) */
        assert_int_equal(test_daemon_write_config(&d, "bad.conf", "[host]\nnot_a_key = 1\n"), 0);
        reload_and_wait();
        journal_read(200);
        e = find_entry("Invalid configuration, keeping the running one");
        assert_non_null(e);
        assert_true(has_field(e, "PRIORITY=3"));
        assert_non_null(strstr(e, "bad.conf:2: [host] not_a_key: unknown key"));

        tier_client_free(c);
        assert_int_equal(test_daemon_kill(&d, SIGTERM, 15000), 0);
        journal_read(100);
        assert_non_null(find_entry("SIGTERM received, stopping"));
}

/*
 * No journal at all (no socket: a container without journald): --log-target=journal writes to
 * standard error instead.  sd_journal_sendv() reports success there, and the messages were lost: a
 * refused configuration exited 6 without a word.  Runs last: it removes the test's journal socket.
 */
static void test_journal_absent(void **state) {
        static const char *const args[] = { "--log-target", "journal", "--config", "/nonexistent/tierd.conf", NULL };
        TestDaemonOptions o = { .args = args };

        assert_int_equal(unlink(JOURNAL_SOCKET), 0);
        assert_int_equal(test_daemon_init(&d, CONFIG), 0);
        assert_int_equal(test_daemon_spawn(&d, &o), 0);
        assert_int_equal(test_daemon_kill(&d, 0, 15000), 6);
        assert_true(test_daemon_log_contains(&d, "/nonexistent/tierd.conf: No such file or directory"));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_teardown(test_journal_fields, teardown),
                cmocka_unit_test_teardown(test_journal_absent, teardown),
        };

        return cmocka_run_group_tests_name("journal", tests, setup, group_teardown);
}
