/* SPDX-License-Identifier: MIT */
/*
 * tables.h: tierctl's text tables of jobs, tensors and quotas, and the
 * reasons tierd gives, as printed: every name a client chose (and every
 * reason, which may quote one) goes through util/escape.c, so that no
 * control character reaches the terminal; columns are counted in
 * characters.  No tierd needed: unit/tierctl-tables tests them.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <tier.h>

/* "absent", "filling", "resident", "draining"; "unknown" for another value. */
const char *copy_state_name(int s);
/* What a tensor's data is: "data", "unwritten", "dead", "lost"; NULL when tierd did not say. */
const char *tensor_state_name(int state);

/* tierctl jobs: one row per job ("no jobs" for none). */
void jobs_table(FILE *f, const struct tier_job_info *jobs, size_t n);
/* tierctl tensors JOB: one row per tensor of at least @min bytes, then why each lost one is. */
void tensors_table(FILE *f, const char *job, const struct tier_tensor_info *v, size_t n, uint64_t min);

/* The width of quota get's JOB column for these names (NULL entries skipped): at least 3. */
size_t quota_name_width(char *const *names, size_t n);
void quota_print_header(FILE *f, size_t name_width);
void quota_print_row(FILE *f, size_t name_width, const char *job, const struct tier_quota *q);

/*
 * @reason (tierd's, or libtier's; it may quote a name) escaped into @buf of
 * @size bytes; tier_strerror(@r) when it is NULL or empty.  Returns the text.
 */
const char *reason_text(char *buf, size_t size, const char *reason, int r);
