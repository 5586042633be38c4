/* SPDX-License-Identifier: MIT */
/* jsonget.h: read a few values out of a JSON document by path (tierctl links no JSON parser). */
#pragma once

#include <stddef.h>

/*
 * @path is keys and array indexes joined by '.', e.g. "tiers.1.capacity" or
 * "best.read.gbps"; "" is the document itself.  The document must be
 * well-formed where it is walked; nesting deeper than 64 is refused.
 *
 * jget_number(): -ENOENT when the path is not there, -ENODATA when the value
 * is null, -EINVAL when it is not a number (or the document is malformed).
 * jget_length(): the number of elements of the array (or members of the
 * object) at @path; errors as above.
 * jget_string(): copies the string (escapes other than \" and \\ kept as
 * they are) into @buf; -ENOSPC when it does not fit.
 */
int jget_number(const char *doc, const char *path, double *ret);
int jget_length(const char *doc, const char *path, size_t *ret);
int jget_string(const char *doc, const char *path, char *buf, size_t size);
int jget_bool(const char *doc, const char *path, int *ret);

/*
 * Cursors, for walking a long array once (each jget_*() walks @doc from its
 * start): jget_at() is where the value at @path begins, NULL when it is not
 * there; it can be the @doc of the calls above.  jget_next() is where the
 * element after the one at @elem begins, NULL after the last (or when the
 * document is malformed there).
 */
const char *jget_at(const char *doc, const char *path);
const char *jget_next(const char *elem);
