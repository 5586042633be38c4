/* SPDX-License-Identifier: MIT */
/* wear.h: bytes written to NVMe per job name and per target, kept across restarts. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct Job Job;
typedef struct NvmeTier NvmeTier;
typedef struct Registry Registry;

/* The book's file in the state directory. */
#define WEAR_FILE "wear"
/* Most job names the book keeps; past it the name with the fewest bytes is forgotten. */
#define WEAR_JOBS_MAX 4096
/* Most targets the book keeps (targets no longer configured are kept too, for when they come back). */
#define WEAR_TARGETS_MAX 256
/* Largest wear file read: WEAR_JOBS_MAX names of up to 4096 bytes, escaped, fit. */
#define WEAR_FILE_MAX (64u << 20)

typedef struct WearEntry {
        char *name;             /* job name or target path (raw bytes, NUL-terminated) */
        uint64_t bytes;
} WearEntry;

typedef struct Wear {
        char *path;             /* STATE_DIR/wear */
        WearEntry *targets;     /* bytes written before this start, per target path */
        size_t n_targets;
        WearEntry *jobs;        /* bytes written by job objects that ended (and before this start), per name */
        size_t n_jobs;
        bool forgot;            /* WEAR_JOBS_MAX was reached (logged once) */
} Wear;

/* An empty book that will live in @state_dir/wear. */
int wear_new(const char *state_dir, Wear **ret);
Wear *wear_free(Wear *w);

/*
 * wear_parse() - add the entries of a wear file's @text to @w (pure: no I/O).
 * -EBADMSG with the line and the reason in @ret_why if it is not one.
 */
int wear_parse(Wear *w, const char *text, char *ret_why, size_t why_size);

/*
 * wear_format() - the wear file: @w's entries plus what @nvme's targets and
 * @reg's jobs (live and dying) wrote since start.  Either may be NULL.
 * malloc()ed text.
 */
int wear_format(const Wear *w, const NvmeTier *nvme, const Registry *reg, char **ret);

/*
 * wear_load() - read @w->path into @w and set each target's wear_base.
 * 0: loaded; 1: there was no file (first start); 2: the file was corrupt:
 * it was renamed to PATH.corrupt and @ret_why says why (the book starts
 * empty); < 0: it cannot be read (-errno, @ret_why).
 */
int wear_load(Wear *w, NvmeTier *nvme, char *ret_why, size_t why_size);
/* Write the book (wear_format()) to @w->path atomically.  0 or -errno. */
int wear_save(const Wear *w, const NvmeTier *nvme, const Registry *reg);

/* Bytes earlier job objects of this name wrote, as the book has them (jobs that ended). */
uint64_t wear_job_base(const Wear *w, const char *name);
/*
 * Bytes written to NVMe under @j's name in all: the book's, those of the jobs of its name in
 * @reg still ending (their last transfers in flight: not in the book yet) and @j's own.
 */
uint64_t wear_job_written(const Wear *w, const Registry *reg, const Job *j);
/* Job @j ends: what it wrote goes into the book under its name. */
void wear_job_end(Wear *w, const Job *j);

/*
 * wear_job_rename() - the NVMe index restored job @was (a name from an older tierd: control
 * characters, bytes not UTF-8) as @now (book-replay.c restore_name()): what jobs of @was wrote
 * counts as @now's from now on (added to @now's entry, if any).  0 or -ENOMEM.
 */
int wear_job_rename(Wear *w, const char *was, const char *now);
/*
 * wear_rename_old() - after the NVMe index's jobs were restored: every other entry of such a name
 * goes under its escaped text (text_escape_name(..., @max_name): "evil\u009b31m", where a job
 * started under that name counts, and a job restored under it, which an earlier start killed before
 * it saved the book made of that name; with a hash when an entry has that, else merged into it).
 * The number of entries renamed, or -ENOMEM.
 */
int wear_rename_old(Wear *w, size_t max_name);
