/* SPDX-License-Identifier: MIT */
/* test-crc32c.c: CRC-32C known vectors, fast path against the table path, chaining. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "proto/crc32c.h"
#include "proto/macro.h"

typedef uint32_t (*CrcFn)(uint32_t crc, const void *buf, size_t len);

static const struct {
        const char *name;
        CrcFn fn;
} impls[] = {
        { "crc32c", crc32c },
        { "crc32c_sw", crc32c_sw },
};

/* Deterministic xorshift64, so a failure reproduces. */
static uint64_t rng_state = UINT64_C(0x9e3779b97f4a7c15);

static uint64_t rng(void) {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        return rng_state;
}

static void fill_random(unsigned char *p, size_t n) {
        for (size_t i = 0; i < n; i++)
                p[i] = (unsigned char) rng();
}

/* RFC 3720 B.4 and the usual check value. */
static void test_known_vectors(_unused_ void **state) {
        unsigned char zeros[32], ones[32], inc[32], dec[32];

        memset(zeros, 0, sizeof(zeros));
        memset(ones, 0xff, sizeof(ones));
        for (unsigned i = 0; i < 32; i++) {
                inc[i] = (unsigned char) i;
                dec[i] = (unsigned char) (31 - i);
        }

        for (size_t i = 0; i < ELEMENTSOF(impls); i++) {
                CrcFn f = impls[i].fn;

                assert_int_equal(f(0, "", 0), 0);
                assert_int_equal(f(0, NULL, 0), 0);
                assert_int_equal(f(0x12345678, NULL, 0), 0x12345678);
                assert_int_equal(f(0, "123456789", 9), 0xe3069283);
                assert_int_equal(f(0, "a", 1), 0xc1d04330);
                assert_int_equal(f(0, zeros, sizeof(zeros)), 0x8a9136aa);
                assert_int_equal(f(0, ones, sizeof(ones)), 0x62a8ab43);
                assert_int_equal(f(0, inc, sizeof(inc)), 0x46dd794e);
                assert_int_equal(f(0, dec, sizeof(dec)), 0x113fdb5c);
        }
}

/* Every length 0..300 at every alignment 0..15: covers all head/tail splits. */
static void test_fast_matches_sw_small(_unused_ void **state) {
        _cleanup_free_ unsigned char *buf = malloc(300 + 16);

        assert_non_null(buf);
        fill_random(buf, 300 + 16);

        for (size_t align = 0; align < 16; align++)
                for (size_t len = 0; len <= 300; len++) {
                        uint32_t seed = (uint32_t) rng();

                        assert_int_equal(crc32c(0, buf + align, len), crc32c_sw(0, buf + align, len));
                        assert_int_equal(crc32c(seed, buf + align, len), crc32c_sw(seed, buf + align, len));
                }
}

/*
 * Lengths around the 3-way block boundaries of the crc32q path (3 * 256, 3 *
 * 8192) and around the folding path's start (2048) and rounds (256 bytes),
 * with a zero and a random starting CRC.
 */
static void test_fast_matches_sw_large(_unused_ void **state) {
        static const size_t lengths[] = {
                767, 768, 769, 775, 776, 1536, 2047, 2048, 2049, 2055, 2056, 2303, 2304, 2305, 2559, 2560,
                4096, 4096 + 255, 4096 + 257, 24575, 24576, 24577, 24583,
                24576 + 768, 24576 + 767, 49152, 65536 + 13, 100000, (1u << 20) + 3,
        };
        const size_t max = (1u << 20) + 3 + 8;
        _cleanup_free_ unsigned char *buf = malloc(max);

        assert_non_null(buf);
        fill_random(buf, max);

        for (size_t i = 0; i < ELEMENTSOF(lengths); i++)
                for (size_t align = 0; align < 8; align += 3) {
                        uint32_t seed = (uint32_t) rng();

                        assert_int_equal(crc32c(0, buf + align, lengths[i]),
                                         crc32c_sw(0, buf + align, lengths[i]));
                        assert_int_equal(crc32c(seed, buf + align, lengths[i]),
                                         crc32c_sw(seed, buf + align, lengths[i]));
                }
}

/* crc(a || b) == crc(crc(a), b) for every split, in both implementations. */
static void test_chaining(_unused_ void **state) {
        unsigned char buf[1000];

        fill_random(buf, sizeof(buf));

        for (size_t i = 0; i < ELEMENTSOF(impls); i++) {
                CrcFn f = impls[i].fn;
                uint32_t whole = f(0, buf, sizeof(buf));

                for (size_t split = 0; split <= sizeof(buf); split++)
                        assert_int_equal(f(f(0, buf, split), buf + split, sizeof(buf) - split), whole);

                /* Byte by byte. */
                uint32_t c = 0;
                for (size_t k = 0; k < sizeof(buf); k++)
                        c = f(c, buf + k, 1);
                assert_int_equal(c, whole);
        }

        /* "123456789" in pieces. */
        assert_int_equal(crc32c(crc32c(0, "1234", 4), "56789", 5), 0xe3069283);
        assert_int_equal(crc32c_sw(crc32c(0, "12345", 5), "6789", 4), 0xe3069283);
}

/* Big buffer split at unaligned points across the fast path's long blocks. */
static void test_chaining_large(_unused_ void **state) {
        const size_t n = 200000;
        _cleanup_free_ unsigned char *buf = malloc(n);
        uint32_t whole;

        assert_non_null(buf);
        fill_random(buf, n);
        whole = crc32c_sw(0, buf, n);
        assert_int_equal(crc32c(0, buf, n), whole);

        for (size_t split = 1; split < n; split += 24577)
                assert_int_equal(crc32c(crc32c(0, buf, split), buf + split, n - split), whole);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_known_vectors),
                cmocka_unit_test(test_fast_matches_sw_small),
                cmocka_unit_test(test_fast_matches_sw_large),
                cmocka_unit_test(test_chaining),
                cmocka_unit_test(test_chaining_large),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
