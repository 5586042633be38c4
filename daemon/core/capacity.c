/* SPDX-License-Identifier: MIT */
/* capacity.c: can this machine give what the configuration asks?  At start, reload and --check-config. */

/*
 * Theory of operation: tierd makes its pools whole at start-up.  The host
 * pool is populated, mlock()ed and registered with io_uring as fixed
 * buffers; the emulated VRAM pool is populated shmem; NVMe target files are
 * preallocated.  Asked for more than the machine has, each of these fails
 * late and badly: the kernel's OOM killer kills tierd half-way through
 * populating the pool (exit 137, and again under Restart=on-failure), the
 * memory cgroup does the same sooner, io_uring refuses the registration
 * with a bare EINVAL or ENOMEM, fallocate() fills the filesystem and then
 * fails.  So before any pool is made the manager compares the
 * configuration with what the machine has, and refuses with one line that
 * names the key, the size asked, what the machine has and a value that
 * would pass.  `tierd --check-config` runs the same check, and a reload
 * runs it on the new file and warns (capacities take effect only at a
 * restart, which it would refuse).
 *
 * The rules:
 *
 *   - io_uring: the host pool is one fixed buffer per segment, and a ring
 *     takes at most CAPACITY_URING_MAX_BUFFERS (each at most 1G, which
 *     config.c checks of segment_size);
 *   - without CAP_IPC_LOCK, RLIMIT_MEMLOCK bounds the host pool exactly:
 *     mlock() (per process) and io_uring's registration (per user) count
 *     against it; a failed mlock() alone is only a warning, but a failed
 *     registration is fatal;
 *   - memory: the host pool, plus the emulated VRAM pool (memfd, populated,
 *     not locked), within CAPACITY_MEMORY_PERCENT of what tierd's memory
 *     cgroup leaves (the tightest of its own and its parents' limits, less
 *     what each uses, inactive page cache aside) and of MemAvailable;
 *     MemTotal is only quoted;
 *   - each [nvme] target within the free space (f_bavail: what is left
 *     beside root's reserve) of its filesystem, after the targets listed
 *     before it on the same one; an existing file counts what it holds
 *     already; a block device bounds its target by its size.
 *
 * The check is split in two so the rules can be tested with made-up
 * machines: capacity_facts_read() reads the facts (memory, cgroup, memlock
 * limit, capability, filesystems) into a CapacityFacts, and
 * capacity_check() is a pure function of the Config and the facts.  For
 * the host memory rules it computes the most [host] capacity each rule
 * allows, takes the smallest, and when the configuration asks for more
 * names the rule that gave it: so the value it suggests passes every rule,
 * not only the one it names.  Suggested values are round (a whole number
 * of T, G, 64M or M where that costs less than a tenth of the allowance)
 * multiples of the unit the pool is cut in, spelt as tierd.conf spells
 * sizes; figures about the machine are spelt for people (size_format()).
 *
 * Not checked here: the cuda backend's VRAM, which vram-cuda.c already cuts
 * to 90% of the device's free memory, and memory that other processes of
 * tierd's user have registered with io_uring (the kernel counts io_uring's
 * fixed buffers per user, mlock() per process, against the same
 * RLIMIT_MEMLOCK).  The figures are a snapshot: a machine that fills up
 * between the check and the pool can still fail, with the old errors.
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/capability.h>
#include <linux/fs.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "daemon/base/config.h"
#include "daemon/core/capacity.h"
#include "daemon/tiers/vram.h"
#include "proto/macro.h"
#if TIERD_HAVE_CUDA
#include "proto/cudrv.h"
#endif
#include "util/size.h"

#define KIB UINT64_C(1024)
#define MIB (KIB * 1024)
#define GIB (MIB * 1024)
#define TIB (GIB * 1024)

/* A cgroup memory limit at or above this is "no limit" (v1 writes LONG_MAX rounded down to a page). */
#define CGROUP_NO_LIMIT (UINT64_C(1) << 62)
/* The page size every pool is carved in; the smallest segment_size a suggestion may give. */
#define PAGE UINT64_C(4096)
/* io_uring's limit on one fixed buffer, and so on [host] segment_size. */
#define URING_MAX_BUFFER GIB

static void fclosep(FILE **f) {
        if (*f)
                (void) fclose(*f);
}
#define _cleanup_fclose_ _cleanup_(fclosep)

/* asprintf() that leaves *@ret NULL on failure; -ENOMEM or 0. */
_printf_(2, 3)
static int strf(char **ret, const char *fmt, ...) {
        va_list ap;
        int r;

        va_start(ap, fmt);
        r = vasprintf(ret, fmt, ap);
        va_end(ap);
        if (r < 0) {
                *ret = NULL;
                return -ENOMEM;
        }
        return 0;
}

/* ---- arithmetic ------------------------------------------------------------------- */

static uint64_t sat_add(uint64_t a, uint64_t b) {
        return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static uint64_t sat_sub(uint64_t a, uint64_t b) {
        return a > b ? a - b : 0;
}

/* @percent % of @v, rounded down, without overflowing. */
static uint64_t percent_of(uint64_t v, unsigned percent) {
        return v / 100 * percent + v % 100 * percent / 100;
}

static uint64_t gcd(uint64_t a, uint64_t b) {
        while (b) {
                uint64_t t = a % b;

                a = b;
                b = t;
        }
        return a;
}

/*
 * A value to suggest: the largest multiple of @unit that is at most @max,
 * made round (a whole number of T, G, 64M or M, the first that keeps it
 * within a tenth of @max).  0 when not even one @unit fits.
 */
static uint64_t round_for_config(uint64_t max, uint64_t unit) {
        static const uint64_t round[] = { TIB, GIB, 64 * MIB, MIB };

        if (unit == 0 || max < unit)
                return 0;
        for (size_t i = 0; i < ELEMENTSOF(round); i++) {
                uint64_t m = round[i] / gcd(round[i], unit), step, v;

                if (unit > UINT64_MAX / m)
                        continue;
                step = unit * m;        /* lcm(round[i], unit) */
                v = max / step * step;
                if (v >= unit && v >= max - max / 10)
                        return v;
        }
        return max / unit * unit;
}

/* ---- the host memory rules ---------------------------------------------------------- */

typedef enum HostRule {
        HOST_RULE_URING,
        HOST_RULE_MEMLOCK,
        HOST_RULE_CGROUP,
        HOST_RULE_MEMINFO,
        _HOST_RULE_MAX,
        _HOST_RULE_INVALID = -22,
} HostRule;

/* The emulated VRAM pool's size: whole chunks, as segpool_init() makes them. */
static uint64_t emulated_vram_bytes(const Config *c) {
        uint64_t cap = vram_emul_capacity(c);

        return c->vram_chunk_size ? cap / c->vram_chunk_size * c->vram_chunk_size : cap;
}

uint64_t capacity_host_bytes(const Config *c, bool vram_emulated) {
        return sat_add(c->host_capacity, vram_emulated ? emulated_vram_bytes(c) : 0);
}

/* What the machine has, in the words of @rule (after "is more than ..."). */
static int host_rule_facts(HostRule rule, const Config *c, const CapacityFacts *f, bool with_vram, char **ret) {
        char a[SIZE_FORMAT_MAX], b[SIZE_FORMAT_MAX], h[SIZE_FORMAT_MAX + 48] = "";

        switch (rule) {
        case HOST_RULE_URING:
                return strf(ret, "io_uring can register: %" PRIu64 " segments of %s, and one ring takes at most "
                            "%u fixed buffers", c->host_capacity / c->host_segment_size,
                            FORMAT_SIZE_EXACT(c->host_segment_size), CAPACITY_URING_MAX_BUFFERS);
        case HOST_RULE_MEMLOCK:
                return strf(ret, "tierd may lock: RLIMIT_MEMLOCK %s and no CAP_IPC_LOCK (mlock() and io_uring's "
                            "fixed buffers both count against it)", size_format(a, sizeof(a), f->memlock_limit));
        case HOST_RULE_CGROUP:
                if (f->held > 0)
                        (void) snprintf(h, sizeof(h), ", %s of that by tierd's running pools",
                                        FORMAT_SIZE(MIN(f->held, f->cgroup_usage)));
                return strf(ret, "tierd's memory cgroup allows: limit %s (%s), %s of it in use%s",
                            size_format(a, sizeof(a), f->cgroup_limit), f->cgroup_file,
                            size_format(b, sizeof(b), f->cgroup_usage), h);
        case HOST_RULE_MEMINFO:
                if (f->held > 0)
                        (void) snprintf(h, sizeof(h), ", plus the %s tierd's running pools hold",
                                        FORMAT_SIZE(f->held));
                return strf(ret, "this machine can %s: MemAvailable %s%s (MemTotal %s)",
                            with_vram ? "hold" : "lock", size_format(a, sizeof(a), f->mem_available), h,
                            size_format(b, sizeof(b), f->mem_total));
        default:
                return -EINVAL;
        }
}

/* "at most ..." for @rule, whose allowance for the host pool (and emulated VRAM, @with_vram) is @limit. */
static int host_rule_limit(HostRule rule, const Config *c, const CapacityFacts *f, uint64_t limit,
                           bool with_vram, char **ret) {
        const char *both = with_vram ? " for both" : "";
        const char *pools = f->held > 0 ? " and the running pools" : "";
        char a[SIZE_FORMAT_MAX];

        switch (rule) {
        case HOST_RULE_URING:
                return strf(ret, "at most %s with segment_size = %s", FORMAT_SIZE_EXACT(limit),
                            FORMAT_SIZE_EXACT(c->host_segment_size));
        case HOST_RULE_MEMLOCK:
                return strf(ret, "at most %s", size_format(a, sizeof(a), limit));
        case HOST_RULE_CGROUP:
                return strf(ret, "at most about %s%s (%u%% of what the limit leaves%s)",
                            size_format(a, sizeof(a), limit), both, CAPACITY_MEMORY_PERCENT, pools);
        case HOST_RULE_MEMINFO:
                return strf(ret, "at most about %s%s (%u%% of MemAvailable%s)",
                            size_format(a, sizeof(a), limit), both, CAPACITY_MEMORY_PERCENT, pools);
        default:
                return -EINVAL;
        }
}

/*
 * What to set when the host memory rules refuse: *@ret_blame_vram tells
 * whether it is the emulated VRAM pool that leaves no room.
 * @vram:      the emulated VRAM pool, when a memory rule refused; else 0
 * @host_max:  the most [host] capacity every rule allows, VRAM as it is
 * @fixed_max: the most the io_uring and memlock rules allow (VRAM aside)
 * @mem_max:   the most the memory rules allow for host and VRAM together
 */
static int host_suggest(const Config *c, uint64_t vram, uint64_t host_max, uint64_t fixed_max, uint64_t mem_max,
                        bool *ret_blame_vram, char **ret) {
        const uint64_t seg = c->host_segment_size, chunk = c->vram_chunk_size;
        uint64_t h, v;

        *ret_blame_vram = false;
        h = round_for_config(host_max, seg);
        if (h > 0)
                return strf(ret, "set [host] capacity = %s", FORMAT_SIZE_EXACT(h));

        if (vram > 0) {
                /* the emulated VRAM leaves not one segment: it gives way */
                *ret_blame_vram = true;
                v = round_for_config(sat_sub(mem_max, c->host_capacity), chunk);
                if (c->host_capacity <= fixed_max && v > 0)
                        return strf(ret, "set [vram] capacity = %s", FORMAT_SIZE_EXACT(v));
                h = round_for_config(MIN(fixed_max, sat_sub(mem_max, chunk)), seg);
                if (h > 0)
                        return strf(ret, "set [vram] capacity = %s and [host] capacity = %s",
                                    FORMAT_SIZE_EXACT(chunk), FORMAT_SIZE_EXACT(h));
                return strf(ret, "not one segment and one chunk fit: lower [host] segment_size and [vram] "
                            "chunk_size, or free memory");
        }

        /* less than one segment: smaller segments, the pool one segment big */
        h = round_for_config(MIN(host_max, URING_MAX_BUFFER), PAGE);
        if (h > 0)
                return strf(ret, "set [host] capacity = %s and segment_size = %s", FORMAT_SIZE_EXACT(h),
                            FORMAT_SIZE_EXACT(h));
        return strf(ret, "not one page fits");
}

static int check_host(const Config *c, const CapacityFacts *f, char **ret_message) {
        _cleanup_free_ char *facts = NULL, *limit = NULL, *set = NULL, *subject = NULL;
        const uint64_t vram = f->vram_emulated ? emulated_vram_bytes(c) : 0;
        uint64_t host_max, fixed_max, mem_max = UINT64_MAX, rule_limit;
        HostRule rule;
        bool blame_vram, with_vram;
        const char *tail = "";
        int r;

        if (c->host_segment_size == 0 || c->vram_chunk_size == 0 || c->nvme_extent_size == 0)
                return -EINVAL;         /* config_finish() refuses these */

        /* io_uring: one fixed buffer per segment (each at most 1G: config.c checks segment_size) */
        host_max = (uint64_t) CAPACITY_URING_MAX_BUFFERS * c->host_segment_size;
        rule = HOST_RULE_URING;
        rule_limit = host_max;

        /* mlock() and io_uring's accounting, unless CAP_IPC_LOCK lifts both */
        if (!f->cap_ipc_lock && f->memlock_limit < host_max) {
                host_max = rule_limit = f->memlock_limit;
                rule = HOST_RULE_MEMLOCK;
        }
        fixed_max = host_max;

        /* memory: the pools are locked or populated shmem, charged to tierd's cgroup */
        if (f->cgroup_limit != UINT64_MAX) {
                uint64_t l = percent_of(sat_add(sat_sub(f->cgroup_limit, f->cgroup_usage), f->held),
                                        CAPACITY_MEMORY_PERCENT);

                mem_max = MIN(mem_max, l);
                if (sat_sub(l, vram) < host_max) {
                        host_max = sat_sub(l, vram);
                        rule = HOST_RULE_CGROUP;
                        rule_limit = l;
                }
        }
        if (f->mem_available > 0) {
                uint64_t l = percent_of(sat_add(f->mem_available, f->held), CAPACITY_MEMORY_PERCENT);

                mem_max = MIN(mem_max, l);
                if (sat_sub(l, vram) < host_max) {
                        host_max = sat_sub(l, vram);
                        rule = HOST_RULE_MEMINFO;
                        rule_limit = l;
                }
        }

        if (c->host_capacity <= host_max)
                return 0;

        /* refused: name the rule that allows the least, and a value every rule allows */
        with_vram = vram > 0 && (rule == HOST_RULE_CGROUP || rule == HOST_RULE_MEMINFO);
        if (host_rule_facts(rule, c, f, with_vram, &facts) < 0 ||
            host_rule_limit(rule, c, f, rule_limit, with_vram, &limit) < 0 ||
            host_suggest(c, with_vram ? vram : 0, host_max, fixed_max, mem_max, &blame_vram, &set) < 0)
                return -ENOMEM;

        if (blame_vram)
                r = strf(&subject, "[vram] capacity = %s (emulated: host memory) with [host] capacity = %s",
                         FORMAT_SIZE_EXACT(vram), FORMAT_SIZE_EXACT(c->host_capacity));
        else if (with_vram)
                r = strf(&subject, "[host] capacity = %s with the emulated [vram] capacity = %s (host memory too)",
                         FORMAT_SIZE_EXACT(c->host_capacity), FORMAT_SIZE_EXACT(vram));
        else
                r = strf(&subject, "[host] capacity = %s", FORMAT_SIZE_EXACT(c->host_capacity));
        if (r < 0)
                return r;

        if (rule == HOST_RULE_URING && c->host_segment_size < URING_MAX_BUFFER)
                tail = " (or a larger [host] segment_size: up to 1G, for 16T)";
        else if (rule == HOST_RULE_MEMLOCK)
                tail = ", or raise LimitMEMLOCK= or grant CAP_IPC_LOCK";

        r = strf(ret_message, "%s is more than %s; %s; %s%s", subject, facts, limit, set, tail);
        return r < 0 ? r : CAPACITY_REFUSED;
}

/* ---- NVMe targets --------------------------------------------------------------------- */

/* Bytes preallocating target @t will take from its filesystem. */
static uint64_t target_need(const ConfigTarget *t, const CapacityTarget *ft) {
        switch (ft->kind) {
        case CAPACITY_TARGET_NEW:
                return t->size;
        case CAPACITY_TARGET_FILE:
                /* tier-nvme.c fallocate()s [0, size) whole, holes included (its own size without one):
                 * what the file does not hold yet */
                return sat_sub(t->size > 0 ? t->size : ft->file_size, ft->file_allocated);
        default:
                return 0;
        }
}

static int check_block_target(const Config *c, const ConfigTarget *t, const CapacityTarget *ft, char **ret) {
        char a[SIZE_FORMAT_MAX];
        int r;

        if (t->size <= ft->device_size)
                return 0;
        r = strf(ret, "[nvme] target = %s:%s is more than the device holds: %s; set [nvme] target = %s "
                 "(the whole device)", t->path, FORMAT_SIZE_EXACT(t->size),
                 size_format(a, sizeof(a), ft->device_size), t->path);
        return r < 0 ? r : CAPACITY_REFUSED;
}

static int check_file_target(const Config *c, const CapacityFacts *f, size_t i, char **ret) {
        const ConfigTarget *t = &c->targets[i];
        const CapacityTarget *ft = &f->targets[i];
        char a[SIZE_FORMAT_MAX], dir[512], before[SIZE_FORMAT_MAX + 48] = "", own[SIZE_FORMAT_MAX + 48] = "";
        uint64_t taken = 0, room, max, set;
        char *slash;
        int r;

        /* the targets listed before it on the same filesystem are preallocated first */
        for (size_t j = 0; j < i; j++)
                if ((f->targets[j].kind == CAPACITY_TARGET_NEW || f->targets[j].kind == CAPACITY_TARGET_FILE) &&
                    f->targets[j].fs_id == ft->fs_id)
                        taken = sat_add(taken, target_need(&c->targets[j], &f->targets[j]));
        room = sat_sub(ft->fs_free, taken);
        if (target_need(t, ft) <= room)
                return 0;

        max = room;
        if (ft->kind == CAPACITY_TARGET_FILE && ft->file_allocated > 0) {
                max = sat_add(max, ft->file_allocated);
                (void) snprintf(own, sizeof(own), ", plus the %s the file holds already",
                                FORMAT_SIZE(ft->file_allocated));
        }
        if (taken > 0)
                (void) snprintf(before, sizeof(before), ", of which the targets listed before it take %s",
                                FORMAT_SIZE(taken));
        (void) snprintf(dir, sizeof(dir), "%s", t->path);
        slash = strrchr(dir, '/');
        if (slash)
                slash[slash == dir] = '\0';     /* "/x" -> "/" */

        set = round_for_config(max, c->nvme_extent_size);
        if (t->size == 0)       /* an existing file's own size: allocated whole, holes included */
                r = strf(ret, "[nvme] target = %s (%s, its own size, %s of it allocated) is more than the "
                         "filesystem can back: %s free on %s%s; tierd allocates a target whole (a sparse file "
                         "too); set [nvme] target = %s:%s or free space", t->path, FORMAT_SIZE(ft->file_size),
                         FORMAT_SIZE(ft->file_allocated), size_format(a, sizeof(a), ft->fs_free), dir, before,
                         t->path, FORMAT_SIZE_EXACT(set));
        else if (set > 0)
                r = strf(ret, "[nvme] target = %s:%s is more than the filesystem can hold: %s free on %s%s%s; "
                         "at most about %s; set [nvme] target = %s:%s", t->path, FORMAT_SIZE_EXACT(t->size),
                         size_format(a, sizeof(a), ft->fs_free), dir, before, own, FORMAT_SIZE(max), t->path,
                         FORMAT_SIZE_EXACT(set));
        else
                r = strf(ret, "[nvme] target = %s:%s is more than the filesystem can hold: %s free on %s%s%s; "
                         "not one extent fits: free space there or put the target elsewhere", t->path,
                         FORMAT_SIZE_EXACT(t->size), size_format(a, sizeof(a), ft->fs_free), dir, before, own);
        return r < 0 ? r : CAPACITY_REFUSED;
}

static int check_targets(const Config *c, const CapacityFacts *f, char **ret_message) {
        for (size_t i = 0; i < MIN(c->n_targets, (size_t) CONFIG_MAX_TARGETS); i++) {
                int r = 0;

                if (c->targets[i].size == 0 && f->targets[i].kind != CAPACITY_TARGET_FILE)
                        continue;       /* a device's own size; a file's own size is allocated whole (holes too) */
                if (f->targets[i].kind == CAPACITY_TARGET_BLOCK)
                        r = check_block_target(c, &c->targets[i], &f->targets[i], ret_message);
                else if (f->targets[i].kind == CAPACITY_TARGET_NEW || f->targets[i].kind == CAPACITY_TARGET_FILE)
                        r = check_file_target(c, f, i, ret_message);
                if (r != 0)
                        return r;
        }
        return 0;
}

int capacity_check(const Config *c, const CapacityFacts *f, char **ret_message) {
        int r;

        *ret_message = NULL;
        r = check_host(c, f, ret_message);
        if (r != 0)
                return r;
        return check_targets(c, f, ret_message);
}

/* ---- reading the facts ------------------------------------------------------------------ */

/* The first number in file @path ("max": UINT64_MAX). */
static int read_u64_file(const char *path, uint64_t *ret) {
        _cleanup_fclose_ FILE *f = NULL;
        char buf[64];

        f = fopen(path, "re");
        if (!f)
                return negative_errno();
        if (!fgets(buf, sizeof(buf), f))
                return -ENODATA;
        if (strncmp(buf, "max", 3) == 0) {
                *ret = UINT64_MAX;
                return 0;
        }
        return sscanf(buf, "%" SCNu64, ret) == 1 ? 0 : -EINVAL;
}

/* The value of @key in a "key value" file such as memory.stat. */
static int read_keyed_u64(const char *path, const char *key, uint64_t *ret) {
        _cleanup_fclose_ FILE *f = NULL;
        char line[256], k[64];
        uint64_t v;

        f = fopen(path, "re");
        if (!f)
                return negative_errno();
        while (fgets(line, sizeof(line), f))
                if (sscanf(line, "%63s %" SCNu64, k, &v) == 2 && strcmp(k, key) == 0) {
                        *ret = v;
                        return 0;
                }
        return -ENOENT;
}

static void read_meminfo(CapacityFacts *f) {
        _cleanup_fclose_ FILE *p = NULL;
        char line[256], key[64];
        uint64_t kb;

        p = fopen("/proc/meminfo", "re");
        if (!p)
                return;
        while (fgets(line, sizeof(line), p))
                if (sscanf(line, "%63[^:]: %" SCNu64, key, &kb) == 2) {
                        if (strcmp(key, "MemTotal") == 0)
                                f->mem_total = kb * KIB;
                        else if (strcmp(key, "MemAvailable") == 0)
                                f->mem_available = kb * KIB;
                }
}

void capacity_read_cgroup(const char *proc_cgroup, const char *root, CapacityFacts *f) {
        _cleanup_fclose_ FILE *p = NULL;
        const char *path, *limit_file, *usage_file, *inactive_key;
        char line[1024], v1[512] = "", v2[512] = "", base[512], dir[1100], file[1200];
        bool have_v1 = false, have_v2 = false;
        uint64_t best = UINT64_MAX;

        p = fopen(proc_cgroup, "re");
        if (!p)
                return;
        /* "ID:CONTROLLERS:PATH": v1 has a line per hierarchy, v2 the one "0::PATH" */
        while (fgets(line, sizeof(line), p)) {
                char *ctrl = strchr(line, ':'), *cpath;

                if (!ctrl || !(cpath = strchr(ctrl + 1, ':')))
                        continue;
                *ctrl++ = '\0';
                *cpath++ = '\0';
                cpath[strcspn(cpath, "\n")] = '\0';
                if (strcmp(line, "0") == 0 && ctrl[0] == '\0') {
                        (void) snprintf(v2, sizeof(v2), "%s", cpath);
                        have_v2 = true;
                        continue;
                }
                for (char *w = ctrl, *save = NULL; (w = strtok_r(w, ",", &save)); w = NULL)
                        if (strcmp(w, "memory") == 0) {
                                (void) snprintf(v1, sizeof(v1), "%s", cpath);
                                have_v1 = true;
                        }
        }
        if (have_v1) {
                (void) snprintf(base, sizeof(base), "%s/memory", root);
                path = v1;
                limit_file = "memory.limit_in_bytes";
                usage_file = "memory.usage_in_bytes";
                inactive_key = "total_inactive_file";
        } else if (have_v2) {
                (void) snprintf(base, sizeof(base), "%s", root);
                path = v2;
                limit_file = "memory.max";
                usage_file = "memory.current";
                inactive_key = "inactive_file";
        } else
                return;

        /* from tierd's own cgroup up to the root of the hierarchy */
        (void) snprintf(dir, sizeof(dir), "%s%s", base, strcmp(path, "/") == 0 ? "" : path);
        for (;;) {
                uint64_t limit, usage = 0, inactive = 0;
                char *slash;

                (void) snprintf(file, sizeof(file), "%s/%s", dir, limit_file);
                if (read_u64_file(file, &limit) >= 0 && limit < CGROUP_NO_LIMIT) {
                        char other[1200];

                        (void) snprintf(other, sizeof(other), "%s/%s", dir, usage_file);
                        (void) read_u64_file(other, &usage);
                        /* page cache nobody touched lately is reclaimed before the limit bites */
                        (void) snprintf(other, sizeof(other), "%s/memory.stat", dir);
                        if (read_keyed_u64(other, inactive_key, &inactive) >= 0)
                                usage = sat_sub(usage, inactive);
                        if (sat_sub(limit, usage) < best) {
                                best = sat_sub(limit, usage);
                                f->cgroup_limit = limit;
                                f->cgroup_usage = usage;
                                (void) snprintf(f->cgroup_file, sizeof(f->cgroup_file), "%s", file);
                        }
                }
                slash = strrchr(dir, '/');
                if (strlen(dir) <= strlen(base) || !slash || (size_t) (slash - dir) < strlen(base))
                        break;
                *slash = '\0';
        }
}

static bool have_cap_ipc_lock(void) {
        struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3 };
        struct __user_cap_data_struct d[_LINUX_CAPABILITY_U32S_3] = {};

        if (syscall(SYS_capget, &h, d) < 0)
                return false;
        return d[CAP_TO_INDEX(CAP_IPC_LOCK)].effective & CAP_TO_MASK(CAP_IPC_LOCK);
}

static void read_target(const ConfigTarget *t, CapacityTarget *ret) {
        struct statvfs vfs;
        struct stat st;

        *ret = (CapacityTarget) { .kind = CAPACITY_TARGET_UNKNOWN };
        if (stat(t->path, &st) >= 0) {
                if (S_ISBLK(st.st_mode)) {
                        _cleanup_close_ int fd = open(t->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
                        uint64_t bytes = 0;

                        if (fd >= 0 && ioctl(fd, BLKGETSIZE64, &bytes) >= 0)
                                *ret = (CapacityTarget) { .kind = CAPACITY_TARGET_BLOCK, .device_size = bytes };
                        return;
                }
                if (!S_ISREG(st.st_mode) || statvfs(t->path, &vfs) < 0)
                        return;
                *ret = (CapacityTarget) {
                        .kind = CAPACITY_TARGET_FILE,
                        .fs_id = (uint64_t) st.st_dev,
                        .fs_free = (uint64_t) vfs.f_bavail * vfs.f_frsize,
                        .file_size = (uint64_t) st.st_size,
                        .file_allocated = (uint64_t) st.st_blocks * 512,
                };
                return;
        }
        if (errno == ENOENT) {
                char dir[4096], *slash;

                (void) snprintf(dir, sizeof(dir), "%s", t->path);
                slash = strrchr(dir, '/');
                if (!slash)
                        return;         /* config_finish() made it absolute */
                slash[slash == dir] = '\0';
                if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode) || statvfs(dir, &vfs) < 0)
                        return;
                *ret = (CapacityTarget) {
                        .kind = CAPACITY_TARGET_NEW,
                        .fs_id = (uint64_t) st.st_dev,
                        .fs_free = (uint64_t) vfs.f_bavail * vfs.f_frsize,
                };
        }
}

/* backend = auto: does the CUDA driver report a device?  (vram_cuda_new() asks more: VMM, fd export.) */
static bool cuda_has_device(void) {
#if TIERD_HAVE_CUDA
        _cleanup_free_ char *why = NULL;
        CuDriver *d = NULL;
        bool found;
        int n = 0;

        if (cudrv_open(&d, &why) < 0)
                return false;
        found = d->cuDeviceGetCount(&n) == CUDA_SUCCESS && n > 0;
        cudrv_close(d);
        return found;
#else
        return false;
#endif
}

int capacity_facts_read(const Config *c, int vram_emulated, CapacityFacts *ret) {
        struct rlimit rl;

        *ret = (CapacityFacts) {
                .cgroup_limit = UINT64_MAX,
                .memlock_limit = UINT64_MAX,
        };
        read_meminfo(ret);
        capacity_read_cgroup("/proc/self/cgroup", "/sys/fs/cgroup", ret);
        if (getrlimit(RLIMIT_MEMLOCK, &rl) >= 0 && rl.rlim_cur != RLIM_INFINITY)
                ret->memlock_limit = (uint64_t) rl.rlim_cur;
        ret->cap_ipc_lock = have_cap_ipc_lock();

        if (vram_emulated >= 0)
                ret->vram_emulated = vram_emulated;
        else if (c->vram_backend == VRAM_BACKEND_AUTO)
                ret->vram_emulated = !cuda_has_device();
        else
                ret->vram_emulated = c->vram_backend == VRAM_BACKEND_EMULATED;

        for (size_t i = 0; i < MIN(c->n_targets, (size_t) CONFIG_MAX_TARGETS); i++)
                read_target(&c->targets[i], &ret->targets[i]);
        return 0;
}
