/* SPDX-License-Identifier: MIT */
/* config.h: tierd.conf (+ tierd.conf.d/ drop-ins) parsed into a value struct. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "daemon/base/quota-rule.h"

typedef enum VramBackendKind {
        VRAM_BACKEND_AUTO,
        VRAM_BACKEND_EMULATED,
        VRAM_BACKEND_CUDA,
        _VRAM_BACKEND_MAX,
        _VRAM_BACKEND_INVALID = -22,
} VramBackendKind;

typedef enum SchedPolicyKind {
        SCHED_POLICY_TIMELINE,  /* plan-driven: deadlines, Belady, write-behind, fair share */
        SCHED_POLICY_LRU,       /* fetch on demand, evict least recently used */
        SCHED_POLICY_ONDEMAND,  /* fetch on demand, write back and drop right after use */
        _SCHED_POLICY_MAX,
        _SCHED_POLICY_INVALID = -22,
} SchedPolicyKind;

typedef struct ConfigTarget {
        char *path;
        uint64_t size;          /* 0: use the block device's or existing file's size */
} ConfigTarget;

#define CONFIG_MAX_TARGETS 16
/* [host|vram|nvme] uid_share: the percent of a tier the jobs of one uid (not root, not tier-admin) may use */
#define CONFIG_UID_SHARE_DEFAULT 50u

typedef struct Config {
        /* [daemon] */
        char *socket_path;
        char *state_dir;
        int log_level;                  /* syslog LOG_* */
        uint64_t linger_usec;
        unsigned max_connections;
        unsigned max_connections_per_uid;
        /* [limits] */
        unsigned max_message;
        unsigned max_tensors;
        unsigned max_tensors_per_uid;   /* all the jobs of one uid together, lingering ones included */
        unsigned max_inflight;
        unsigned max_name;
        /* [host] */
        uint64_t host_capacity;
        uint64_t host_segment_size;
        int numa_node;                  /* -1: auto */
        uint64_t host_job_limit;
        unsigned host_uid_share;        /* percent of the capacity a uid's jobs together may use (0: no total) */
        /* [vram] */
        VramBackendKind vram_backend;
        uint64_t vram_capacity;         /* 0: cuda: 90% of the free device memory; emulated: 1G */
        uint64_t vram_chunk_size;
        uint64_t vram_job_limit;
        unsigned vram_uid_share;        /* as host_uid_share */
        uint64_t vram_bandwidth;        /* bytes/s, 0 unthrottled */
        /* [nvme] */
        ConfigTarget targets[CONFIG_MAX_TARGETS];
        size_t n_targets;
        uint64_t nvme_extent_size;
        unsigned nvme_queue_depth;
        unsigned nvme_checksum_threads; /* 0: the crc32c of extents on the event loop */
        uint64_t nvme_job_limit;
        unsigned nvme_uid_share;        /* as host_uid_share */
        uint64_t nvme_bandwidth;        /* bytes/s per target, 0 unthrottled */
        bool nvme_persist;              /* the NVMe index (state/book.c): what is on NVMe survives a restart */
        /* [sched] */
        SchedPolicyKind sched_policy;
        unsigned default_weight;        /* a job's bandwidth weight until a quota sets it */
        /* [metrics] */
        char *metrics_textfile;         /* "": none; else where tierd writes its metrics for node_exporter */
        uint64_t metrics_interval_usec; /* how often it rewrites that file */
        /* [trace] */
        unsigned trace_buffer;          /* records a trace holds unless TraceStart asks for another size */
        /* [quota] sections, in the order read (several per target: the later one wins, field by field) */
        QuotaRules quotas;
} Config;

/* Fill @c with the built-in defaults (no targets). */
void config_init(Config *c);
void config_deinit(Config *c);

/**
 * config_parse_text() - apply the text of one file to @c.
 * @filename: used in messages only.
 * On a bad line returns -EINVAL and sets *ret_error to a malloc'ed message of
 * the form "FILE:LINE: [section] key: reason" (or "FILE:LINE: reason").
 * @ret_error may be NULL.  An empty "target =" drops the targets set so far.
 */
int config_parse_text(Config *c, const char *text, const char *filename, char **ret_error);

/**
 * config_load() - defaults, then @path, then @path.d/ *.conf in lexical order.
 * @c:          overwritten without being freed: pass an uninitialised or
 *              config_deinit()ed Config.  On failure it is left deinit'ed.
 * @must_exist: a missing @path is an error (-ENOENT) instead of "use
 *              defaults" (the drop-ins are still read then).
 * Then config_finish().  *ret_error as above, or "FILE: reason" when a file
 * cannot be read; it may be NULL on -ENOMEM.
 */
int config_load(Config *c, const char *path, bool must_exist, char **ret_error);

/*
 * config_set_key() - set @section's key @name to @value through the key's own
 * parser, as a line of a file would (the command line's overrides).  -EINVAL
 * with *@ret_error "ORIGIN: [section] key: reason" (@origin: "--socket").
 */
int config_set_key(Config *c, const char *section, const char *name, const char *value, const char *origin,
                   char **ret_error);

/*
 * config_load() without the config_finish() step, for callers that override keys first:
 * 1 when @path was read, 0 when it is missing (and not @must_exist).
 */
int config_load_files(Config *c, const char *path, bool must_exist, char **ret_error);

/**
 * config_finish() - validate cross-key constraints and fill derived defaults
 * (no target: "<state_dir>/nvme0.img:4G"; relative target paths are made
 * relative to state_dir).  -EINVAL with *ret_error naming the key.
 */
int config_finish(Config *c, char **ret_error);

const char *vram_backend_to_string(VramBackendKind k);
const char *sched_policy_to_string(SchedPolicyKind p);
SchedPolicyKind sched_policy_from_string(const char *s);
VramBackendKind vram_backend_from_string(const char *s);

/* ---- the keys -------------------------------------------------------------------- */

/* How a key's value is held, spelt and compared. */
typedef enum ConfigType {
        CONFIG_STRING,          /* char * */
        CONFIG_UNSIGNED,        /* unsigned, a count */
        CONFIG_UNSIGNED_SIZE,   /* unsigned, bytes */
        CONFIG_SIZE,            /* uint64_t, bytes */
        CONFIG_SECONDS,         /* uint64_t, microseconds written as seconds */
        CONFIG_NUMA_NODE,       /* int, -1: auto */
        CONFIG_LOG_LEVEL,       /* int, syslog level */
        CONFIG_BACKEND,         /* VramBackendKind */
        CONFIG_POLICY,          /* SchedPolicyKind */
        CONFIG_TARGETS,         /* targets[] and n_targets */
        CONFIG_BOOL,            /* bool, yes or no */
        _CONFIG_TYPE_MAX,
        _CONFIG_TYPE_INVALID = -22,
} ConfigType;

typedef struct ConfigKey ConfigKey;

/*
 * Parse @value into the field at @field.  On failure return -EINVAL (or
 * -ENOMEM) and, for -EINVAL, a malloc'ed reason in *ret_reason.
 */
typedef int (*ConfigParser)(Config *c, const ConfigKey *k, const char *value, void *field, char **ret_reason);

/* One key of tierd.conf(5): one row of config.c's table. */
struct ConfigKey {
        const char *section;
        const char *name;
        ConfigParser parse;
        ConfigType type;
        size_t offset;          /* of its field in Config */
        size_t size;            /* of that field */
        uint64_t min, max;      /* inclusive range for numbers and sizes */
        bool live;              /* a reload applies it; else it keeps its value until a restart */
};

/* Replace the string at @field by a copy of @value (-ENOMEM: @field unchanged). */
int config_set_string(char **field, const char *value);
/* The @i-th key in the order of tierd.conf(5); NULL past the last. */
const ConfigKey *config_key_at(size_t i);
/* Does @k have the same value in @a and @b? */
bool config_value_equal(const ConfigKey *k, const Config *a, const Config *b);
/* Copy a scalar key's value from @from to @to; -EOPNOTSUPP for strings and targets. */
int config_value_copy(const ConfigKey *k, Config *to, const Config *from);
/* @k's value in @c as tierd.conf spells it ("64M", "auto", "a.img:4G, b.img"), malloc'ed; NULL: -ENOMEM. */
char *config_value_format(const ConfigKey *k, const Config *c);
/* The whole configuration as a tierd.conf file (tierd --check-config). */
int config_print(FILE *f, const Config *c);
