/* SPDX-License-Identifier: MIT */
/* crc32c.c: CRC-32C (Castagnoli) with an SSE4.2 fast path and a slicing-by-8 fallback. */

/*
 * Theory of operation
 *
 * CRC-32C is the reflected CRC with polynomial 0x1EDC6F41 (0x82F63B78 bit
 * reversed), initial register ~0 and final inversion.  Both paths below
 * work on the raw register: crc32c() inverts on the way in and out, so a
 * CRC can be continued across calls by passing the previous result.
 *
 * Software path: slicing-by-8.  Table k maps a byte to the register
 * contribution of that byte followed by k zero bytes, so eight table
 * lookups consume eight input bytes per iteration with no dependency
 * between the lookups.
 *
 * Hardware path (x86-64 with SSE4.2): the crc32q instruction folds eight
 * bytes into the register, with a latency of about three cycles but a
 * throughput of one per cycle.  A single dependency chain therefore runs at a
 * third of the possible speed, so large buffers are cut into three adjacent
 * blocks of equal length that are processed as three independent chains.
 * The chains are recombined with the linearity of the CRC:
 *
 *     reg(A || B) = shift(reg(A), |B|) ^ reg_from_zero(B)
 *
 * where shift(r, n) advances a register over n zero bytes, i.e. multiplies
 * it by x^(8n) modulo P.  For the two fixed block lengths used (CRC32C_LONG
 * and CRC32C_SHORT) shift() is a linear map on 32 bits, precomputed as four
 * 256-entry tables, one per register byte.
 *
 * Folding path (x86-64 with AVX-512 and VPCLMULQDQ, buffers of at least
 * CRC32C_FOLD_MIN bytes): crc32q is bound to 8 bytes a cycle, about half of
 * what one core reads from memory, so large buffers are folded instead.
 * Sixteen 128-bit lanes (four 512-bit registers) hold the message's first
 * 256 bytes; each round multiplies every lane by x^2048 modulo P (carry-less,
 * two 64x64 products per lane) and adds the next 256 bytes.  Since
 * reg(M) = M * x^32 mod P depends only on M mod P, the lanes are then folded
 * into one 128-bit value R with M = R (mod P) placed as the message's last
 * 16 bytes, whose CRC the crc32q instruction finishes.  In the reflected bit
 * order a 64-bit qword q holds the coefficients of x^63 (bit 0) down to x^0,
 * and a carry-less product of two such qwords lands one bit short of a
 * 128-bit value's, so a lane (hi * x^64 + lo) moved forward by d bits is
 * clmul(lo qword, x^(d+63) mod P) ^ clmul(hi qword, x^(d-1) mod P), the
 * constants held as 64-bit qwords (the 32-bit reflected value shifted up by
 * 32).  The constants are computed at start with the same arithmetic as the
 * zeros tables.
 *
 * All tables are computed once, on first use, under pthread_once(); the CPU
 * feature test runs at the same time.
 */

#include <endian.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "proto/crc32c.h"

#if defined(__x86_64__)
#  include <immintrin.h>
#  include <nmmintrin.h>
#  define CRC32C_HAVE_HW 1
#else
#  define CRC32C_HAVE_HW 0
#endif

/* Reflected Castagnoli polynomial. */
#define CRC32C_POLY 0x82f63b78u

/* Block lengths of the 3-way interleave: long enough that the recombination
 * (8 table lookups) is noise, short enough that a 4K buffer still benefits. */
#define CRC32C_LONG 8192u
#define CRC32C_SHORT 256u
/* From this length on the folding path, where the CPU has it (its setup and
 * final reduction cost about as much as 1 KiB of crc32q). */
#define CRC32C_FOLD_MIN 2048u

static uint32_t crc32c_table[8][256];
static pthread_once_t crc32c_once = PTHREAD_ONCE_INIT;

#if CRC32C_HAVE_HW
static uint32_t crc32c_long[4][256];
static uint32_t crc32c_short[4][256];
static bool crc32c_have_hw;
/* The folding path: whether the CPU has it, and its constants (theory of operation). */
static bool crc32c_have_fold;
static uint64_t crc32c_fold_2048[2], crc32c_fold_512[2], crc32c_fold_lane[3][2];

/* Multiply a and b modulo P (both reflected: bit 31 is x^0). */
static uint32_t crc32c_multmodp(uint32_t a, uint32_t b) {
        uint32_t m = UINT32_C(1) << 31, p = 0;

        for (;;) {
                if (a & m) {
                        p ^= b;
                        if ((a & (m - 1)) == 0)
                                break;
                }
                m >>= 1;
                b = b & 1 ? (b >> 1) ^ CRC32C_POLY : b >> 1;
        }
        return p;
}

/* x^(8 * n) modulo P. */
static uint32_t crc32c_x8nmodp(uint64_t n) {
        uint32_t p = UINT32_C(1) << 31;    /* x^0 */
        uint32_t sq = UINT32_C(1) << 30;   /* x^1 */

        /* sq runs through x^(2^k); start at k = 3, i.e. x^8 per byte. */
        for (unsigned k = 0; k < 3; k++)
                sq = crc32c_multmodp(sq, sq);
        while (n > 0) {
                if (n & 1)
                        p = crc32c_multmodp(sq, p);
                sq = crc32c_multmodp(sq, sq);
                n >>= 1;
        }
        return p;
}

/* x^n modulo P. */
static uint32_t crc32c_xnmodp(uint64_t n) {
        return crc32c_multmodp(crc32c_x8nmodp(n / 8), (UINT32_C(1) << 31) >> (n % 8));
}

/* The pair of folding constants that moves a 128-bit lane forward by @d bits (d >= 64). */
static void crc32c_fold_consts(uint64_t k[2], uint64_t d) {
        k[0] = (uint64_t) crc32c_xnmodp(d + 63) << 32;
        k[1] = (uint64_t) crc32c_xnmodp(d - 1) << 32;
}

/* Tabulate the linear map "advance the register over @len zero bytes". */
static void crc32c_zeros_table(uint32_t t[4][256], uint32_t len) {
        uint32_t op = crc32c_x8nmodp(len);

        for (unsigned k = 0; k < 4; k++)
                for (unsigned b = 0; b < 256; b++)
                        t[k][b] = crc32c_multmodp(op, (uint32_t) b << (8 * k));
}
#endif

static void crc32c_setup(void) {
        for (uint32_t n = 0; n < 256; n++) {
                uint32_t c = n;

                for (unsigned k = 0; k < 8; k++)
                        c = c & 1 ? (c >> 1) ^ CRC32C_POLY : c >> 1;
                crc32c_table[0][n] = c;
        }
        for (uint32_t n = 0; n < 256; n++) {
                uint32_t c = crc32c_table[0][n];

                for (unsigned k = 1; k < 8; k++) {
                        c = crc32c_table[0][c & 0xff] ^ (c >> 8);
                        crc32c_table[k][n] = c;
                }
        }

#if CRC32C_HAVE_HW
        __builtin_cpu_init();
        crc32c_have_hw = __builtin_cpu_supports("sse4.2");
        if (crc32c_have_hw) {
                crc32c_zeros_table(crc32c_long, CRC32C_LONG);
                crc32c_zeros_table(crc32c_short, CRC32C_SHORT);
        }
        crc32c_have_fold = crc32c_have_hw && __builtin_cpu_supports("avx512f") &&
                           __builtin_cpu_supports("vpclmulqdq") && !getenv("TIER_CRC32C_NO_FOLD");
        if (crc32c_have_fold) {
                crc32c_fold_consts(crc32c_fold_2048, 2048);
                crc32c_fold_consts(crc32c_fold_512, 512);
                for (unsigned i = 0; i < 3; i++)
                        crc32c_fold_consts(crc32c_fold_lane[i], 128 * (3 - i));
        }
#endif
}

static inline void crc32c_init_once(void) {
        (void) pthread_once(&crc32c_once, crc32c_setup);
}

static inline uint64_t load_le64(const unsigned char *p) {
        uint64_t v;

        memcpy(&v, p, sizeof(v));
        return le64toh(v);
}

static uint32_t crc32c_sw_raw(uint32_t reg, const unsigned char *p, size_t len) {
        while (len > 0 && ((uintptr_t) p & 7) != 0) {
                reg = crc32c_table[0][(reg ^ *p++) & 0xff] ^ (reg >> 8);
                len--;
        }
        while (len >= 8) {
                uint64_t w = load_le64(p) ^ reg;

                reg = crc32c_table[7][w & 0xff] ^
                      crc32c_table[6][(w >> 8) & 0xff] ^
                      crc32c_table[5][(w >> 16) & 0xff] ^
                      crc32c_table[4][(w >> 24) & 0xff] ^
                      crc32c_table[3][(w >> 32) & 0xff] ^
                      crc32c_table[2][(w >> 40) & 0xff] ^
                      crc32c_table[1][(w >> 48) & 0xff] ^
                      crc32c_table[0][w >> 56];
                p += 8;
                len -= 8;
        }
        while (len > 0) {
                reg = crc32c_table[0][(reg ^ *p++) & 0xff] ^ (reg >> 8);
                len--;
        }
        return reg;
}

uint32_t crc32c_sw(uint32_t crc, const void *buf, size_t len) {
        crc32c_init_once();
        return ~crc32c_sw_raw(~crc, buf, len);
}

#if CRC32C_HAVE_HW
static inline uint32_t crc32c_shift(const uint32_t t[4][256], uint32_t reg) {
        return t[0][reg & 0xff] ^ t[1][(reg >> 8) & 0xff] ^ t[2][(reg >> 16) & 0xff] ^ t[3][reg >> 24];
}

/* Consume 3 * @block bytes at *@pp as three interleaved chains while @len allows. */
__attribute__((target("sse4.2")))
static inline uint64_t crc32c_hw_3way(uint64_t reg, const unsigned char **pp, size_t *len,
                                      size_t block, const uint32_t t[4][256]) {
        const unsigned char *p = *pp;

        while (*len >= 3 * block) {
                uint64_t reg1 = 0, reg2 = 0;
                const unsigned char *end = p + block;

                do {
                        reg = _mm_crc32_u64(reg, load_le64(p));
                        reg1 = _mm_crc32_u64(reg1, load_le64(p + block));
                        reg2 = _mm_crc32_u64(reg2, load_le64(p + 2 * block));
                        p += 8;
                } while (p < end);
                reg = crc32c_shift(t, (uint32_t) reg) ^ reg1;
                reg = crc32c_shift(t, (uint32_t) reg) ^ reg2;
                p += 2 * block;
                *len -= 3 * block;
        }
        *pp = p;
        return reg;
}

__attribute__((target("sse4.2")))
static uint32_t crc32c_hw_raw(uint32_t reg32, const unsigned char *p, size_t len) {
        uint64_t reg = reg32;

        while (len > 0 && ((uintptr_t) p & 7) != 0) {
                reg = _mm_crc32_u8((uint32_t) reg, *p++);
                len--;
        }
        reg = crc32c_hw_3way(reg, &p, &len, CRC32C_LONG, crc32c_long);
        reg = crc32c_hw_3way(reg, &p, &len, CRC32C_SHORT, crc32c_short);
        while (len >= 8) {
                reg = _mm_crc32_u64(reg, load_le64(p));
                p += 8;
                len -= 8;
        }
        while (len > 0) {
                reg = _mm_crc32_u8((uint32_t) reg, *p++);
                len--;
        }
        return (uint32_t) reg;
}
#endif

#define CRC32C_TARGET_FOLD __attribute__((target("sse4.2,pclmul,avx512f,vpclmulqdq")))

/* Every 128-bit lane of @x moved forward by the distance of @k (crc32c_fold_consts()). */
CRC32C_TARGET_FOLD
static inline __m512i crc32c_fold512(__m512i x, __m512i k) {
        return _mm512_xor_si512(_mm512_clmulepi64_epi128(x, k, 0x00), _mm512_clmulepi64_epi128(x, k, 0x11));
}

CRC32C_TARGET_FOLD
static inline __m128i crc32c_fold128(__m128i x, const uint64_t k[2]) {
        __m128i kk = _mm_set_epi64x((long long) k[1], (long long) k[0]);

        return _mm_xor_si128(_mm_clmulepi64_si128(x, kk, 0x00), _mm_clmulepi64_si128(x, kk, 0x11));
}

/*
 * The raw register after @len >= CRC32C_FOLD_MIN bytes at @p (theory of
 * operation): the multiple of 256 bytes folded, the rest by crc32q.
 */
CRC32C_TARGET_FOLD
static uint32_t crc32c_fold_raw(uint32_t reg32, const unsigned char *p, size_t len) {
        const __m512i k2048 = _mm512_broadcast_i32x4(_mm_set_epi64x((long long) crc32c_fold_2048[1],
                                                                    (long long) crc32c_fold_2048[0]));
        const __m512i k512 = _mm512_broadcast_i32x4(_mm_set_epi64x((long long) crc32c_fold_512[1],
                                                                   (long long) crc32c_fold_512[0]));
        __m512i a0, a1, a2, a3;
        __m128i r;
        uint64_t reg, q[2];

        /* the initial register goes into the message's first 32 bits */
        a0 = _mm512_xor_si512(_mm512_loadu_si512(p), _mm512_zextsi128_si512(_mm_cvtsi32_si128((int) reg32)));
        a1 = _mm512_loadu_si512(p + 64);
        a2 = _mm512_loadu_si512(p + 128);
        a3 = _mm512_loadu_si512(p + 192);
        p += 256;
        len -= 256;
        while (len >= 256) {
                a0 = _mm512_xor_si512(crc32c_fold512(a0, k2048), _mm512_loadu_si512(p));
                a1 = _mm512_xor_si512(crc32c_fold512(a1, k2048), _mm512_loadu_si512(p + 64));
                a2 = _mm512_xor_si512(crc32c_fold512(a2, k2048), _mm512_loadu_si512(p + 128));
                a3 = _mm512_xor_si512(crc32c_fold512(a3, k2048), _mm512_loadu_si512(p + 192));
                p += 256;
                len -= 256;
        }
        /* four registers into the last one (64 bytes apart), then its four lanes into the last lane */
        a1 = _mm512_xor_si512(crc32c_fold512(a0, k512), a1);
        a2 = _mm512_xor_si512(crc32c_fold512(a1, k512), a2);
        a3 = _mm512_xor_si512(crc32c_fold512(a2, k512), a3);
        r = _mm512_extracti32x4_epi32(a3, 3);
        r = _mm_xor_si128(r, crc32c_fold128(_mm512_extracti32x4_epi32(a3, 0), crc32c_fold_lane[0]));
        r = _mm_xor_si128(r, crc32c_fold128(_mm512_extracti32x4_epi32(a3, 1), crc32c_fold_lane[1]));
        r = _mm_xor_si128(r, crc32c_fold128(_mm512_extracti32x4_epi32(a3, 2), crc32c_fold_lane[2]));
        _mm_storeu_si128((__m128i *) q, r);
        /* R's CRC from a zero register, then the tail */
        reg = _mm_crc32_u64(0, q[0]);
        reg = _mm_crc32_u64(reg, q[1]);
        return crc32c_hw_raw((uint32_t) reg, p, len);
}

uint32_t crc32c(uint32_t crc, const void *buf, size_t len) {
        crc32c_init_once();
#if CRC32C_HAVE_HW
        if (crc32c_have_fold && len >= CRC32C_FOLD_MIN)
                return ~crc32c_fold_raw(~crc, buf, len);
        if (crc32c_have_hw)
                return ~crc32c_hw_raw(~crc, buf, len);
#endif
        return ~crc32c_sw_raw(~crc, buf, len);
}
