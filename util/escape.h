/* SPDX-License-Identifier: MIT */
/* escape.h: client-supplied text (job and tensor names) made safe to print on a terminal. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* The most bytes text_escape() writes for one byte of its input (U+0001 becomes "\u0001"). */
#define TEXT_ESCAPE_GROWTH 6

/*
 * text_escape() - @s as text that is safe to print: every control character
 * (Unicode's Cc: C0 U+0000..U+001F, DEL U+007F, C1 U+0080..U+009F) becomes
 * "\u00xx" (lowercase hex; U+009B, CSI, is "\u009b"), every bidirectional
 * format character (U+061C, U+200E, U+200F, U+202A..U+202E, U+2066..U+2069,
 * which would reorder the text after it) "\uxxxx" (U+202E, RLO, is
 * "\u202e"): proto/utf8.h utf8_unsafe_cp(), the characters names refuse.
 * Every byte that does not start a well-formed UTF-8 sequence (utf8_valid()'s
 * rules) becomes "\xNN"; all else, valid non-ASCII characters included (é,
 * CJK, emoji), is copied as it is.  A backslash is not escaped: a name tierd
 * takes holds none of those characters, so what is printed is the name, and
 * one that came from an older tierd is told by its escapes.
 *
 * Writes at most @size bytes into @buf, the NUL included, and never cuts an
 * escape or a character in two; returns @buf.  @size must be at least 1.
 */
char *text_escape(char *buf, size_t size, const char *s);
/* The same, whole, in a malloc()ed string; NULL: out of memory. */
char *text_escape_dup(const char *s);
/* The length of text_escape_dup(@s), NUL not counted. */
size_t text_escape_len(const char *s);
/*
 * The columns text_escape_dup(@s) takes on a terminal: "caf\u00e9" (é) is
 * 4, a wide character (CJK, emoji) 2, a combining mark 0 (util/width.c
 * text_char_width(), no locale needed: tierctl may run under LANG=C), an
 * escape as many as its bytes.
 */
size_t text_escape_width(const char *s);
/* Write text_escape_dup(@s) to @f (nothing allocated); then @pad - text_escape_width(@s) blanks, if more than 0. */
void text_escape_fputs(const char *s, FILE *f, size_t pad);
/* The most bytes text_escape_char() writes, a NUL after an escape included. */
#define TEXT_ESCAPE_CHAR_MAX 8
/*
 * One step of text_escape(): the escape, or the bytes, of the character @s
 * starts with (not its NUL) into @out, no NUL added; returns their length.
 * *@ret_in: the bytes of @s it took; *@ret_width (may be NULL): its columns
 * as text_escape_width() counts them.
 */
size_t text_escape_char(const char *s, char out[TEXT_ESCAPE_CHAR_MAX], size_t *ret_in, size_t *ret_width);
/* Whether text_escape() would change @s. */
bool text_needs_escape(const char *s);

/* The bytes text_escape_name() adds to a name it cuts: "~" and 8 hex digits. */
#define TEXT_ESCAPE_NAME_TAG 9

/*
 * text_escape_name() - the name a job or tensor named @s (by an older tierd:
 * control or bidirectional format characters, bytes not UTF-8) is restored
 * under, at most @max bytes (tierd's max_name, 16..4096): text_escape_dup(@s)
 * when it fits and @tagged is false; else its text cut to @max -
 * TEXT_ESCAPE_NAME_TAG bytes
 * (never in an escape) followed by "~" and a hash of @s in 8 hex digits, so
 * that two names cut alike stay apart (@tagged: the whole text was taken by
 * another name).  malloc()ed; NULL: out of memory, or @max below 16.
 */
char *text_escape_name(const char *s, size_t max, bool tagged);
