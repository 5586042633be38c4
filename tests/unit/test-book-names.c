/* SPDX-License-Identifier: MIT */
/*
 * test-book-names.c: a job or tensor an older tierd named with control or bidi characters or bytes not UTF-8
 * comes back from the NVMe index under a name a client can give (book-replay.c restore_name()).
 */

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cmocka.h>

#include "daemon/base/config.h"
#include "daemon/base/log.h"
#include "daemon/core/manager.h"
#include "daemon/engine/engine.h"
#include "daemon/state/book.h"
#include "daemon/state/quota.h"
#include "daemon/state/registry.h"
#include "daemon/state/wear.h"
#include "tests/unit/book-fixture.h"
#include "tests/unit/fixture.h"
#include "util/escape.h"

static char bdir[128];

static void setup(Config *c, void *userdata) {
        char t[192];

        free(c->state_dir);
        c->state_dir = strdup(bdir);
        snprintf(t, sizeof(t), "%s/t0.img", bdir);
        free(c->targets[0].path);
        c->targets[0].path = strdup(t);
        c->targets[0].size = 32 * MiB;
        c->nvme_persist = true;
        c->host_capacity = 16 * MiB;
        c->host_job_limit = c->host_capacity;
        c->host_uid_share = 0;
        c->nvme_uid_share = 0;
        c->nvme_job_limit = 32 * MiB;
        if (userdata)
                c->max_name = *(const unsigned *) userdata;
}

static void dir_new(void) {
        snprintf(bdir, sizeof(bdir), "/var/tmp/tierd-book-names.XXXXXX");
        assert_non_null(mkdtemp(bdir));
}

static void dir_done(void) {
        char cmd[192];

        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", bdir);
        assert_int_equal(system(cmd), 0);
}

static Manager *start(void) {
        return fixture_new(32 * MiB, setup, NULL);
}

/*
 * A name with control characters comes back escaped ("evil\u009b31m"), with its data; a tensor whose
 * escaped name is taken by a real one comes back under that name cut with a hash of its old one, with
 * its data too; valid non-ASCII names stay as they were; the new names hold across the next restart.
 */
static void test_restore_escapes_control_names(void **state) {
        char *tagged = text_escape_name("t\x1b[2J", 255, true);
        Manager *m;
        Job *j;

        assert_non_null(tagged);
        assert_int_equal(strncmp(tagged, "t\\u001b[2J~", 11), 0);
        assert_int_equal(strlen(tagged), 11 + 8);
        dir_new();
        m = start();
        j = book_fx_job(m, "evil\xc2\x9b" "31m");
        book_fx_written(m, fixture_tensor(j, "t\x1b[2J", MiB), 0x42);
        book_fx_written(m, fixture_tensor(j, "t\\u001b[2J", MiB), 0x43);    /* its escaped name, taken */
        j = book_fx_job(m, "caf\xc3\xa9");
        book_fx_written(m, fixture_tensor(j, "\xe5\xad\xa6", MiB), 0x44);
        fixture_free(m);

        m = start();
        assert_null(job_find(m->registry, "evil\xc2\x9b" "31m"));
        j = job_find(m->registry, "evil\\u009b31m");
        assert_non_null(j);
        assert_non_null(j->linger);
        assert_int_equal(j->n_tensors, 2);
        assert_null(book_fx_find(m, "evil\\u009b31m", "t\x1b[2J"));
        book_fx_check_bytes(m, book_fx_find(m, "evil\\u009b31m", "t\\u001b[2J"), 0x43);
        book_fx_check_bytes(m, book_fx_find(m, "evil\\u009b31m", tagged), 0x42);
        book_fx_check_bytes(m, book_fx_find(m, "caf\xc3\xa9", "\xe5\xad\xa6"), 0x44);  /* valid names as they were */
        fixture_free(m);

        /* and so across the next restart: the index holds the new names */
        m = start();
        book_fx_check_bytes(m, book_fx_find(m, "evil\\u009b31m", "t\\u001b[2J"), 0x43);
        book_fx_check_bytes(m, book_fx_find(m, "evil\\u009b31m", tagged), 0x42);
        fixture_free(m);
        dir_done();
        free(tagged);
}

/*
 * A job or tensor an older tierd took with a bidirectional format character (U+202E RLO, U+2066 LRI:
 * tierd refuses them now) comes back under its escaped name, with its data, as one with a control
 * character does (it came back as it was, its name printed raw).
 */
static void test_restore_escapes_bidi_names(void **state) {
        Manager *m;
        Job *j;

        dir_new();
        m = start();
        j = book_fx_job(m, "abc\xe2\x80\xae" "gpj.exe");
        book_fx_written(m, fixture_tensor(j, "w\xe2\x81\xa6", MiB), 0x45);
        fixture_free(m);

        m = start();
        assert_null(job_find(m->registry, "abc\xe2\x80\xae" "gpj.exe"));
        j = job_find(m->registry, "abc\\u202egpj.exe");
        assert_non_null(j);
        assert_int_equal(j->n_tensors, 1);
        assert_null(book_fx_find(m, "abc\\u202egpj.exe", "w\xe2\x81\xa6"));
        book_fx_check_bytes(m, book_fx_find(m, "abc\\u202egpj.exe", "w\\u2066"), 0x45);
        fixture_free(m);
        dir_done();
}

/*
 * A name whose escaped text is longer than max_name (here 4096, as long as the index takes a name)
 * comes back cut to max_name with a hash of the old name: whole, the index's next snapshot held a
 * record it does not read back, and the next restart went back to the file before it, losing what
 * was written since (here: "ok"'s second write).
 */
static void test_restore_long_escaped_name(void **state) {
        unsigned max = 4096;
        char name[1001], *want;
        Manager *m;
        Job *j;

        memset(name, 0x1b, 1000);       /* "\u001b" 1000 times: 6000 bytes */
        name[1000] = '\0';
        want = text_escape_name(name, max, false);
        assert_non_null(want);
        assert_int_equal(strlen(want), 681 * 6 + 9);    /* (cut at an escape's end) */
        dir_new();
        m = fixture_new(32 * MiB, setup, &max);
        j = book_fx_job(m, "ok");
        book_fx_written(m, fixture_tensor(j, "a", MiB), 0x51);
        j = book_fx_job(m, name);
        book_fx_written(m, fixture_tensor(j, "b", MiB), 0x52);
        fixture_free(m);

        m = fixture_new(32 * MiB, setup, &max);
        assert_null(job_find(m->registry, name));
        book_fx_check_bytes(m, book_fx_find(m, want, "b"), 0x52);
        book_fx_written(m, book_fx_find(m, "ok", "a"), 0x53);
        fixture_free(m);

        m = fixture_new(32 * MiB, setup, &max);
        book_fx_check_bytes(m, book_fx_find(m, "ok", "a"), 0x53);
        book_fx_check_bytes(m, book_fx_find(m, want, "b"), 0x52);
        fixture_free(m);
        dir_done();
        free(want);
}

/* Set the run-time quota of job @name to @host bytes of host at most, as tierctl quota set did. */
static void quota_set_host(Manager *m, const char *name, uint64_t host) {
        QuotaRule q = { .kind = QUOTA_JOB, .job = (char *) name, .set = 1u << QUOTA_MAX(LEVEL_HOST) };
        char why[1024] = "", warn[1024];

        q.value[QUOTA_MAX(LEVEL_HOST)] = host;
        assert_int_equal(quota_store_set(m->quotas, &q, false, why, sizeof(why), warn, sizeof(warn)) < 0 ? -1 : 0, 0);
}

/*
 * A quota set at run time and the drive wear of a job an older tierd named with control characters
 * follow the name it is restored under: before, the rule (in STATE_DIR/quotas) and the wear (in
 * STATE_DIR/wear) stayed under the old name, which no job has any more, and the quota silently
 * stopped applying.  So do the rule and the wear of such a name that no restored job took.
 */
static void test_restore_quota_and_wear_follow_names(void **state) {
        const char *raw = "evil\xc2\x9b" "31m", *gone = "old\xc2\x9b";
        char path[192], text[4096] = "";
        FILE *f;
        uint64_t wrote;
        Manager *m;
        Job *j;

        dir_new();
        m = start();
        j = book_fx_job(m, raw);
        book_fx_written(m, fixture_tensor(j, "a", MiB), 0x61);
        wrote = j->nvme_written;
        assert_true(wrote >= MiB);
        quota_set_host(m, raw, 4 * MiB);
        quota_set_host(m, gone, 2 * MiB);
        j = book_fx_job(m, gone);
        book_fx_written(m, fixture_tensor(j, "b", MiB), 0x62);
        job_destroy(j);                 /* it ended: its wear is in the book, not in the index */
        fixture_free(m);

        for (int run = 0; run < 2; run++) {
                m = start();
                j = job_find(m->registry, "evil\\u009b31m");
                assert_non_null(j);
                assert_int_equal(j->limit[LEVEL_HOST], 4 * MiB);
                assert_true(j->limit_set & (1u << LEVEL_HOST));
                assert_null(quota_rules_find(&m->quotas->runtime, QUOTA_JOB, 0, raw));
                assert_null(quota_rules_find(&m->quotas->runtime, QUOTA_JOB, 0, gone));
                assert_non_null(quota_rules_find(&m->quotas->runtime, QUOTA_JOB, 0, "old\\u009b"));
                assert_int_equal(wear_job_written(m->registry->wear, m->registry, j), wrote);
                assert_int_equal(wear_job_base(m->registry->wear, raw), 0);
                assert_int_equal(wear_job_base(m->registry->wear, gone), 0);
                assert_true(wear_job_base(m->registry->wear, "old\\u009b") >= MiB);
                fixture_free(m);
        }
        /* the file holds the new names (so tierctl quota set can change them) */
        snprintf(path, sizeof(path), "%s/quotas", bdir);
        f = fopen(path, "re");
        assert_non_null(f);
        assert_true(fread(text, 1, sizeof(text) - 1, f) > 0);
        fclose(f);
        assert_non_null(strstr(text, "job = evil\\u009b31m\n"));
        assert_non_null(strstr(text, "job = old\\u009b\n"));
        dir_done();
}

/* The content of STATE_DIR/@name into @buf (@size bytes at most, NUL-ended), or written back from it. */
static void state_file(const char *name, char *buf, size_t size, bool write) {
        char path[192];
        FILE *f;

        snprintf(path, sizeof(path), "%s/%s", bdir, name);
        f = fopen(path, write ? "we" : "re");
        assert_non_null(f);
        if (write) {
                assert_int_equal(fwrite(buf, 1, strlen(buf), f), strlen(buf));
        } else {
                size_t n = fread(buf, 1, size - 1, f);

                assert_true(n > 0 && n < size - 1);
                buf[n] = '\0';
        }
        assert_int_equal(fclose(f), 0);
}

/*
 * The index already holds the escaped name (an earlier start restored the job under it) while the
 * quotas and the wear book still hold the old one: that start was killed before it saved them (the
 * wear book is saved at an interval), or its quota save failed, or it was a tierd before the names
 * followed.  The rule and the wear go to the job the old name became: they went to the escaped name
 * cut with a hash ("evil\u009b31m~..."), which no job has, as the escaped one was "taken" by that very
 * job, and the quota silently stopped applying again.
 */
static void test_restore_renames_not_saved(void **state) {
        const char *raw = "evil\xc2\x9b" "31m";
        char *tagged = text_escape_name(raw, 255, true);
        char quotas[4096], wear[4096];
        uint64_t wrote;
        Manager *m;
        Job *j;

        assert_non_null(tagged);
        dir_new();
        m = start();
        j = book_fx_job(m, raw);
        book_fx_written(m, fixture_tensor(j, "a", MiB), 0x61);
        wrote = j->nvme_written;
        assert_true(wrote >= MiB);
        quota_set_host(m, raw, 4 * MiB);
        fixture_free(m);
        state_file("quotas", quotas, sizeof(quotas), false);
        state_file("wear", wear, sizeof(wear), false);

        m = start();            /* restores the job as evil\u009b31m, rewriting the index */
        assert_non_null(job_find(m->registry, "evil\\u009b31m"));
        fixture_free(m);
        state_file("quotas", quotas, sizeof(quotas), true);    /* as if its saves never happened */
        state_file("wear", wear, sizeof(wear), true);

        m = start();
        j = job_find(m->registry, "evil\\u009b31m");
        assert_non_null(j);
        assert_int_equal(j->limit[LEVEL_HOST], 4 * MiB);
        assert_null(quota_rules_find(&m->quotas->runtime, QUOTA_JOB, 0, raw));
        assert_null(quota_rules_find(&m->quotas->runtime, QUOTA_JOB, 0, tagged));
        assert_int_equal(wear_job_written(m->registry->wear, m->registry, j), wrote);
        assert_int_equal(wear_job_base(m->registry->wear, tagged), 0);
        fixture_free(m);
        free(tagged);
        dir_done();
}

/*
 * The escaped name has a rule of its own: it wins, and the old name's rule is dropped with a warning
 * that says what the dropped rule set (host=2097152), so that an operator can set it again: the
 * warning named neither, and once the quotas file was saved the values were gone.
 */
static void test_restore_dropped_rule_logged(void **state) {
        const char *raw = "evil\xc2\x9b" "31m";
        char buf[8192];
        int fd, saved;
        ssize_t n;
        Manager *m;
        Job *j;

        dir_new();
        m = start();
        j = book_fx_job(m, raw);
        book_fx_written(m, fixture_tensor(j, "a", MiB), 0x61);
        quota_set_host(m, raw, 2 * MiB);
        quota_set_host(m, "evil\\u009b31m", 4 * MiB);
        fixture_free(m);

        fd = memfd_create("book-names-log", MFD_CLOEXEC);
        assert_true(fd >= 0);
        saved = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
        assert_true(saved >= 0);
        log_setup(LOG_TARGET_STDERR);
        fflush(stderr);
        assert_int_equal(dup2(fd, STDERR_FILENO), STDERR_FILENO);
        m = start();
        fflush(stderr);
        assert_int_equal(dup2(saved, STDERR_FILENO), STDERR_FILENO);
        close(saved);
        n = pread(fd, buf, sizeof(buf) - 1, 0);
        close(fd);
        assert_true(n > 0);
        buf[n] = '\0';
        j = job_find(m->registry, "evil\\u009b31m");
        assert_non_null(j);
        assert_int_equal(j->limit[LEVEL_HOST], 4 * MiB);
        assert_null(quota_rules_find(&m->quotas->runtime, QUOTA_JOB, 0, raw));
        assert_non_null(strstr(buf, "is dropped (it set host=2097152)"));
        fixture_free(m);
        dir_done();
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_restore_escapes_control_names),
                cmocka_unit_test(test_restore_escapes_bidi_names),
                cmocka_unit_test(test_restore_long_escaped_name),
                cmocka_unit_test(test_restore_quota_and_wear_follow_names),
                cmocka_unit_test(test_restore_renames_not_saved),
                cmocka_unit_test(test_restore_dropped_rule_logged),
        };

        return fixture_main("book-names", tests, sizeof(tests) / sizeof(tests[0]));
}
