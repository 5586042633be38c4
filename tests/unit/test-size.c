/* SPDX-License-Identifier: MIT */
/* test-size.c: the one size syntax (util/size.h), both formatters, round trips. */

#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "proto/macro.h"
#include "util/size.h"

static uint64_t parse_ok(const char *s) {
        uint64_t v = UINT64_C(0xdeadbeef);

        if (size_parse(s, &v) != 0)
                fail_msg("size_parse(\"%s\") failed", s);
        return v;
}

/* size_parse(@s) fails with @error and leaves the result alone. */
static void parse_fails(const char *s, int error) {
        uint64_t v = UINT64_C(0xdeadbeef);
        int r = size_parse(s, &v);

        if (r != error)
                fail_msg("size_parse(\"%s\") = %d, expected %d", s ? s : "(null)", r, error);
        assert_int_equal(v, UINT64_C(0xdeadbeef));
}

static void test_parse_plain(void **state) {
        assert_int_equal(parse_ok("0"), 0);
        assert_int_equal(parse_ok("1"), 1);
        assert_int_equal(parse_ok("4096"), 4096);
        assert_int_equal(parse_ok("007"), 7);
        assert_int_equal(parse_ok("0B"), 0);
        assert_int_equal(parse_ok("4096B"), 4096);
        assert_int_equal(parse_ok("18446744073709551615"), UINT64_MAX);
        assert_int_equal(parse_ok("18446744073709551615B"), UINT64_MAX);
}

/* Every unit, in both cases, bare and with "B" and "iB". */
static void test_parse_units(void **state) {
        static const char letters[] = "KMGTPE";

        for (unsigned i = 0; i < 6; i++) {
                static const char *const tails[] = { "", "B", "iB" };
                uint64_t unit = UINT64_C(1) << (10 * (i + 1));

                for (unsigned c = 0; c < 2; c++)
                        for (unsigned t = 0; t < ELEMENTSOF(tails); t++) {
                                char s[32];

                                (void) snprintf(s, sizeof(s), "3%c%s", c ? letters[i] : letters[i] + 'a' - 'A',
                                                tails[t]);
                                assert_int_equal(parse_ok(s), 3 * unit);
                        }
        }

        assert_int_equal(parse_ok("64K"), 65536);
        assert_int_equal(parse_ok("1G"), UINT64_C(1) << 30);
        assert_int_equal(parse_ok("1GB"), UINT64_C(1) << 30);
        assert_int_equal(parse_ok("1GiB"), UINT64_C(1) << 30);
        assert_int_equal(parse_ok("2t"), UINT64_C(2) << 40);
        assert_int_equal(parse_ok("0K"), 0);
        assert_int_equal(parse_ok("15E"), UINT64_C(15) << 60);
}

static void test_parse_rejects(void **state) {
        static const char *const bad[] = {
                "", "B", "K", "KiB", "iB",
                "-1", "+1", "-0", " 1", "1 ", "1 K", "1\t", "\n1",
                "1.5G", "1,5G", ".5K", "1.", "0x10", "0X10", "1e3", "1E3B",
                "1Kb", "1kb", "1b", "1Mbit", "1KIB", "1kIB", "1Ki", "1KiBB", "1KBB", "1BB", "1iB", "1i",
                "1X", "10X", "1KK", "1KM", "1k1", "1Z", "1Y", "1KB ", "one", "1\xc2\xa0K",
        };

        for (size_t i = 0; i < ELEMENTSOF(bad); i++)
                parse_fails(bad[i], -EINVAL);
        parse_fails(NULL, -EINVAL);
        assert_int_equal(size_parse("1", NULL), -EINVAL);
}

/* The largest value of each unit parses, one more is -ERANGE. */
static void test_parse_overflow(void **state) {
        static const char letters[] = "KMGTPE";

        parse_fails("18446744073709551616", -ERANGE);
        parse_fails("99999999999999999999", -ERANGE);
        parse_fails("99999999999999999999K", -ERANGE);
        parse_fails("184467440737095516150", -ERANGE);
        /* a syntax error is reported as such, however large the number */
        parse_fails("99999999999999999999X", -EINVAL);
        parse_fails("99999999999999999999 ", -EINVAL);

        for (unsigned i = 0; i < 6; i++) {
                unsigned shift = 10 * (i + 1);
                uint64_t max = UINT64_MAX >> shift;
                char s[48];

                (void) snprintf(s, sizeof(s), "%" PRIu64 "%c", max, letters[i]);
                assert_int_equal(parse_ok(s), max << shift);
                (void) snprintf(s, sizeof(s), "%" PRIu64 "%ciB", max + 1, letters[i]);
                parse_fails(s, -ERANGE);
                (void) snprintf(s, sizeof(s), "%" PRIu64 "%c", max + 1, letters[i] + 'a' - 'A');
                parse_fails(s, -ERANGE);
        }
        parse_fails("16E", -ERANGE);
        parse_fails("16384P", -ERANGE);
}

static void test_format(void **state) {
        char buf[SIZE_FORMAT_MAX];

        assert_ptr_equal(size_format(buf, sizeof(buf), 0), buf);
        assert_string_equal(size_format(buf, sizeof(buf), 0), "0 B");
        assert_string_equal(size_format(buf, sizeof(buf), 1), "1 B");
        assert_string_equal(size_format(buf, sizeof(buf), 1023), "1023 B");
        assert_string_equal(size_format(buf, sizeof(buf), 1024), "1.0 KiB");
        assert_string_equal(size_format(buf, sizeof(buf), 1536), "1.5 KiB");
        /* nearest tenth, halves up: 1.0498 and 1.0508 KiB */
        assert_string_equal(size_format(buf, sizeof(buf), 1075), "1.0 KiB");
        assert_string_equal(size_format(buf, sizeof(buf), 1076), "1.1 KiB");
        assert_string_equal(size_format(buf, sizeof(buf), 1024 + 1024 / 20), "1.0 KiB");
        assert_string_equal(size_format(buf, sizeof(buf), 1023 * 1024 + 972), "1023.9 KiB");
        /* 1023.95 KiB and up round to 1024.0 KiB, which is written 1.0 MiB */
        assert_string_equal(size_format(buf, sizeof(buf), 1023 * 1024 + 973), "1.0 MiB");
        assert_string_equal(size_format(buf, sizeof(buf), 1048575), "1.0 MiB");
        assert_string_equal(size_format(buf, sizeof(buf), 1048576), "1.0 MiB");
        assert_string_equal(size_format(buf, sizeof(buf), UINT64_C(512) << 20), "512.0 MiB");
        assert_string_equal(size_format(buf, sizeof(buf), (UINT64_C(1) << 30) - 1), "1.0 GiB");
        assert_string_equal(size_format(buf, sizeof(buf), UINT64_C(3) << 40), "3.0 TiB");
        assert_string_equal(size_format(buf, sizeof(buf), (UINT64_C(1) << 50) - 1), "1.0 PiB");
        assert_string_equal(size_format(buf, sizeof(buf), (UINT64_C(1) << 60) - 1), "1.0 EiB");
        assert_string_equal(size_format(buf, sizeof(buf), UINT64_C(5) << 59), "2.5 EiB");
        assert_string_equal(size_format(buf, sizeof(buf), UINT64_MAX), "16.0 EiB");

        /* the carry at every unit boundary (below 1024 bytes, counts are exact) */
        for (unsigned i = 1; i <= 6; i++) {
                static const char *const names[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
                char want[32];

                (void) snprintf(want, sizeof(want), "1.0 %s", names[i]);
                if (i > 1)
                        assert_string_equal(size_format(buf, sizeof(buf), (UINT64_C(1) << (10 * i)) - 1), want);
                assert_string_equal(size_format(buf, sizeof(buf), UINT64_C(1) << (10 * i)), want);
        }

        /* the constant is enough for the longest output */
        assert_true(strlen(size_format(buf, sizeof(buf), UINT64_C(1023) << 50)) < SIZE_FORMAT_MAX);
        assert_string_equal(FORMAT_SIZE(UINT64_C(1) << 20), "1.0 MiB");
}

/* Formerly tests/unit/test-client.c's test_format_bytes(), the values tierctl status shows. */
static void test_format_status_values(void **state) {
        assert_string_equal(FORMAT_SIZE(0), "0 B");
        assert_string_equal(FORMAT_SIZE(1023), "1023 B");
        assert_string_equal(FORMAT_SIZE(1024), "1.0 KiB");
        assert_string_equal(FORMAT_SIZE(1536), "1.5 KiB");
        assert_string_equal(FORMAT_SIZE(512ull << 20), "512.0 MiB");
        assert_string_equal(FORMAT_SIZE((1ull << 30) - 1), "1.0 GiB");
        assert_string_equal(FORMAT_SIZE(3ull << 40), "3.0 TiB");
        assert_string_equal(FORMAT_SIZE(UINT64_MAX), "16.0 EiB");
}

static void test_format_short_buffer(void **state) {
        char buf[5];

        assert_string_equal(size_format(buf, sizeof(buf), UINT64_C(512) << 20), "512.");
        assert_string_equal(size_format_exact(buf, sizeof(buf), 123456), "1234");
}

static void test_format_exact(void **state) {
        char buf[SIZE_FORMAT_MAX];

        assert_ptr_equal(size_format_exact(buf, sizeof(buf), 0), buf);
        assert_string_equal(size_format_exact(buf, sizeof(buf), 0), "0");
        assert_string_equal(size_format_exact(buf, sizeof(buf), 1), "1");
        assert_string_equal(size_format_exact(buf, sizeof(buf), 1000), "1000");
        assert_string_equal(size_format_exact(buf, sizeof(buf), 1023), "1023");
        assert_string_equal(size_format_exact(buf, sizeof(buf), 1024), "1K");
        assert_string_equal(size_format_exact(buf, sizeof(buf), 1536), "1536");
        assert_string_equal(size_format_exact(buf, sizeof(buf), 3072), "3K");
        assert_string_equal(size_format_exact(buf, sizeof(buf), UINT64_C(64) << 20), "64M");
        assert_string_equal(size_format_exact(buf, sizeof(buf), UINT64_C(1536) << 20), "1536M");
        assert_string_equal(size_format_exact(buf, sizeof(buf), UINT64_C(3) << 30), "3G");
        assert_string_equal(size_format_exact(buf, sizeof(buf), UINT64_C(1) << 40), "1T");
        assert_string_equal(size_format_exact(buf, sizeof(buf), UINT64_C(1) << 50), "1P");
        assert_string_equal(size_format_exact(buf, sizeof(buf), UINT64_C(1) << 60), "1E");
        assert_string_equal(size_format_exact(buf, sizeof(buf), UINT64_C(8) << 60), "8E");
        assert_string_equal(size_format_exact(buf, sizeof(buf), UINT64_C(15) << 60), "15E");
        assert_string_equal(size_format_exact(buf, sizeof(buf), UINT64_MAX), "18446744073709551615");
        assert_string_equal(size_format_exact(buf, sizeof(buf), UINT64_MAX << 10), "18014398509481983K");
        assert_string_equal(FORMAT_SIZE_EXACT(UINT64_C(1) << 20), "1M");
}

static void round_trip(uint64_t v) {
        char buf[SIZE_FORMAT_MAX];
        uint64_t back = 0;

        size_format_exact(buf, sizeof(buf), v);
        assert_int_equal(size_parse(buf, &back), 0);
        if (back != v)
                fail_msg("%" PRIu64 " -> \"%s\" -> %" PRIu64, v, buf, back);
}

static void test_round_trip(void **state) {
        uint64_t x = UINT64_C(0x9e3779b97f4a7c15);

        for (unsigned shift = 0; shift < 64; shift++) {
                uint64_t p = UINT64_C(1) << shift;

                round_trip(p);
                round_trip(p - 1);
                round_trip(p + 1);
                round_trip(UINT64_MAX << shift);
                round_trip(UINT64_MAX >> shift);
        }
        /* xorshift64, masked to a random number of low zero bits */
        for (unsigned i = 0; i < 100000; i++) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                round_trip(x & (UINT64_MAX << (x % 64)));
                round_trip(x >> (x % 64));
        }
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_parse_plain),
                cmocka_unit_test(test_parse_units),
                cmocka_unit_test(test_parse_rejects),
                cmocka_unit_test(test_parse_overflow),
                cmocka_unit_test(test_format),
                cmocka_unit_test(test_format_status_values),
                cmocka_unit_test(test_format_short_buffer),
                cmocka_unit_test(test_format_exact),
                cmocka_unit_test(test_round_trip),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
