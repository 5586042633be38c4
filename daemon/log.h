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
