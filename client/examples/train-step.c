/* SPDX-License-Identifier: MIT */
/* train-step: a fake training loop that pushes twice the job's host memory through tierd. */

/*
 * Read this as an example of libtier.  A "training step" here is:
 *
 *   1. write:    for each tensor, pin it in HOST memory write-only (tier_pin
 *                with TIER_WRITE gives a pointer into memory shared with tierd and
 *                does not bring the old bytes back from NVMe: they are about to be
 *                overwritten), write it whole, unpin it dirty.  The tensors add up
 *                to twice the job's host limit, so tierd writes the older ones to
 *                NVMe by itself to make room.
 *   2. evict:    push every tensor down to NVMe, asynchronously: each
 *                tier_evict_async() returns a fence, tier_fence_wait() waits for it.
 *   3. read:     prefetch tensors back to HOST a window ahead of use (async), then
 *                pin each, check every byte, unpin it clean.
 *
 * Once, after the steps, one tensor takes the VRAM path: pin in VRAM, check,
 * write, unpin dirty, evict to NVMe, pin in HOST, check.
 *
 * Every byte written is a function of (tensor, step), so every read can be
 * checked.  The program exits 1 at the first wrong byte and says where.
 * After each pass it prints the bytes tierd moved for the job over each link
 * in that pass, as tierd counted them (tier_client_moved()).
 *
 *   train-step [--socket PATH] [--job NAME] [--tensors N] [--size BYTES] [--steps N]
 */

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tier.h>

/* How long one fence may take before the demo gives up instead of hanging. */
#define FENCE_TIMEOUT_MS (120 * 1000)
/* The step number written by the VRAM round trip, distinct from any real step. */
#define VRAM_STEP 0xffffu

static const char *arg_socket = NULL;
static const char *arg_job = "demo";
static unsigned arg_tensors = 0;                /* 0: 2 x host limit / size */
static uint64_t arg_size = 16u << 20;
static unsigned arg_steps = 2;

static tier_client *client;
static tier_tensor **tensors;
static unsigned n_tensors;
static uint64_t bytes_verified;

/* ---- helpers ---------------------------------------------------------------------- */

static double now(void) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

/*
 * The helpers below read and write sizes exactly as tierd, tierctl and the
 * benchmarks do (tierd's util/size.h).  They are copies because this program
 * is also the example of building against the installed libtier alone.
 */

/* @bytes in binary units, one decimal, rounded to the nearest tenth ("1.0 MiB" for 1048575). */
static const char *human(uint64_t bytes) {
        static char buf[4][32];
        static unsigned next;
        static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
        char *b = buf[next++ % 4];
        uint64_t d = 1, whole, tenths;
        unsigned u = 0;

        while (u + 1 < sizeof(units) / sizeof(units[0]) && bytes / d >= 1024) {
                d *= 1024;
                u++;
        }
        if (u == 0) {
                snprintf(b, sizeof(buf[0]), "%" PRIu64 " B", bytes);
                return b;
        }
        whole = bytes / d;
        tenths = ((bytes % d) * 10 + d / 2) / d;
        if (tenths >= 10) {
                whole++;
                tenths = 0;
        }
        if (whole >= 1024 && u + 1 < sizeof(units) / sizeof(units[0])) {
                whole /= 1024;          /* 1023.95 KiB and up: 1.0 MiB */
                u++;
        }
        snprintf(b, sizeof(buf[0]), "%" PRIu64 ".%" PRIu64 " %s", whole, tenths, units[u]);
        return b;
}

static double gbps(uint64_t bytes, double seconds) {
        return seconds > 0 ? (double) bytes / seconds / 1e9 : 0;
}

/* Report a libtier failure: the daemon's reason when there is one. */
static int fail(int r, const char *what, unsigned tensor) {
        const char *why = client ? tier_client_last_error(client) : tier_client_last_error(NULL);

        fprintf(stderr, "train-step: %s (tensor %u): %s\n", what, tensor, why && *why ? why : tier_strerror(r));
        return r;
}

/* Decimal digits, then optionally K, M, G, T, P or E (either case, powers of 1024) and B or iB, or a bare B. */
static int parse_size(const char *s, uint64_t *ret) {
        static const char units[] = "KMGTPE";
        const char *unit;
        unsigned shift = 0;
        uint64_t v = 0;

        if (*s < '0' || *s > '9')
                return -EINVAL;
        for (; *s >= '0' && *s <= '9'; s++) {
                if (v > (UINT64_MAX - (uint64_t) (*s - '0')) / 10)
                        return -ERANGE;
                v = v * 10 + (uint64_t) (*s - '0');
        }
        unit = *s ? strchr(units, *s >= 'a' && *s <= 'z' ? *s - 'a' + 'A' : *s) : NULL;
        if (unit) {
                shift = 10 * (unsigned) (unit - units + 1);
                s++;
                if (s[0] == 'i' && s[1] == 'B')
                        s += 2;
                else if (s[0] == 'B')
                        s++;
        } else if (*s == 'B')
                s++;
        if (*s != '\0')
                return -EINVAL;
        if (v > (UINT64_MAX >> shift))
                return -ERANGE;
        *ret = v << shift;
        return 0;
}

static int parse_unsigned(const char *s, unsigned *ret) {
        char *end;
        unsigned long v;

        errno = 0;
        v = strtoul(s, &end, 10);
        if (errno != 0 || end == s || *end != 0 || v == 0 || v > 1000000)
                return -EINVAL;
        *ret = (unsigned) v;
        return 0;
}

/* ---- the data pattern --------------------------------------------------------------- */

/* splitmix64: a cheap, well-mixed function of (tensor, step, word index). */
static uint64_t pattern_word(unsigned tensor, unsigned step, uint64_t word) {
        uint64_t z = ((uint64_t) tensor << 40 ^ (uint64_t) step << 20) + word * 0x9e3779b97f4a7c15u;

        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
        return z ^ (z >> 31);
}

static void fill(uint8_t *p, uint64_t size, unsigned tensor, unsigned step) {
        uint64_t i;

        for (i = 0; i + 8 <= size; i += 8) {
                uint64_t w = pattern_word(tensor, step, i / 8);
                memcpy(p + i, &w, 8);
        }
        if (i < size) {
                uint64_t w = pattern_word(tensor, step, i / 8);
                memcpy(p + i, &w, size - i);
        }
}

/* Offset of the first wrong byte, or -1 when all @size bytes are right. */
static int64_t check(const uint8_t *p, uint64_t size, unsigned tensor, unsigned step) {
        for (uint64_t i = 0; i < size; i += 8) {
                uint64_t w = pattern_word(tensor, step, i / 8);
                uint64_t n = size - i < 8 ? size - i : 8;

                if (memcmp(p + i, &w, n) != 0)
                        for (uint64_t k = 0; k < n; k++)
                                if (p[i + k] != ((const uint8_t *) &w)[k])
                                        return (int64_t) (i + k);
        }
        return -1;
}

/* The byte the pattern puts at @offset. */
static uint8_t pattern_byte(unsigned tensor, unsigned step, uint64_t offset) {
        uint64_t w = pattern_word(tensor, step, offset / 8);

        return ((const uint8_t *) &w)[offset % 8];
}

static void report_mismatch(const uint8_t *p, unsigned tensor, unsigned step, const char *where, int64_t bad) {
        fprintf(stderr, "train-step: tensor %u, step %u, %s: wrong byte at offset %" PRId64
                " (expected 0x%02x, found 0x%02x)\n", tensor, step, where, bad,
                pattern_byte(tensor, step, (uint64_t) bad), p[bad]);
}

/* Pin @i in @tier, check it holds (i, step), unpin it clean.  1 on a mismatch. */
static int pin_and_check(unsigned i, int tier, unsigned step) {
        struct tier_grant g;
        int64_t bad;
        int r;

        r = tier_pin(tensors[i], tier, TIER_READ_WRITE, &g);
        if (r < 0)
                return fail(r, "pin", i);
        bad = check(g.ptr, g.length, i, step);
        if (bad >= 0)
                report_mismatch(g.ptr, i, step, tier_level_name(tier), bad);
        r = tier_unpin(tensors[i], tier, 0);
        if (r < 0)
                return fail(r, "unpin", i);
        if (bad >= 0)
                return 1;
        bytes_verified += g.length;
        return 0;
}

/* ---- one step ------------------------------------------------------------------------ */

static int step_write(unsigned step) {
        for (unsigned i = 0; i < n_tensors; i++) {
                struct tier_grant g;
                int r;

                /*
                 * A synchronous pin returns once host memory is reserved; write-only, so
                 * the tensor's old bytes on NVMe are not read back first.
                 */
                r = tier_pin(tensors[i], TIER_HOST, TIER_WRITE, &g);
                if (r < 0)
                        return fail(r, "pin in host", i);
                fill(g.ptr, g.length, i, step);
                /* dirty: the host copy is now the only good one; tierd writes it back before dropping it. */
                r = tier_unpin(tensors[i], TIER_HOST, 1);
                if (r < 0)
                        return fail(r, "unpin", i);
        }
        return 0;
}

static int step_evict(tier_fence *fences) {
        /* Queue every eviction first, then wait: tierd overlaps them across drives. */
        for (unsigned i = 0; i < n_tensors; i++) {
                int r = tier_evict_async(tensors[i], TIER_NVME, &fences[i]);
                if (r < 0)
                        return fail(r, "evict to nvme", i);
        }
        for (unsigned i = 0; i < n_tensors; i++) {
                int r = tier_fence_wait(client, fences[i], FENCE_TIMEOUT_MS);
                if (r < 0)
                        return fail(r, "wait for eviction", i);
        }
        return 0;
}

static int step_read(unsigned step, unsigned window, tier_fence *fences) {
        /* Keep @window prefetches in flight ahead of the tensor being checked. */
        for (unsigned i = 0; i < n_tensors && i < window; i++) {
                int r = tier_prefetch_async(tensors[i], TIER_HOST, &fences[i]);
                if (r < 0)
                        return fail(r, "prefetch to host", i);
        }
        for (unsigned i = 0; i < n_tensors; i++) {
                int r;

                r = tier_fence_wait(client, fences[i], FENCE_TIMEOUT_MS);
                if (r < 0)
                        return fail(r, "wait for prefetch", i);
                r = pin_and_check(i, TIER_HOST, step);
                if (r != 0)
                        return r;
                if (i + window < n_tensors) {
                        r = tier_prefetch_async(tensors[i + window], TIER_HOST, &fences[i + window]);
                        if (r < 0)
                                return fail(r, "prefetch to host", i + window);
                }
        }
        return 0;
}

/* How many tensors tierd has already moved out of host memory on its own. */
static unsigned count_spilled(void) {
        unsigned n = 0;

        for (unsigned i = 0; i < n_tensors; i++) {
                struct tier_stat st;

                if (tier_tensor_stat(tensors[i], &st) >= 0 && st.state[TIER_HOST] == 0)
                        n++;
        }
        return n;
}

/* The bytes tierd has moved for the job so far, per link (TIER_LINK_*); zeros if it cannot say. */
static void moved_now(uint64_t bytes[TIER_LINK_SLOTS]) {
        if (tier_client_moved(client, bytes) < 0)
                memset(bytes, 0, TIER_LINKS * sizeof(uint64_t));
}

/* What tierd moved between @before and now, link by link ("nothing" when nothing moved); @before becomes now. */
static void print_moved(uint64_t before[TIER_LINK_SLOTS]) {
        uint64_t after[TIER_LINK_SLOTS];
        bool any = false;

        moved_now(after);
        printf("            tierd moved:");
        for (int l = 0; l < TIER_LINKS; l++)
                if (after[l] > before[l]) {
                        printf("%s %s %s", any ? "," : "", tier_link_name(l), human(after[l] - before[l]));
                        any = true;
                }
        printf("%s\n", any ? "" : " nothing");
        memcpy(before, after, sizeof(after));
}

static int run_step(unsigned step, unsigned window, tier_fence *fences) {
        uint64_t total = (uint64_t) n_tensors * arg_size, moved[TIER_LINK_SLOTS];
        unsigned spilled;
        double t0, t1, t2, t3;
        int r;

        moved_now(moved);
        t0 = now();
        r = step_write(step);
        if (r != 0)
                return r;
        t1 = now();
        spilled = count_spilled();
        printf("step %u/%u\n", step + 1, arg_steps);
        printf("  write     %10s by the CPU into host memory   %7.2f s  %6.2f GB/s"
               "  (tierd spilled %u tensors to NVMe on its own)\n",
               human(total), t1 - t0, gbps(total, t1 - t0), spilled);
        print_moved(moved);

        t2 = now();
        r = step_evict(fences);
        if (r != 0)
                return r;
        t3 = now();
        printf("  evict     %10s host -> nvme                   %7.2f s  %6.2f GB/s\n",
               human((uint64_t) (n_tensors - spilled) * arg_size), t3 - t2,
               gbps((uint64_t) (n_tensors - spilled) * arg_size, t3 - t2));
        print_moved(moved);

        t0 = now();
        r = step_read(step, window, fences);
        if (r != 0)
                return r;
        t1 = now();
        printf("  read      %10s nvme -> host, every byte checked %5.2f s  %6.2f GB/s\n",
               human(total), t1 - t0, gbps(total, t1 - t0));
        print_moved(moved);
        return 0;
}

/* ---- VRAM, once ------------------------------------------------------------------------ */

static int vram_round_trip(unsigned last_step) {
        struct tier_grant g;
        int64_t bad;
        double t0 = now();
        int r;

        r = tier_pin(tensors[0], TIER_VRAM, TIER_READ_WRITE, &g);
        if (r < 0)
                return fail(r, "pin in vram", 0);
        if (!g.ptr) {
                /* The cuda backend hands out device memory: check it with CUDA, not the CPU. */
                printf("vram      backend %s gives device memory, host-side check skipped\n",
                       tier_client_vram_backend(client));
                r = tier_unpin(tensors[0], TIER_VRAM, 0);
                return r < 0 ? fail(r, "unpin vram", 0) : 0;
        }

        bad = check(g.ptr, g.length, 0, last_step);
        if (bad < 0) {
                bytes_verified += g.length;
                fill(g.ptr, g.length, 0, VRAM_STEP);
        } else
                report_mismatch(g.ptr, 0, last_step, "vram", bad);
        r = tier_unpin(tensors[0], TIER_VRAM, bad < 0);
        if (r < 0)
                return fail(r, "unpin vram", 0);
        if (bad >= 0)
                return 1;

        /* The VRAM copy is dirty: evicting it must carry the new bytes all the way down. */
        r = tier_evict(tensors[0], TIER_NVME);
        if (r < 0)
                return fail(r, "evict vram to nvme", 0);
        r = pin_and_check(0, TIER_HOST, VRAM_STEP);
        if (r != 0)
                return r;

        printf("vram      %10s host -> vram -> nvme -> host (%s backend) %5.2f s\n",
               human(arg_size), tier_client_vram_backend(client), now() - t0);
        return 0;
}

/* ---- setup ------------------------------------------------------------------------------- */

static void help(void) {
        printf("Usage: train-step [--socket PATH] [--job NAME] [--tensors N] [--size BYTES] [--steps N]\n"
               "\n"
               "A fake training loop: writes, evicts to NVMe and reads back more tensors\n"
               "than the job's host memory can hold, and checks every byte.\n"
               "\n"
               "  --socket PATH   tierd's socket (default: $TIER_SOCKET, else the built-in path)\n"
               "  --job NAME      job to join (default: demo)\n"
               "  --tensors N     number of tensors (default: enough for 2 x the job's host limit)\n"
               "  --size BYTES    bytes per tensor, > 0; K, M, G, ... are powers of 1024 (default: 16M)\n"
               "  --steps N       training steps (default: 2)\n");
}

static int parse_argv(int argc, char **argv) {
        enum { ARG_SOCKET = 0x100, ARG_JOB, ARG_TENSORS, ARG_SIZE, ARG_STEPS };
        static const struct option options[] = {
                { "socket",  required_argument, NULL, ARG_SOCKET },
                { "job",     required_argument, NULL, ARG_JOB },
                { "tensors", required_argument, NULL, ARG_TENSORS },
                { "size",    required_argument, NULL, ARG_SIZE },
                { "steps",   required_argument, NULL, ARG_STEPS },
                { "help",    no_argument,       NULL, 'h' },
                {}
        };
        int c;

        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0)
                switch (c) {
                case ARG_SOCKET:
                        arg_socket = optarg;
                        break;
                case ARG_JOB:
                        arg_job = optarg;
                        break;
                case ARG_TENSORS:
                        if (parse_unsigned(optarg, &arg_tensors) < 0) {
                                fprintf(stderr, "train-step: bad --tensors '%s'\n", optarg);
                                return -EINVAL;
                        }
                        break;
                case ARG_SIZE:
                        if (parse_size(optarg, &arg_size) < 0 || arg_size == 0) {
                                fprintf(stderr, "train-step: bad --size '%s' (e.g. 4096, 64K, 16M, 1G)\n",
                                        optarg);
                                return -EINVAL;
                        }
                        break;
                case ARG_STEPS:
                        if (parse_unsigned(optarg, &arg_steps) < 0) {
                                fprintf(stderr, "train-step: bad --steps '%s'\n", optarg);
                                return -EINVAL;
                        }
                        break;
                case 'h':
                        help();
                        exit(EXIT_SUCCESS);
                default:
                        return -EINVAL;
                }
        if (optind < argc) {
                fprintf(stderr, "train-step: unexpected argument '%s'\n", argv[optind]);
                return -EINVAL;
        }
        return 0;
}

/* Create the tensors, or reuse them if an earlier run of this job left them behind. */
static int create_tensors(void) {
        tensors = calloc(n_tensors, sizeof(*tensors));
        if (!tensors)
                return -ENOMEM;
        for (unsigned i = 0; i < n_tensors; i++) {
                char name[32];
                int r;

                snprintf(name, sizeof(name), "layer%04u", i);
                r = tier_tensor_create(client, name, arg_size, &tensors[i]);
                if (r == -EEXIST)
                        r = tier_tensor_open(client, name, &tensors[i]);
                if (r < 0)
                        return fail(r, "create", i);
                if (tier_tensor_size(tensors[i]) != arg_size) {
                        fprintf(stderr, "train-step: tensor %s exists with %s, not %s; use another --job\n",
                                name, human(tier_tensor_size(tensors[i])), human(arg_size));
                        return -EEXIST;
                }
        }
        return 0;
}

static void destroy_tensors(void) {
        for (unsigned i = 0; tensors && i < n_tensors; i++) {
                if (tensors[i] && tier_tensor_destroy(tensors[i]) < 0)
                        tier_tensor_close(tensors[i]);  /* keep going: the job's linger time cleans up */
                tensors[i] = NULL;
        }
        free(tensors);
        tensors = NULL;
}

int main(int argc, char **argv) {
        uint64_t host_limit;
        tier_fence *fences = NULL;
        unsigned window;
        double t0;
        int r;

        if (parse_argv(argc, argv) < 0)
                return 2;

        r = tier_client_new(arg_socket, arg_job, 0, &client);
        if (r < 0) {
                fprintf(stderr, "train-step: %s\n", tier_client_last_error(NULL));
                return 1;
        }

        /* Size the run so that it cannot fit in the job's host memory. */
        host_limit = tier_client_limit(client, TIER_HOST);
        n_tensors = arg_tensors;
        if (n_tensors == 0) {
                uint64_t n = host_limit ? (2 * host_limit + arg_size - 1) / arg_size : 8;
                n_tensors = n > 100000 ? 100000 : (unsigned) n;
        }
        /* Prefetch at most half the host limit ahead, so prefetches never evict each other. */
        window = host_limit ? (unsigned) (host_limit / 2 / arg_size) : 4;
        if (window == 0)
                window = 1;

        printf("job %s: %u tensors x %s = %s, host limit %s, vram backend %s\n", arg_job, n_tensors,
               human(arg_size), human((uint64_t) n_tensors * arg_size),
               host_limit ? human(host_limit) : "unknown", tier_client_vram_backend(client));

        fences = calloc(n_tensors, sizeof(*fences));
        r = fences ? create_tensors() : -ENOMEM;
        t0 = now();
        for (unsigned step = 0; r == 0 && step < arg_steps; step++)
                r = run_step(step, window, fences);
        if (r == 0)
                r = vram_round_trip(arg_steps - 1);

        if (r == 0)
                printf("verified %" PRIu64 " bytes, 0 errors (%.2f s)\n", bytes_verified, now() - t0);
        destroy_tensors();
        free(fences);
        tier_client_free(client);
        return r == 0 ? 0 : 1;
}
