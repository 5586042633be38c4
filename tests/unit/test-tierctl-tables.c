/* SPDX-License-Identifier: MIT */
/*
 * tierctl's tables (client/tierctl/tables.c): names a client chose, with
 * control or bidirectional format characters (from a tierd older than its
 * name checks), are printed only escaped, and columns are counted as a
 * terminal shows them (CJK and emoji 2, combining marks 0), not in bytes.
 */

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <tier.h>

#include "client/tierctl/tables.h"
#include "tests/unit/screen-columns.h"

/* U+009B (CSI), ESC, DEL and a byte that is not UTF-8 */
static const char evil[] = "evil\xc2\x9b" "31m\x1b[2J\x7f\xff";
static const char evil_escaped[] = "evil\\u009b31m\\u001b[2J\\u007f\\xff";
static const char cafe[] = "caf\xc3\xa9-\xe5\xad\xa6";        /* 6 characters, 9 bytes */

/* No control character, nor the bad byte, in @out. */
static void assert_clean(const char *out) {
        assert_null(strchr(out, '\x1b'));
        assert_null(strchr(out, '\x7f'));
        assert_null(strchr(out, '\xff'));
        assert_null(strstr(out, "\xc2\x9b"));
}

/*
 * Names whose characters take other than one column: CJK (2 each), an emoji (2) and a combining
 * mark (0); each 4 columns on a terminal, as "abcd" (screen-columns.h: the test's own count).
 */
static const char *const wide[] = { "\xe5\xad\xa6\xe7\xbf\x92", "\xf0\x9f\x98\x80ru", "e\xcc\x81xyz", "abcd" };

/* The column (on a terminal, not bytes) where @what starts on the first line of @out that holds @line. */
static size_t column_of(const char *out, const char *line, const char *what) {
        const char *l = strstr(out, line), *w;
        size_t col = 0;

        assert_non_null(l);
        if (*l == '\n')
                l++;                    /* (@line may start with the newline before its line) */
        while (l > out && l[-1] != '\n')
                l--;
        w = strstr(l, what);
        assert_non_null(w);
        assert_true(!memchr(l, '\n', (size_t) (w - l)));
        col = screen_columns(l, w);
        return col;
}

static void test_jobs_table(void **state) {
        struct tier_job_info jobs[3] = {
                { .id = 11, .name = evil, .uid = 4001 },
                { .id = 12, .name = cafe, .uid = 4002 },
                { .id = 13, .name = "ab", .uid = 4003 },
        };
        char *out = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&out, &size);

        assert_non_null(f);
        jobs_table(f, jobs, 3);
        assert_int_equal(fclose(f), 0);
        assert_clean(out);
        assert_non_null(strstr(out, evil_escaped));
        assert_non_null(strstr(out, cafe));
        /* the UID column: the same character column in the header and every row */
        assert_int_equal(column_of(out, evil_escaped, "4001"), column_of(out, "NAME", "UID") + 3 - 4);      /* right-aligned: their ends */
        assert_int_equal(column_of(out, cafe, "4002"), column_of(out, evil_escaped, "4001"));
        assert_int_equal(column_of(out, "ab  ", "4003"), column_of(out, evil_escaped, "4001"));
        free(out);
}

/*
 * A name with bidirectional format characters (U+202E RLO, U+2067 RLI) is printed escaped: raw, "abc<RLO>gpj.exe"
 * reads "abcexe.jpg", and an RLO reorders the rest of its row (the UID column) on a terminal.
 */
static void test_jobs_table_bidi(void **state) {
        struct tier_job_info jobs[2] = {
                { .id = 11, .name = "abc\xe2\x80\xae" "gpj.exe", .uid = 4001 },
                { .id = 12, .name = "\xe2\x81\xa7" "x\xd8\x9c", .uid = 4002 },
        };
        char *out = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&out, &size);

        assert_non_null(f);
        jobs_table(f, jobs, 2);
        assert_int_equal(fclose(f), 0);
        assert_null(strstr(out, "\xe2\x80\xae"));
        assert_null(strstr(out, "\xe2\x81\xa7"));
        assert_null(strstr(out, "\xd8\x9c"));
        assert_non_null(strstr(out, "abc\\u202egpj.exe"));
        assert_non_null(strstr(out, "\\u2067x\\u061c"));
        assert_int_equal(column_of(out, "\\u2067x", "4002"), column_of(out, "abc\\u202e", "4001"));
        free(out);
}

static void test_tensors_table(void **state) {
        struct tier_tensor_info v[3] = {
                { .id = 1, .name = evil, .size = 4096 },
                { .id = 2, .name = cafe, .size = 8192 },
                { .id = 3, .name = "w", .size = 1024 },
        };
        char *out = NULL;
        size_t size = 0;
        FILE *f;

        v[0].state = TIER_TENSOR_LOST;
        v[0].lost_why = "its NVMe copy failed its crc32c (tensor 'x\x1b]0;owned\x07')";
        v[1].state = TIER_TENSOR_DATA;
        f = open_memstream(&out, &size);
        assert_non_null(f);
        tensors_table(f, "j", v, 3, 0);
        assert_int_equal(fclose(f), 0);
        assert_clean(out);
        assert_null(strchr(out, '\x07'));
        assert_non_null(strstr(out, cafe));
        /* its row and the line under the table that says why it is lost */
        assert_non_null(strstr(out, "\nevil\\u009b31m\\u001b[2J\\u007f\\xff  "));
        assert_non_null(strstr(out, "\nevil\\u009b31m\\u001b[2J\\u007f\\xff is lost: its NVMe copy failed its "
                                    "crc32c (tensor 'x\\u001b]0;owned\\u0007'); its reads fail"));
        /* SIZE right-aligned in the same column: its end at the same character */
        assert_int_equal(column_of(out, cafe, "8.0 KiB") + 7, column_of(out, evil_escaped, "4.0 KiB") + 7);
        assert_int_equal(column_of(out, "\nw ", "1.0 KiB"), column_of(out, evil_escaped, "4.0 KiB"));
        free(out);

        /* nothing to show: the job's name, escaped */
        f = open_memstream(&out, &size);
        assert_non_null(f);
        tensors_table(f, evil, v, 3, 1u << 20);
        assert_int_equal(fclose(f), 0);
        assert_clean(out);
        assert_string_equal(out, "job 'evil\\u009b31m\\u001b[2J\\u007f\\xff' has no tensors of that size\n");
        free(out);
}

static void test_quota_rows(void **state) {
        char *names[4] = { (char *) evil, NULL, (char *) cafe, (char *) "a" };
        struct tier_quota q = { .weight = 100 };
        char *out = NULL;
        size_t size = 0, w;
        FILE *f;

        w = quota_name_width(names, 4);
        assert_int_equal(w, strlen(evil_escaped));
        assert_int_equal(quota_name_width(names + 3, 1), 3);
        f = open_memstream(&out, &size);
        assert_non_null(f);
        quota_print_header(f, w);
        for (size_t i = 0; i < 4; i++)
                if (names[i])
                        quota_print_row(f, w, names[i], &q);
        assert_int_equal(fclose(f), 0);
        assert_clean(out);
        assert_int_equal(column_of(out, "JOB", "WEIGHT") + 6, column_of(out, evil_escaped, "100") + 3);
        assert_int_equal(column_of(out, cafe, "100"), column_of(out, evil_escaped, "100"));
        assert_int_equal(column_of(out, "\na ", "100"), column_of(out, evil_escaped, "100"));
        free(out);
}

/* The terminal column where @what ends on the line of @out that starts with @name. */
static size_t end_column(const char *out, const char *name, const char *what) {
        const char *l = out, *w;

        for (;;) {
                if (strncmp(l, name, strlen(name)) == 0 && l[strlen(name)] == ' ')
                        break;
                l = strchr(l, '\n');
                assert_non_null(l);
                l++;
        }
        w = strstr(l, what);
        assert_non_null(w);
        assert_true(!memchr(l, '\n', (size_t) (w - l)));
        return screen_columns(l, w) + strlen(what);
}

/* The columns after a wide name line up: before, CJK and emoji counted 1 and a combining mark 1. */
static void test_wide_names(void **state) {
        struct tier_job_info jobs[4];
        struct tier_tensor_info v[4];
        struct tier_quota q = { .weight = 100 };
        char *out = NULL, uid[4][8];
        size_t size = 0;
        FILE *f;

        for (size_t i = 0; i < 4; i++) {
                jobs[i] = (struct tier_job_info) { .id = 20 + i, .name = wide[i], .uid = 5000 + (uint32_t) i };
                v[i] = (struct tier_tensor_info) { .id = 1 + i, .name = wide[i], .size = 4096 };
                snprintf(uid[i], sizeof(uid[i]), "%zu", 5000 + i);
        }
        f = open_memstream(&out, &size);
        assert_non_null(f);
        jobs_table(f, jobs, 4);
        assert_int_equal(fclose(f), 0);
        for (size_t i = 0; i < 4; i++)
                assert_int_equal(end_column(out, wide[i], uid[i]), end_column(out, "NAME", "UID"));
        free(out);

        f = open_memstream(&out, &size);
        assert_non_null(f);
        tensors_table(f, "j", v, 4, 0);
        assert_int_equal(fclose(f), 0);
        for (size_t i = 0; i < 4; i++)
                assert_int_equal(end_column(out, wide[i], "4.0 KiB"), end_column(out, "abcd", "4.0 KiB"));
        free(out);

        assert_int_equal(quota_name_width((char **) wide, 4), 4);
        f = open_memstream(&out, &size);
        assert_non_null(f);
        quota_print_header(f, 4);
        for (size_t i = 0; i < 4; i++)
                quota_print_row(f, 4, wide[i], &q);
        assert_int_equal(fclose(f), 0);
        for (size_t i = 0; i < 4; i++)
                assert_int_equal(end_column(out, wide[i], "100"), end_column(out, "JOB", "WEIGHT"));
        free(out);
}

static void test_reason_text(void **state) {
        char buf[256];

        assert_string_equal(reason_text(buf, sizeof(buf), "no job 'evil\xc2\x9b" "2J'", -ENOENT),
                            "no job 'evil\\u009b2J'");
        assert_string_equal(reason_text(buf, sizeof(buf), "", -ENOENT), tier_strerror(-ENOENT));
        assert_string_equal(reason_text(buf, sizeof(buf), NULL, -EPERM), tier_strerror(-EPERM));
        assert_string_equal(reason_text(buf, 8, "abc\x1b", -EPERM), "abc");     /* cut between escapes */
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_jobs_table),
                cmocka_unit_test(test_jobs_table_bidi),
                cmocka_unit_test(test_tensors_table),
                cmocka_unit_test(test_quota_rows),
                cmocka_unit_test(test_wide_names),
                cmocka_unit_test(test_reason_text),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
