/* SPDX-License-Identifier: MIT */
/* log.h: logging to the journal (structured fields) or to stderr. */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <syslog.h>

#include "proto/macro.h"

typedef enum LogTarget {
        LOG_TARGET_AUTO,
        LOG_TARGET_JOURNAL,
        LOG_TARGET_STDERR,
        _LOG_TARGET_MAX,
        _LOG_TARGET_INVALID = -22,
} LogTarget;

/*
 * log_setup() - choose the sink once, before the first message.  AUTO means
 * the journal when standard error is connected to it ($JOURNAL_STREAM names
 * the device and inode of fd 2, as systemd sets it for StandardError=journal),
 * standard error otherwise.
 */
void log_setup(LogTarget target);
void log_set_level(int level);
int log_get_level(void);
LogTarget log_target_from_string(const char *s);
int log_level_from_string(const char *s);
const char *log_level_to_string(int level);

/*
 * log_full() - log one message.  @error (a positive errno or 0) fills %m;
 * @fields is NULL or a NUL-separated, double-NUL-terminated list of extra
 * journal fields ("TIERD_JOB=x\0TIERD_TENSOR=y\0").  Returns -error.
 */
int log_full(int level, int error, const char *file, int line, const char *func,
             const char *fields, const char *fmt, ...) _printf_(7, 8);

#define log_full_errno(level, err, ...) \
        log_full(level, (err) < 0 ? -(err) : (err), __FILE__, __LINE__, __func__, NULL, __VA_ARGS__)
#define log_error(...) log_full_errno(LOG_ERR, 0, __VA_ARGS__)
#define log_warning(...) log_full_errno(LOG_WARNING, 0, __VA_ARGS__)
#define log_notice(...) log_full_errno(LOG_NOTICE, 0, __VA_ARGS__)
#define log_info(...) log_full_errno(LOG_INFO, 0, __VA_ARGS__)
#define log_debug(...) log_full_errno(LOG_DEBUG, 0, __VA_ARGS__)
#define log_error_errno(r, ...) log_full_errno(LOG_ERR, r, __VA_ARGS__)
#define log_warning_errno(r, ...) log_full_errno(LOG_WARNING, r, __VA_ARGS__)
#define log_debug_errno(r, ...) log_full_errno(LOG_DEBUG, r, __VA_ARGS__)
/* With structured fields, e.g. log_fields(LOG_INFO, 0, "TIERD_JOB=a\0", "...") */
#define log_fields(level, err, fields, ...) \
        log_full(level, (err) < 0 ? -(err) : (err), __FILE__, __LINE__, __func__, fields, __VA_ARGS__)

/*
 * log_object_full() - log_full() for a message about a job, a tensor and/or a
 * tier: adds the journal fields TIERD_JOB=@job, TIERD_TENSOR=@tensor and
 * TIERD_TIER=@tier (each left out when NULL), so that
 * "journalctl -u tierd TIERD_JOB=train7" finds everything about one job.
 * The strings are borrowed.  On standard error only the message is written:
 * it should name the job or tensor in its text as well.  Returns -error.
 */
int log_object_full(int level, int error, const char *file, int line, const char *func,
                    const char *job, const char *tensor, const char *tier,
                    const char *fmt, ...) _printf_(9, 10);

#define log_object(level, err, job, tensor, tier, ...)                                         \
        log_object_full(level, (err) < 0 ? -(err) : (err), __FILE__, __LINE__, __func__,       \
                        job, tensor, tier, __VA_ARGS__)
/* About a job: log_job(LOG_INFO, 0, j->name, "Job '%s' created", j->name) */
#define log_job(level, err, job, ...) log_object(level, err, job, NULL, NULL, __VA_ARGS__)
/* About a job's use of a tier ("vram", "host", "nvme": tier_to_string()) */
#define log_job_tier(level, err, job, tier, ...) log_object(level, err, job, NULL, tier, __VA_ARGS__)
/* About one tensor, optionally in one tier (@tier may be NULL) */
#define log_tensor(level, err, job, tensor, tier, ...) log_object(level, err, job, tensor, tier, __VA_ARGS__)
/* About a tier as a whole (an NVMe target, the host pool) */
#define log_tier(level, err, tier, ...) log_object(level, err, NULL, NULL, tier, __VA_ARGS__)
