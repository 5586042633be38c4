/* SPDX-License-Identifier: MIT */
/*
 * screen_columns(): the columns text takes on a terminal, by the tests' own small rule for the
 * characters they use (CJK U+4E00..9FFF and emoji U+1F300..1FAFF: 2 each; combining marks
 * U+0300..036F: none; the rest 1), so that a table test does not check util/width.c against itself.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

static inline size_t screen_columns(const char *from, const char *to) {
        size_t col = 0;

        for (const unsigned char *p = (const unsigned char *) from; p < (const unsigned char *) to;) {
                uint32_t cp = *p;
                size_t n = *p < 0x80 ? 1 : *p < 0xe0 ? 2 : *p < 0xf0 ? 3 : 4;

                if (n > 1)
                        cp = *p & (0x3f >> (n - 1));
                for (size_t i = 1; i < n; i++)
                        cp = cp << 6 | (p[i] & 0x3f);
                p += n;
                col += (cp >= 0x4e00 && cp <= 0x9fff) || (cp >= 0x1f300 && cp <= 0x1faff) ? 2 :
                       cp >= 0x300 && cp <= 0x36f ? 0 : 1;
        }
        return col;
}
