/* SPDX-License-Identifier: MIT */
/* width.h: the columns a character takes on a terminal, without the locale. */
#pragma once

#include <stdint.h>

/*
 * text_char_width() - the columns code point @cp takes on a terminal, as
 * wcwidth() counts them under a UTF-8 locale, from a table of its own
 * (tierctl may run under LANG=C, where wcwidth() knows no CJK): 2 for East
 * Asian Wide and Fullwidth (CJK, kana, Hangul syllables, emoji presented as
 * emoji), 0 for combining marks (Mn, Me), format characters (Cf, but SOFT
 * HYPHEN) and Hangul medial and final jamo, 1 for everything else (a
 * control character included: the caller escapes those).  An emoji the
 * terminal draws wide only after VARIATION SELECTOR-16 counts 1 (its
 * table says text presentation), as wcwidth() does.
 */
unsigned text_char_width(uint32_t cp);
