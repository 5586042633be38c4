/* SPDX-License-Identifier: MIT */
/* bench-vram-cuda.c: host<->VRAM bandwidth through tierd's cuda backend vs raw cuMemcpy*Async. */

/*
 * usage: bench-vram-cuda [--size BYTES] [--tensor BYTES] [--rounds N] [--probe]
 *
 * Starts its own tierd (from $TIER_BUILD, with [vram] backend = cuda),
 * creates --size bytes of tensors of --tensor bytes each (one VRAM chunk
 * each), gives them valid host copies, then times, --rounds times each:
 *   h2d: tier_prefetch_async() of every tensor to VRAM, until every fence
 *        is done (tierd's host pool -> its VMM chunks on its streams);
 *   d2h: tier_evict_async() of every tensor, dirty in VRAM, to host.
 * In the same run it times the raw driver on the same sizes: one
 * cuMemcpyHtoDAsync / cuMemcpyDtoHAsync per tensor between cuMemHostAlloc
 * memory and cuMemAlloc memory, on two streams, until both are idle.
 * Prints one JSON line: h2d_gbps, d2h_gbps, raw_h2d_gbps, raw_d2h_gbps (the
 * median of the rounds, 1 GB = 1e9 bytes), their ratios and every round.
 *
 * --probe prints the device tierd would use and exits; without a usable
 * CUDA device both modes print "no CUDA device: REASON" and exit 77.
 */

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tier.h>

#include "bench/common.h"
#include "proto/cudrv.h"
#include "tests/helpers/daemon.h"
#include "util/size.h"
#include "util/time-util.h"

#define MiB ((uint64_t) 1 << 20)
#define ROUNDS_MAX 20

static uint64_t arg_size = 4096 * MiB;
static uint64_t arg_tensor = 256 * MiB;
static uint64_t arg_rounds = 3;
static bool arg_probe;

static double gbps(uint64_t bytes, uint64_t ns) {
        return ns ? (double) bytes / (double) ns : NAN;        /* bytes per ns = GB/s */
}

static int cu_check(const CuDriver *d, CUresult r, const char *what) {
        char buf[160];

        if (r == CUDA_SUCCESS)
                return 0;
        bench_log("%s: %s", what, cudrv_strerror(d, r, buf, sizeof(buf)));
        return -EIO;
}

static int probe(CuDriver **ret) {
        _cleanup_free_ char *why = NULL;
        char name[128] = "", bus[32] = "";
        CuDriver *d = NULL;
        CUdevice dev;
        size_t free_b = 0, total = 0;
        CUcontext ctx;
        int n = 0;

        if (cudrv_open(&d, &why) < 0) {
                printf("no CUDA device: %s\n", why ? why : "?");
                return 77;
        }
        if (d->cuDeviceGetCount(&n) != CUDA_SUCCESS || n <= 0 || d->cuDeviceGet(&dev, 0) != CUDA_SUCCESS) {
                printf("no CUDA device: the driver reports none\n");
                cudrv_close(d);
                return 77;
        }
        (void) d->cuDeviceGetName(name, sizeof(name), dev);
        (void) d->cuDeviceGetPCIBusId(bus, sizeof(bus), dev);
        if (d->cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || d->cuCtxSetCurrent(ctx) != CUDA_SUCCESS ||
            d->cuMemGetInfo(&free_b, &total) != CUDA_SUCCESS) {
                printf("no CUDA device: device 0 (%s) cannot be used\n", name);
                cudrv_close(d);
                return 77;
        }
        if (arg_probe) {
                BenchJson j;

                bench_json_init(&j, "vram-cuda-probe");
                bench_json_string(&j, "device", name);
                bench_json_string(&j, "pci_bus_id", bus);
                bench_json_i64(&j, "driver_version", d->version);
                bench_json_u64(&j, "devices", (uint64_t) n);
                bench_json_u64(&j, "memory_total", total);
                bench_json_u64(&j, "memory_free", free_b);
                (void) bench_json_print(&j);
        }
        *ret = d;
        return 0;
}

/* ---- through tierd ------------------------------------------------------------------------ */

typedef struct Run {
        tier_client *c;
        tier_tensor **t;
        tier_fence *f;
        size_t n;
} Run;

static int wait_all(Run *r) {
        for (size_t i = 0; i < r->n; i++) {
                int k = tier_fence_wait(r->c, r->f[i], 120000);

                if (k < 0) {
                        bench_log("fence of tensor %zu: %s (%s)", i, tier_strerror(k), tier_client_last_error(r->c));
                        return k;
                }
        }
        return 0;
}

/* Every tensor: a valid host copy only (version > 0, so moving it means copying it). */
static int to_host_only(Run *r, uint8_t pattern) {
        for (size_t i = 0; i < r->n; i++) {
                struct tier_grant g;
                int k;

                k = tier_pin(r->t[i], TIER_HOST, TIER_READ_WRITE, &g);
                if (k < 0)
                        return k;
                memset(g.ptr, pattern + (int) i, 4096);
                k = tier_unpin(r->t[i], TIER_HOST, 1);
                if (k >= 0)
                        k = tier_evict(r->t[i], TIER_HOST);     /* drops a VRAM copy if any */
                if (k < 0)
                        return k;
        }
        return 0;
}

/* Every tensor: a dirty VRAM copy only (pinning a resident copy moves nothing). */
static int to_vram_dirty(Run *r) {
        for (size_t i = 0; i < r->n; i++) {
                struct tier_grant g;
                int k;

                k = tier_prefetch(r->t[i], TIER_VRAM);
                if (k >= 0)
                        k = tier_pin(r->t[i], TIER_VRAM, TIER_READ_WRITE, &g);
                if (k >= 0)
                        k = tier_unpin(r->t[i], TIER_VRAM, 1);  /* the host copy is stale now */
                if (k < 0)
                        return k;
        }
        return 0;
}

static int bench_tierd(Run *r, double *h2d, double *d2h) {
        uint64_t bytes = arg_tensor * r->n, t0;
        int k;

        for (uint64_t round = 0; round < arg_rounds; round++) {
                k = to_host_only(r, (uint8_t) round);
                if (k < 0)
                        return k;
                t0 = now_ns();
                for (size_t i = 0; i < r->n; i++) {
                        k = tier_prefetch_async(r->t[i], TIER_VRAM, &r->f[i]);
                        if (k < 0)
                                return k;
                }
                k = wait_all(r);
                if (k < 0)
                        return k;
                h2d[round] = gbps(bytes, now_ns() - t0);

                k = to_vram_dirty(r);
                if (k < 0)
                        return k;
                t0 = now_ns();
                for (size_t i = 0; i < r->n; i++) {
                        k = tier_evict_async(r->t[i], TIER_HOST, &r->f[i]);
                        if (k < 0)
                                return k;
                }
                k = wait_all(r);
                if (k < 0)
                        return k;
                d2h[round] = gbps(bytes, now_ns() - t0);
                bench_log("round %" PRIu64 ": tierd h2d %.2f GB/s, d2h %.2f GB/s", round, h2d[round], d2h[round]);
        }

        /* the bytes made it there and back */
        for (size_t i = 0; i < r->n; i++) {
                struct tier_grant g;

                k = tier_pin(r->t[i], TIER_HOST, TIER_READ_WRITE, &g);
                if (k < 0)
                        return k;
                for (size_t b = 0; b < 4096; b++)
                        if (((uint8_t *) g.ptr)[b] != (uint8_t) (arg_rounds - 1 + i)) {
                                bench_log("tensor %zu byte %zu is wrong after the round trip", i, b);
                                (void) tier_unpin(r->t[i], TIER_HOST, 0);
                                return -EBADMSG;
                        }
                (void) tier_unpin(r->t[i], TIER_HOST, 0);
        }
        return 0;
}

/* ---- raw driver ----------------------------------------------------------------------------- */

static int bench_raw(CuDriver *d, size_t n, double *h2d, double *d2h) {
        uint64_t bytes = arg_tensor * n, t0;
        CUstream s[2] = {};
        CUdeviceptr dev = 0;
        void *host = NULL;
        int k = -EIO;

        if (cu_check(d, d->cuMemHostAlloc(&host, bytes, 0), "cuMemHostAlloc") < 0 ||
            cu_check(d, d->cuMemAlloc(&dev, bytes), "cuMemAlloc") < 0 ||
            cu_check(d, d->cuStreamCreate(&s[0], CU_STREAM_NON_BLOCKING), "cuStreamCreate") < 0 ||
            cu_check(d, d->cuStreamCreate(&s[1], CU_STREAM_NON_BLOCKING), "cuStreamCreate") < 0)
                goto finish;
        memset(host, 0x5a, bytes);
        for (uint64_t round = 0; round < arg_rounds; round++) {
                t0 = now_ns();
                for (size_t i = 0; i < n; i++)
                        if (cu_check(d, d->cuMemcpyHtoDAsync(dev + i * arg_tensor, (uint8_t *) host + i * arg_tensor,
                                                            arg_tensor, s[i % 2]), "cuMemcpyHtoDAsync") < 0)
                                goto finish;
                if (cu_check(d, d->cuStreamSynchronize(s[0]), "sync") < 0 ||
                    cu_check(d, d->cuStreamSynchronize(s[1]), "sync") < 0)
                        goto finish;
                h2d[round] = gbps(bytes, now_ns() - t0);

                t0 = now_ns();
                for (size_t i = 0; i < n; i++)
                        if (cu_check(d, d->cuMemcpyDtoHAsync((uint8_t *) host + i * arg_tensor, dev + i * arg_tensor,
                                                            arg_tensor, s[i % 2]), "cuMemcpyDtoHAsync") < 0)
                                goto finish;
                if (cu_check(d, d->cuStreamSynchronize(s[0]), "sync") < 0 ||
                    cu_check(d, d->cuStreamSynchronize(s[1]), "sync") < 0)
                        goto finish;
                d2h[round] = gbps(bytes, now_ns() - t0);
                bench_log("round %" PRIu64 ": raw h2d %.2f GB/s, d2h %.2f GB/s", round, h2d[round], d2h[round]);
        }
        k = 0;
finish:
        for (int i = 0; i < 2; i++)
                if (s[i])
                        (void) d->cuStreamDestroy(s[i]);
        if (dev)
                (void) d->cuMemFree(dev);
        if (host)
                (void) d->cuMemFreeHost(host);
        return k;
}

/* ---- main --------------------------------------------------------------------------------------- */

static void usage(void) {
        fprintf(stderr, "usage: %s [--size BYTES] [--tensor BYTES] [--rounds N] [--probe]\n",
                program_invocation_short_name);
}

int main(int argc, char *argv[]) {
        static const struct option options[] = {
                { "size", required_argument, NULL, 's' },
                { "tensor", required_argument, NULL, 't' },
                { "rounds", required_argument, NULL, 'r' },
                { "probe", no_argument, NULL, 'p' },
                { "help", no_argument, NULL, 'h' },
                {}
        };
        double h2d[ROUNDS_MAX], d2h[ROUNDS_MAX], raw_h2d[ROUNDS_MAX], raw_d2h[ROUNDS_MAX];
        double m_h2d, m_d2h, m_raw_h2d, m_raw_d2h;
        char config[1024];
        TestDaemon daemon_;
        CuDriver *d = NULL;
        Run r = {};
        BenchJson j;
        int c, k;

        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0)
                switch (c) {
                case 's':
                        if (size_parse(optarg, &arg_size) < 0)
                                return bench_log("bad --size '%s'", optarg), 2;
                        break;
                case 't':
                        if (size_parse(optarg, &arg_tensor) < 0 || arg_tensor < MiB || arg_tensor % MiB)
                                return bench_log("bad --tensor '%s' (whole MiB)", optarg), 2;
                        break;
                case 'r':
                        if (bench_parse_uint(optarg, 1, ROUNDS_MAX, &arg_rounds) < 0)
                                return bench_log("bad --rounds '%s' (1..%d)", optarg, ROUNDS_MAX), 2;
                        break;
                case 'p':
                        arg_probe = true;
                        break;
                case 'h':
                        usage();
                        return 0;
                default:
                        usage();
                        return 2;
                }
        if (optind < argc || arg_size < arg_tensor) {
                usage();
                return 2;
        }

        k = probe(&d);
        if (k != 0 || arg_probe) {
                cudrv_close(d);
                return k;
        }
        r.n = (size_t) (arg_size / arg_tensor);

        /* one chunk per tensor, and room to spare in each pool */
        snprintf(config, sizeof(config),
                 "[daemon]\nlinger_sec = 1\n"
                 "[limits]\nmax_inflight = 1024\nmax_tensors = 4096\n"
                 "[host]\ncapacity = %" PRIu64 "M\nsegment_size = %" PRIu64 "M\njob_limit = %" PRIu64 "M\n"
                 "[vram]\nbackend = cuda\ncapacity = %" PRIu64 "M\nchunk_size = %" PRIu64 "M\njob_limit = %" PRIu64 "M\n"
                 "[nvme]\ntarget = @DIR@/t0.img:256M\nextent_size = 1M\n",
                 (r.n + 1) * arg_tensor / MiB, arg_tensor / MiB, (r.n + 1) * arg_tensor / MiB,
                 (r.n + 1) * arg_tensor / MiB, arg_tensor / MiB, (r.n + 1) * arg_tensor / MiB);
        k = test_daemon_start(&daemon_, config);
        if (k < 0) {
                bench_log("cannot start tierd: %s", strerror(-k));
                cudrv_close(d);
                return 1;
        }

        r.t = calloc(r.n, sizeof(*r.t));
        r.f = calloc(r.n, sizeof(*r.f));
        k = r.t && r.f ? bench_connect(&r.c, daemon_.socket, "bench-vram", 0, 10000) : -ENOMEM;
        if (k >= 0 && strcmp(tier_client_vram_backend(r.c), "cuda") != 0) {
                bench_log("tierd's VRAM backend is \"%s\", not cuda", tier_client_vram_backend(r.c));
                k = -ENODEV;
        }
        for (size_t i = 0; k >= 0 && i < r.n; i++) {
                char name[32];

                snprintf(name, sizeof(name), "t%zu", i);
                k = tier_tensor_create(r.c, name, arg_tensor, &r.t[i]);
        }
        if (k >= 0)
                k = bench_tierd(&r, h2d, d2h);
        if (k < 0)
                bench_log("through tierd: %s (%s)", tier_strerror(k), r.c ? tier_client_last_error(r.c) : "");
        tier_client_free(r.c);
        for (size_t i = 0; r.t && i < r.n; i++)
                tier_tensor_close(r.t[i]);
        if (test_daemon_stop(&daemon_) != 0)
                bench_log("tierd did not stop cleanly");
        if (k >= 0) {
                CUcontext ctx;
                CUdevice dev;

                k = d->cuDeviceGet(&dev, 0) == CUDA_SUCCESS && d->cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS &&
                    d->cuCtxSetCurrent(ctx) == CUDA_SUCCESS ? 0 : -EIO;
                if (k >= 0)
                        k = bench_raw(d, r.n, raw_h2d, raw_d2h);
        }
        cudrv_close(d);
        free(r.t);
        free(r.f);
        if (k < 0)
                return 1;

        m_h2d = bench_median(h2d, arg_rounds);
        m_d2h = bench_median(d2h, arg_rounds);
        m_raw_h2d = bench_median(raw_h2d, arg_rounds);
        m_raw_d2h = bench_median(raw_d2h, arg_rounds);
        bench_json_init(&j, "vram-cuda");
        bench_json_u64(&j, "bytes", arg_tensor * r.n);
        bench_json_u64(&j, "tensor_bytes", arg_tensor);
        bench_json_u64(&j, "rounds", arg_rounds);
        bench_json_double(&j, "h2d_gbps", m_h2d);
        bench_json_double(&j, "d2h_gbps", m_d2h);
        bench_json_double(&j, "raw_h2d_gbps", m_raw_h2d);
        bench_json_double(&j, "raw_d2h_gbps", m_raw_d2h);
        bench_json_double(&j, "h2d_ratio", m_h2d / m_raw_h2d);
        bench_json_double(&j, "d2h_ratio", m_d2h / m_raw_d2h);
        bench_json_bool(&j, "goal_met", m_h2d >= 0.9 * m_raw_h2d && m_d2h >= 0.9 * m_raw_d2h);
        bench_json_double_array(&j, "h2d_rounds", h2d, arg_rounds);
        bench_json_double_array(&j, "d2h_rounds", d2h, arg_rounds);
        bench_json_double_array(&j, "raw_h2d_rounds", raw_h2d, arg_rounds);
        bench_json_double_array(&j, "raw_d2h_rounds", raw_d2h, arg_rounds);
        return bench_json_print(&j) < 0 ? 1 : 0;
}
