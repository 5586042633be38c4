/* SPDX-License-Identifier: MIT */
/* test-config-syntax.c: what tierd.conf refuses rather than reads silently wrong (keys set twice, ...). */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "daemon/base/config.h"
#include "proto/macro.h"
#include "tests/unit/config-fixture.h"

#define MIB (UINT64_C(1024) * 1024)
#define GIB (MIB * 1024)

/* Parse @text as "test.conf" into defaults and expect success. */
static void parse_ok(Config *c, const char *text) {
        config_init(c);
        parse_text_ok(c, text);
}

/* A key given twice in one file is refused with both lines: the last one used to win without a word. */
static void test_key_twice(_unused_ void **state) {
        parse_fails("[host]\ncapacity = 2G\njob_limit = 1G\ncapacity = 4G\n",
                    "test.conf:4: [host] capacity: set a second time", "first at line 2", NULL);
        /* the same section opened again further down */
        parse_fails("[daemon]\nlog_level = info\n[host]\njob_limit = 1G\n\n[daemon]\nlinger_sec = 5\n"
                    "log_level = debug\n",
                    "test.conf:8: [daemon] log_level", "first at line 2", NULL);
        /* the same value twice is a slip too: one of the lines is not the one meant */
        parse_fails("[nvme]\npersist = yes\npersist = yes\n", "test.conf:3: [nvme] persist", "line 2", NULL);
        /* a second line that would be invalid anyway is named as the second one */
        parse_fails("[vram]\nbandwidth = 1G\nbandwidth = 2G\n", "test.conf:3:", "first at line 2", NULL);
}

/* A field given twice in one [quota] section. */
static void test_quota_field_twice(_unused_ void **state) {
        parse_fails("[quota]\njob = a\nhost = 1G\nweight = 2\nhost = 2G\n",
                    "test.conf:5: [quota] host: set a second time in this [quota] section", "first at line 3",
                    NULL);
        parse_fails("[host]\njob_limit = 1G\n[quota]\njob = a\nweight = 2\nweight = 3\n",
                    "test.conf:6: [quota] weight", "first at line 5", NULL);
        /* two targets in one section were refused already */
        parse_fails("[quota]\njob = a\njob = b\n", "test.conf:3:", "target already", NULL);
}

/* Two [quota] sections of one file for one target setting one field: the later won silently. */
static void test_quota_section_twice(_unused_ void **state) {
        _cleanup_config_ Config c;

        parse_fails("[quota]\njob = a\nhost = 1G\n\n[quota]\njob = b\nhost = 2G\n\n[quota]\njob = a\nhost = 3G\n",
                    "test.conf:11: [quota] host: set a second time in this file for job 'a' (first by the [quota] "
                    "section at line 1)",
                    "merge the sections", NULL);
        /* uid 0 and user root are one target */
        parse_fails("[quota]\nuid = 0\nweight = 2\n[quota]\nuser = root\nweight = 3\n",
                    "test.conf:6: [quota] weight: set a second time in this file for uid 0 (first by the [quota] "
                    "section at line 1)", NULL);
        /* a later file (a drop-in) overrides field by field */
        parse_ok(&c, "[quota]\njob = a\nhost = 1G\n");
        assert_int_equal(config_parse_text(&c, "[quota]\njob = a\nhost = 3G\n", "drop-in.conf", NULL), 0);
        assert_int_equal(c.quotas.n, 2);
        assert_int_equal(c.quotas.rules[1].value[QUOTA_MAX(LEVEL_HOST)], 3 * GIB);
}

/* What is repeatable stays so: sections opened again, [nvme] target, [quota] sections. */
static void test_repeatable(_unused_ void **state) {
        _cleanup_config_ Config c;

        /* a section opened again for other keys */
        parse_ok(&c, "[host]\ncapacity = 2G\n[vram]\njob_limit = 8M\n[host]\njob_limit = 1G\n");
        assert_int_equal(c.host_capacity, 2 * GIB);
        assert_int_equal(c.host_job_limit, GIB);
        config_deinit(&c);

        /* target is a list; an empty one drops those before it */
        parse_ok(&c, "[nvme]\ntarget = /a.img:1G\ntarget =\ntarget = /b.img\ntarget = /c.img:2G\n");
        assert_int_equal(c.n_targets, 2);
        assert_string_equal(c.targets[0].path, "/b.img");
        assert_string_equal(c.targets[1].path, "/c.img");
        config_deinit(&c);

        /* one rule per [quota] section; sections of one target that set different fields add up */
        parse_ok(&c, "[quota]\njob = a\nhost = 1G\nweight = 2\n\n[quota]\njob = b\nhost = 2G\n\n"
                     "[quota]\njob = a\nvram = 3G\n");
        assert_int_equal(c.quotas.n, 3);
        assert_string_equal(c.quotas.rules[2].job, "a");
        assert_int_equal(c.quotas.rules[2].value[QUOTA_MAX(LEVEL_VRAM)], 3 * GIB);
        config_deinit(&c);

        /* a key per file: parsing the next file (a drop-in) overrides */
        parse_ok(&c, "[host]\njob_limit = 1G\n");
        assert_int_equal(config_parse_text(&c, "[host]\njob_limit = 2G\n", "drop-in.conf", NULL), 0);
        assert_int_equal(c.host_job_limit, 2 * GIB);
}

/* A comment after a path was taken as part of it ("x.sock # old"); numbers and names refused it already. */
static void test_inline_comment_in_path(_unused_ void **state) {
        _cleanup_config_ Config c;

        parse_fails("[daemon]\nsocket = /run/x.sock # old\n", "test.conf:2: [daemon] socket", "holds a comment",
                    "line of its own", NULL);
        parse_fails("[daemon]\nstate_dir = /srv/tierd\t; moved\n", "test.conf:2: [daemon] state_dir",
                    "holds a comment", NULL);
        parse_fails("[nvme]\ntarget = /dev/nvme1n1 # the fast one\n", "test.conf:2: [nvme] target",
                    "holds a comment", NULL);
        parse_fails("[metrics]\ntextfile = /var/lib/node/tierd.prom ;x\n", "test.conf:2: [metrics] textfile",
                    "holds a comment", NULL);
        /* as before: numbers refuse it as junk, and a '#' or ';' inside a path (no blank before it) is a path */
        parse_fails("[host]\ncapacity = 1G # one gig\n", "test.conf:2:", "capacity", NULL);
        parse_ok(&c, "[daemon]\nstate_dir = /srv/tierd#2\nsocket = /run/a;b.sock\n"
                     "[nvme]\ntarget = /dev/disk/by-path/pci-0000:01:00.0-nvme-1\n");
        assert_string_equal(c.state_dir, "/srv/tierd#2");
        assert_string_equal(c.socket_path, "/run/a;b.sock");
        assert_string_equal(c.targets[0].path, "/dev/disk/by-path/pci-0000:01:00.0-nvme-1");
}

/*
 * Only a line of a file has comments: a path given on the command line (--socket, --state-dir, which
 * go through config_set_key()) is taken whole, a blank and '#' or ';' included.  It was refused as
 * "holds a comment" since the file's check sat in the key's parser.
 */
static void test_inline_comment_only_in_files(_unused_ void **state) {
        _cleanup_config_ Config c;
        _cleanup_free_ char *error = NULL;

        config_init(&c);
        if (config_set_key(&c, "daemon", "state_dir", "/srv/run #1", "--state-dir", &error) < 0)
                fail_msg("--state-dir refused: %s", error);
        if (config_set_key(&c, "daemon", "socket", "/run/a ;b.sock", "--socket", &error) < 0)
                fail_msg("--socket refused: %s", error);
        assert_string_equal(c.state_dir, "/srv/run #1");
        assert_string_equal(c.socket_path, "/run/a ;b.sock");
        /* the same values in a file are still refused */
        parse_fails("[daemon]\nstate_dir = /srv/run #1\n", "test.conf:2: [daemon] state_dir", "holds a comment",
                    NULL);
}

/*
 * "job = train # big one" governed a job named "train # big one", never "train", without a word: a job
 * name is refused with a blank and '#' or ';' in it, as a path is; one without a blank before it is a name.
 * The quota state file (quota_rules_parse_text(), where tierctl quota set's names are kept) is not a
 * line of tierd.conf: a name set there with a blank and '#' reads back whole.
 */
static void test_inline_comment_in_job(_unused_ void **state) {
        _cleanup_config_ Config c;
        _cleanup_free_ char *error = NULL;
        QuotaRules rs = {};

        parse_fails("[quota]\njob = train # big one\nhost = 1G\n", "test.conf:2: [quota] job", "holds a comment",
                    "line of its own", NULL);
        parse_fails("[quota]\nhost = 1G\njob = train\t;x\n", "test.conf:3: [quota] job", "holds a comment", NULL);
        parse_ok(&c, "[quota]\njob = run#2;a\nhost = 1G\n");
        assert_string_equal(c.quotas.rules[0].job, "run#2;a");
        if (quota_rules_parse_text(&rs, "[quota]\njob = train # big one\nhost = 1G\n", "quotas", &error) < 0)
                fail_msg("the state file's job name refused: %s", error);
        assert_string_equal(rs.rules[0].job, "train # big one");
        quota_rules_clear(&rs);
}

/*
 * A [quota] job name no job can have (a bidirectional format character, a C1 control, bytes not UTF-8):
 * refused, saying the escaped text such a job is restored under.  It was taken, governing nothing (a job
 * of that name from an older tierd is restored under the escaped text).  The quota state file takes it:
 * quota.c renames such a rule when tierd starts.
 */
static void test_job_name_characters(_unused_ void **state) {
        _cleanup_free_ char *error = NULL;
        QuotaRules rs = {};

        parse_fails("[quota]\njob = abc\xe2\x80\xae" "gpj.exe\nhost = 1G\n", "test.conf:2: [quota] job",
                    "contains the bidirectional format character U+202E", "text, 'abc\\u202egpj.exe' (cut with a ~hash",
                    "write the name tierctl jobs lists", NULL);
        parse_fails("[quota]\njob = evil\xc2\x9b" "31m\n", "contains control characters", "'evil\\u009b31m'", NULL);
        parse_fails("[quota]\njob = a\xff\n", "is not valid UTF-8", "'a\\xff'", NULL);
        if (quota_rules_parse_text(&rs, "[quota]\njob = abc\xe2\x80\xae" "gpj.exe\nhost = 1G\n", "quotas", &error) < 0)
                fail_msg("the state file's job name refused: %s", error);
        assert_string_equal(rs.rules[0].job, "abc\xe2\x80\xae" "gpj.exe");
        quota_rules_clear(&rs);
}

/* A byte order mark (an editor's "UTF-8 with BOM") is said as such, not as "missing '=' in '[daemon]'". */
static void test_byte_order_mark(_unused_ void **state) {
        parse_fails("\xEF\xBB\xBF[daemon]\nlog_level = info\n", "test.conf:1:", "byte order mark", NULL);
}

/* Write @text to @dir/@name. */
static void write_file(const char *dir, const char *name, const char *text) {
        char path[512];
        FILE *f;

        snprintf(path, sizeof(path), "%s/%s", dir, name);
        f = fopen(path, "we");
        assert_non_null(f);
        assert_int_equal(fputs(text, f) >= 0, 1);
        assert_int_equal(fclose(f), 0);
}

/* tierd.conf.d that is a file, not a directory of drop-ins: its lines used to be ignored without a word. */
static void test_dropin_dir_not_a_directory(_unused_ void **state) {
        _cleanup_config_ Config c;
        _cleanup_free_ char *error = NULL;
        char dir[] = "/tmp/test-config-syntax.XXXXXX", path[512], dropins[512];

        assert_non_null(mkdtemp(dir));
        snprintf(path, sizeof(path), "%s/tierd.conf", dir);
        snprintf(dropins, sizeof(dropins), "%s/tierd.conf.d", dir);
        write_file(dir, "tierd.conf", "[host]\njob_limit = 8M\n");
        write_file(dir, "tierd.conf.d", "[host]\njob_limit = 16M\n");

        assert_int_equal(config_load(&c, path, true, &error), -ENOTDIR);
        assert_non_null(error);
        if (!strstr(error, dropins) || !strstr(error, "not a directory"))
                fail_msg("message '%s'", error);
        error = mfree(error);

        /* none at all is fine: built-in defaults and the main file */
        assert_int_equal(unlink(dropins), 0);
        assert_int_equal(config_load(&c, path, true, &error), 0);
        assert_int_equal(c.host_job_limit, 8 * MIB);
        assert_int_equal(unlink(path), 0);
        assert_int_equal(rmdir(dir), 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_key_twice),
                cmocka_unit_test(test_quota_field_twice),
                cmocka_unit_test(test_quota_section_twice),
                cmocka_unit_test(test_repeatable),
                cmocka_unit_test(test_dropin_dir_not_a_directory),
                cmocka_unit_test(test_inline_comment_in_path),
                cmocka_unit_test(test_inline_comment_only_in_files),
                cmocka_unit_test(test_inline_comment_in_job),
                cmocka_unit_test(test_job_name_characters),
                cmocka_unit_test(test_byte_order_mark),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
