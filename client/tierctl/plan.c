/* SPDX-License-Identifier: MIT */
/* plan.c: tierctl plan, the options and the output; the arithmetic is planner.c. Needs no tierd. */

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/tierctl/planhw.h"
#include "client/tierctl/planner.h"
#include "client/tierctl/tierctl.h"
#include "util/json.h"
#include "client/tierctl/planfile.h"
#include "util/size.h"

void plan_help(FILE *f) {
        fprintf(f,
                "Usage: tierctl plan (--params N | --layers L --hidden H --ffn F --vocab V --heads A)\n"
                "                    --vram SIZE --host-ram SIZE --link GB/s --tflops T [OPTIONS]\n"
                "\n"
                "Predict where a training job's model state goes (A: host RAM, B: optimizer state\n"
                "on NVMe, C: weights and optimizer state on NVMe), the bytes each link moves per\n"
                "step, the step time and its bottleneck, and what would hide the I/O.\n"
                "Hardware not given is taken from the last `tierctl bench` results, then from\n"
                "the running tierd; the output says where each figure came from.  See\n"
                "docs/PLANNING.md for the formulas.\n"
                "\n"
                "Model:\n"
                "  --params N           parameters: 13B, 350M, 1T, 6.7e9 (K M B T = 10^3..10^12)\n"
                "  --layers --hidden --ffn --vocab --heads   or the shape (all five)\n"
                "  --bytes-weights B    bytes per parameter of each state class (default 2, 2, 4\n"
                "  --bytes-grads B      and 8: mixed-precision AdamW, 16 in all)\n"
                "  --bytes-master B\n"
                "  --bytes-moments B\n"
                "  --seq N              tokens per sequence (default 2048)\n"
                "  --micro-batch N      sequences per micro-batch (default 1)\n"
                "  --accumulation N     micro-batches per optimizer step (default 1)\n"
                "  --checkpointing      activation checkpointing (recompute: 8 P T FLOPs, not 6)\n"
                "Hardware:\n"
                "  --vram SIZE          GPU memory (sizes as in tierd.conf: 16G)\n"
                "  --host-ram SIZE      host memory the job may use\n"
                "  --drives N           NVMe drives, striped (default 0)\n"
                "  --drive-read GB/s    read and write bandwidth of one drive\n"
                "  --drive-write GB/s\n"
                "  --link GB/s          host<->GPU bandwidth, each direction\n"
                "  --tflops T           achieved TFLOP/s of the GPU\n"
                "  --tbw TB             endurance of one drive in TB written (for the wear line)\n"
                "  --compute-s S        compute time of a step, measured (instead of --tflops)\n"
                "  --link-shared        the link's directions share its bandwidth (emulated VRAM)\n"
                "Job budgets (replay of a step the way tierd moves it, docs/PLANNING.md):\n"
                "  --vram-limit SIZE    the job's VRAM and host limits (both)\n"
                "  --host-limit SIZE\n"
                "  --blocks N           layers the state is split into (default: --layers)\n"
                "  --phase-times F,B,O  relative compute of a layer's forward, backward and\n"
                "                       optimizer phases (default 1,2,1)\n"
                "  --plan FILE          replay this iteration plan (bench/torch_plan.py writes\n"
                "                       tier.torch's) instead of the layer-by-layer one\n"
                "Sources:\n"
                "  --bench FILE         `tierctl bench` results (default: $XDG_CACHE_HOME/tierd/\n"
                "                       bench.json or ~/.cache/tierd/bench.json, when there)\n"
                "  --no-bench           ignore bench results\n"
                "  --socket PATH        the tierd to ask (default: tierctl's --socket)\n"
                "  --no-tierd           do not ask tierd\n"
                "Output:\n"
                "  --placement A|B|C    judge this placement instead of choosing one\n"
                "  --json               one JSON document (keys in tierctl(1))\n");
}

/* Where each hardware figure came from: "flag", "bench:PATH", "tierd", "default"; NULL: nowhere. */
enum { HW_VRAM, HW_HOST, HW_DRIVES, HW_READ, HW_WRITE, HW_LINK, HW_LINK_SHARED, _HW_MAX };
static const char *const hw_key[_HW_MAX] = {
        "vram_bytes", "host_bytes", "drives", "drive_read_gbps", "drive_write_gbps", "link_gbps", "link_shared",
};
static const char *hw_src[_HW_MAX];
static char bench_src[4200];
static char notes[3][300];

/* "16,34,16": three plain decimal numbers (plan_parse_number()), nothing else. */
static int parse_shares(const char *s, double *f, double *b, double *o) {
        double *out[3] = { f, b, o };
        char buf[256];
        char *p = buf;

        if (strlen(s) >= sizeof(buf))
                return -EINVAL;
        strcpy(buf, s);
        for (int i = 0; i < 3; i++) {
                char *comma = strchr(p, ',');

                if ((i < 2) != (comma != NULL))
                        return -EINVAL;
                if (comma)
                        *comma = '\0';
                if (plan_parse_number(p, out[i]) < 0)
                        return -EINVAL;
                p = comma ? comma + 1 : p;
        }
        return 0;
}

static int bad(const char *opt, const char *val, const char *what) {
        fprintf(stderr, "tierctl plan: %s%s '%s' is not %s\n", opt[0] == '-' ? "" : "--", opt, val, what);
        return EXIT_USAGE;
}

static int parse_uint(const char *s, uint64_t *ret) {
        double v;

        if (plan_parse_number(s, &v) < 0 || v != floor(v) || v > 1e15)
                return -EINVAL;
        *ret = (uint64_t) v;
        return 0;
}

static void gb(const char *label, double bytes) {
        printf("  %-26s %12.1f GB\n", label, bytes / 1e9);
}

static void print_text(const PlanInput *in, const PlanResult *r) {
        printf("Hardware:");
        for (unsigned k = 0; k < _HW_MAX; k++)
                if (hw_src[k])
                        printf(" %s from %s%s", hw_key[k], hw_src[k], k + 1 < _HW_MAX ? ";" : "");
        printf("\n");
        for (unsigned k = 0; k < 3; k++)
                if (notes[k][0])
                        printf("Note: %s\n", notes[k]);
        printf("Model: %.3g parameters, %.1f GB of state (", r->params, r->model_state_bytes / 1e9);
        for (unsigned c = 0; c < _PLAN_CLASS_MAX; c++)
                printf("%s%s %.1f", c ? ", " : "", plan_class_name(c), r->class_bytes[c] / 1e9);
        printf(" GB)\n");
        if (r->activations_known)
                printf("Activations: %.2f GB per micro-batch%s\n", r->activation_bytes / 1e9,
                       in->checkpointing ? " (checkpointing)" : "");
        else
                printf("Activations: unknown (give the shape instead of --params)\n");
        printf("Tokens per step: %.0f; compute %.3g FLOP = %.3f s at %g TFLOP/s\n\n",
               r->tokens_per_step, r->flops_per_step, r->t_compute, in->tflops);

        for (unsigned p = 0; p < _PLAN_PLACEMENT_MAX; p++) {
                const PlanPlacementResult *x = &r->placements[p];

                printf("Placement %s:", plan_placement_name(p));
                for (unsigned c = 0; c < _PLAN_CLASS_MAX; c++)
                        printf(" %s=%s", plan_class_name(c), plan_tier_name(x->tier[c]));
                printf("%s%s\n", x->fits_host ? "" : "  (does not fit in host RAM)",
                       p != PLAN_PLACEMENT_A && in->drives == 0 ? "  (no drives)" : "");
                gb("host RAM", x->host_bytes);
                gb("NVMe", x->nvme_bytes);
                gb("link down / step", x->link_down_bytes);
                gb("link up / step", x->link_up_bytes);
                gb("NVMe read / step", x->nvme_read_bytes);
                gb("NVMe write / step", x->nvme_write_bytes);
                printf("  t_compute %.3f s, t_link %.3f s, t_nvme %.3f s\n", r->t_compute, x->t_link, x->t_nvme);
                printf("  step %.3f s overlapped, %.3f s serial; bottleneck %s; %.0f tokens/s, GPU busy %.0f%%\n",
                       x->step_overlapped, x->step_serial, plan_bottleneck_name(x->bottleneck),
                       x->tokens_per_s, 100.0 * x->gpu_busy);
                if (x->write_bytes_per_day_per_drive > 0) {
                        printf("  wear: %.1f TB written per drive per day", x->write_bytes_per_day_per_drive / 1e12);
                        if (x->days_to_tbw > 0)
                                printf(", %.0f days to %g TBW", x->days_to_tbw, in->tbw);
                        printf("\n");
                }
        }

        if (r->limits.given) {
                const PlanLimitsResult *x = &r->limits;

                printf("Under the job's budgets (VRAM %.1f MB, host %.1f MB), replayed the way tierd moves it:\n",
                       (double) in->vram_limit / 1e6, (double) in->host_limit / 1e6);
                gb("link down / step", x->link_down_bytes);
                gb("link up / step", x->link_up_bytes);
                gb("NVMe read / step", x->nvme_read_bytes);
                gb("NVMe write / step", x->nvme_write_bytes);
                printf("  t_compute %.3f s, t_link %.3f s, t_nvme %.3f s\n", r->t_compute, x->t_link, x->t_nvme);
                printf("  step %.3f s overlapped, %.3f s serial; bottleneck %s\n", x->step_overlapped,
                       x->step_serial, plan_bottleneck_name(x->bottleneck));
        }
        printf("\nVerdict: ");
        switch (r->verdict) {
        case PLAN_VERDICT_GPU:
                printf("state and activations fit in VRAM: no offload needed.\n");
                return;
        case PLAN_VERDICT_NO_FIT_VRAM:
                printf("the activations (%.1f GB) alone do not fit in VRAM: turn on --checkpointing or "
                       "lower --micro-batch or --seq.\n", r->activation_bytes / 1e9);
                return;
        case PLAN_VERDICT_NO_FIT_HOST:
                printf("does not fit: even placement C needs %.1f GB of host RAM; add host memory.\n",
                       r->placements[PLAN_PLACEMENT_C].host_bytes / 1e9);
                return;
        case PLAN_VERDICT_NO_DRIVES:
                printf("the state does not fit in host RAM and there are no drives: add NVMe drives "
                       "(--drives) or host memory.\n");
                return;
        case PLAN_VERDICT_PLACEMENT:
                break;
        }
        {
                const PlanPlacementResult *x = &r->placements[r->chosen];

                printf("placement %s, %s.\n", plan_placement_name(r->chosen),
                       x->io_hidden ? "the I/O hides behind compute" : "the GPU waits on I/O");
                if (x->io_hidden)
                        return;
                if (x->drives_needed > 0)
                        printf("  %lld drives of this speed, striped, would hide the NVMe traffic.\n",
                               (long long) x->drives_needed);
                else if (x->t_nvme > r->t_compute)
                        printf("  more drives cannot help while the host<->GPU link is the bottleneck.\n");
                if (x->accumulation_needed > 0)
                        printf("  or --accumulation %lld (%.0f tokens per step) would hide all I/O.\n",
                               (long long) x->accumulation_needed,
                               (double) x->accumulation_needed * (double) in->seq * (double) in->micro_batch);
                else
                        printf("  more accumulation cannot hide the link: raise --micro-batch or --seq, keep a "
                               "larger hot set in VRAM, or use a faster link.\n");
        }
}

/* Byte and parameter counts are whole numbers in the JSON. */
static void json_count(JsonWriter *w, double v) {
        if (isfinite(v) && v >= 0 && v < 1.8e19)
                json_uint(w, (uint64_t) round(v));      /* (llround() stops at 2^63) */
        else
                json_null(w);
}

static int print_json(const PlanInput *in, const PlanResult *r) {
        JsonWriter w = JSON_WRITER_NULL;

        json_object_begin(&w);
        json_key(&w, "params");
        json_count(&w, r->params);
        json_key(&w, "model_state_bytes");
        json_count(&w, r->model_state_bytes);
        json_key(&w, "class_bytes");
        json_object_begin(&w);
        for (unsigned c = 0; c < _PLAN_CLASS_MAX; c++) {
                json_key(&w, plan_class_name(c));
                json_count(&w, r->class_bytes[c]);
        }
        json_object_end(&w);
        json_key(&w, "activation_bytes");
        if (r->activations_known)
                json_count(&w, r->activation_bytes);
        else
                json_null(&w);
        json_key(&w, "tokens_per_step");
        json_count(&w, r->tokens_per_step);
        json_key(&w, "flops_per_step");
        json_double(&w, r->flops_per_step);
        json_key(&w, "t_compute");
        json_double(&w, r->t_compute);
        json_key(&w, "fits_vram");
        json_bool(&w, r->fits_vram);
        json_key(&w, "placements");
        json_object_begin(&w);
        for (unsigned p = 0; p < _PLAN_PLACEMENT_MAX; p++) {
                const PlanPlacementResult *x = &r->placements[p];
                const struct { const char *key; double v; } nums[] = {
                        { "host_bytes", x->host_bytes }, { "nvme_bytes", x->nvme_bytes },
                        { "link_down_bytes", x->link_down_bytes }, { "link_up_bytes", x->link_up_bytes },
                        { "nvme_read_bytes", x->nvme_read_bytes }, { "nvme_write_bytes", x->nvme_write_bytes },
                        { "t_link", x->t_link }, { "t_nvme", x->t_nvme },
                        { "step_overlapped", x->step_overlapped }, { "step_serial", x->step_serial },
                        { "tokens_per_s", x->tokens_per_s }, { "gpu_busy", x->gpu_busy },
                        { "write_bytes_per_day_per_drive", x->write_bytes_per_day_per_drive },
                        { "days_to_tbw", x->days_to_tbw },
                };

                json_key(&w, plan_placement_name(p));
                json_object_begin(&w);
                json_key(&w, "tiers");
                json_object_begin(&w);
                for (unsigned c = 0; c < _PLAN_CLASS_MAX; c++) {
                        json_key(&w, plan_class_name(c));
                        json_string(&w, plan_tier_name(x->tier[c]));
                }
                json_object_end(&w);
                json_key(&w, "fits_host");
                json_bool(&w, x->fits_host);
                json_key(&w, "possible");
                json_bool(&w, x->possible);
                for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
                        json_key(&w, nums[i].key);
                        if (strstr(nums[i].key, "_bytes"))
                                json_count(&w, nums[i].v);
                        else if (isfinite(nums[i].v))
                                json_double(&w, nums[i].v);
                        else
                                json_null(&w);  /* NVMe placement without drives */
                }
                json_key(&w, "bottleneck");
                json_string(&w, plan_bottleneck_name(x->bottleneck));
                json_key(&w, "io_hidden");
                json_bool(&w, x->io_hidden);
                json_key(&w, "drives_needed");
                if (x->drives_needed >= 0)
                        json_int(&w, x->drives_needed);
                else
                        json_null(&w);
                json_key(&w, "accumulation_needed");
                if (x->accumulation_needed >= 0)
                        json_int(&w, x->accumulation_needed);
                else
                        json_null(&w);
                json_object_end(&w);
        }
        json_object_end(&w);
        json_key(&w, "limits");
        if (r->limits.given) {
                const PlanLimitsResult *x = &r->limits;
                const struct { const char *key; double v; } nums[] = {
                        { "vram_limit_bytes", (double) in->vram_limit }, { "host_limit_bytes", (double) in->host_limit },
                        { "link_down_bytes", x->link_down_bytes }, { "link_up_bytes", x->link_up_bytes },
                        { "nvme_read_bytes", x->nvme_read_bytes }, { "nvme_write_bytes", x->nvme_write_bytes },
                        { "t_link", x->t_link }, { "t_nvme", x->t_nvme },
                        { "step_overlapped", x->step_overlapped }, { "step_serial", x->step_serial },
                };

                json_object_begin(&w);
                for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
                        json_key(&w, nums[i].key);
                        if (strstr(nums[i].key, "_bytes"))
                                json_count(&w, nums[i].v);
                        else
                                json_double(&w, nums[i].v);
                }
                json_key(&w, "bottleneck");
                json_string(&w, plan_bottleneck_name(x->bottleneck));
                json_object_end(&w);
        } else
                json_null(&w);
        json_key(&w, "hardware");
        json_object_begin(&w);
        json_key(&w, "vram_bytes");
        json_uint(&w, in->vram);
        json_key(&w, "host_bytes");
        json_uint(&w, in->host_ram);
        json_key(&w, "drives");
        json_uint(&w, in->drives);
        json_key(&w, "drive_read_gbps");
        json_double(&w, in->drive_read_gbs);
        json_key(&w, "drive_write_gbps");
        json_double(&w, in->drive_write_gbs);
        json_key(&w, "link_gbps");
        json_double(&w, in->link_gbs);
        json_key(&w, "link_shared");
        json_bool(&w, in->link_shared);
        json_object_end(&w);
        json_key(&w, "sources");
        json_object_begin(&w);
        for (unsigned k = 0; k < _HW_MAX; k++)
                if (hw_src[k]) {
                        json_key(&w, hw_key[k]);
                        json_string(&w, hw_src[k]);
                }
        json_object_end(&w);
        json_key(&w, "notes");
        json_array_begin(&w);
        for (unsigned k = 0; k < 3; k++)
                if (notes[k][0])
                        json_string(&w, notes[k]);
        json_array_end(&w);
        json_key(&w, "verdict");
        json_string(&w, plan_verdict_name(r->verdict));
        json_key(&w, "placement");
        if (r->verdict == PLAN_VERDICT_PLACEMENT)
                json_string(&w, plan_placement_name(r->chosen));
        else
                json_null(&w);
        json_object_end(&w);
        return json_print(&w) < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* Read all of @path (at most 16 MiB) into a string; NULL with errno. */
static char *slurp(const char *path) {
        FILE *f = fopen(path, "re");
        char *buf = NULL;
        size_t n = 0, cap = 0;

        if (!f)
                return NULL;
        for (;;) {
                if (n + 4096 + 1 > cap) {
                        char *nb;

                        if (cap >= 16u << 20) {
                                free(buf);
                                fclose(f);
                                errno = EFBIG;
                                return NULL;
                        }
                        cap = cap ? cap * 2 : 65536;
                        nb = realloc(buf, cap);
                        if (!nb) {
                                free(buf);
                                fclose(f);
                                errno = ENOMEM;
                                return NULL;
                        }
                        buf = nb;
                }
                size_t k = fread(buf + n, 1, cap - n - 1, f);
                n += k;
                if (k == 0)
                        break;
        }
        if (ferror(f)) {
                free(buf);
                fclose(f);
                errno = EIO;
                return NULL;
        }
        fclose(f);
        buf[n] = 0;
        return buf;
}

/*
 * Fill the hardware figures not given: bench results, then tierd, then the
 * built-in defaults.  A missing default bench file and an unreachable tierd
 * are notes; a --bench file that cannot be read is an error.
 */
static int hardware(PlanInput *in, const char *bench, bool no_bench, const char *socket, bool no_tierd) {
        char err[256];
        char *def = NULL;

        if (!no_bench) {
                const char *path = bench;
                char *doc;
                PlanBenchFigures bf;

                if (!path)
                        path = def = planhw_bench_default_path();
                doc = path ? slurp(path) : NULL;
                if (!doc && bench) {
                        fprintf(stderr, "tierctl plan: cannot read --bench %s: %s\n", bench, strerror(errno));
                        return EXIT_USAGE;
                }
                if (doc) {
                        if (planhw_bench(doc, &bf, err, sizeof(err)) < 0) {
                                fprintf(stderr, "tierctl plan: %s %s; run tierctl bench again or give "
                                        "--no-bench\n", path, err);
                                free(doc);
                                free(def);
                                return EXIT_USAGE;
                        }
                        (void) snprintf(bench_src, sizeof(bench_src), "bench:%s", path);
                        if (!hw_src[HW_READ]) {
                                in->drive_read_gbs = bf.read_gbs;
                                hw_src[HW_READ] = bench_src;
                        }
                        if (!hw_src[HW_WRITE]) {
                                in->drive_write_gbs = bf.write_gbs;
                                hw_src[HW_WRITE] = bench_src;
                                if (bf.write_sustained)
                                        (void) snprintf(notes[0], sizeof(notes[0]), "drive write GB/s is the "
                                                        "sustained write rate of the bench results, not the best "
                                                        "burst");
                        }
                        if (!hw_src[HW_DRIVES] && no_tierd) {
                                in->drives = bf.targets;
                                hw_src[HW_DRIVES] = bench_src;
                        }
                        if (bf.targets > 1)
                                (void) snprintf(notes[1], sizeof(notes[1]), "per-drive GB/s are the bench's "
                                                "best striped rate over its %u targets / %u", bf.targets, bf.targets);
                        free(doc);
                }
        }
        free(def);
        if (!no_tierd) {
                tier_client *cl = NULL;
                char *st = NULL;
                PlanTierdFigures tf;
                int k;

                deadline_start();       /* a wedged tierd: exit 3 (--timeout), not a plan that never comes */
                k = tier_client_new(socket, NULL, 0, &cl);

                if (k >= 0)
                        k = tier_client_status(cl, TIER_STATUS_JSON, &st);
                if (k < 0 || planhw_tierd(st, &tf, err, sizeof(err)) < 0)
                        (void) snprintf(notes[2], sizeof(notes[2]), "no figures from tierd (%.200s): "
                                        "the built-in defaults or the options stand",
                                        k < 0 ? (cl ? why(cl, k) : strerror(-k)) : err);
                else {
                        const struct { unsigned key; bool have; } fill[] = {
                                { HW_VRAM, tf.vram_bytes > 0 }, { HW_HOST, tf.host_bytes > 0 },
                                /* a count of drives without their speed (tierd unthrottled) is no figure */
                                { HW_DRIVES, tf.nvme_bandwidth > 0 || (hw_src[HW_READ] && hw_src[HW_WRITE]) },
                                { HW_READ, tf.nvme_bandwidth > 0 },
                                { HW_WRITE, tf.nvme_bandwidth > 0 }, { HW_LINK, tf.vram_bandwidth > 0 },
                                { HW_LINK_SHARED, tf.vram_bandwidth > 0 && tf.vram_emulated },
                        };

                        if (!fill[2].have && !hw_src[HW_DRIVES] && tf.targets > 0)
                                (void) snprintf(notes[2], sizeof(notes[2]), "tierd has %u NVMe target(s) but no "
                                                "speed for them ([nvme] bandwidth = 0: unthrottled), so no drives "
                                                "are planned; run tierctl bench, or give --drives N "
                                                "--drive-read GB/s --drive-write GB/s", tf.targets);
                        for (size_t i = 0; i < sizeof(fill) / sizeof(fill[0]); i++) {
                                if (hw_src[fill[i].key] || !fill[i].have)
                                        continue;
                                hw_src[fill[i].key] = "tierd";
                                switch (fill[i].key) {
                                case HW_VRAM: in->vram = tf.vram_bytes; break;
                                case HW_HOST: in->host_ram = tf.host_bytes; break;
                                case HW_DRIVES: in->drives = tf.targets; break;
                                case HW_READ: in->drive_read_gbs = (double) tf.nvme_bandwidth / 1e9; break;
                                case HW_WRITE: in->drive_write_gbs = (double) tf.nvme_bandwidth / 1e9; break;
                                case HW_LINK: in->link_gbs = (double) tf.vram_bandwidth / 1e9; break;
                                case HW_LINK_SHARED: in->link_shared = true; break;
                                }
                        }
                }
                free(st);
                tier_client_free(cl);
                deadline_stop();
        }
        /* the job's budgets stand for the card and the host when nothing else does */
        if (!hw_src[HW_VRAM] && in->vram_limit) {
                in->vram = in->vram_limit;
                hw_src[HW_VRAM] = "vram-limit";
        }
        if (!hw_src[HW_HOST] && in->host_limit) {
                in->host_ram = in->host_limit;
                hw_src[HW_HOST] = "host-limit";
        }
        if (!hw_src[HW_LINK]) {
                in->link_gbs = 25;      /* PCIe 4.0 x16, one direction */
                hw_src[HW_LINK] = "default";
        }
        return EXIT_SUCCESS;
}

int verb_plan(int argc, char **argv) {
        enum {
                ARG_JSON = 0x100, ARG_PARAMS, ARG_LAYERS, ARG_HIDDEN, ARG_FFN, ARG_VOCAB, ARG_HEADS,
                ARG_BW, ARG_BG, ARG_BM, ARG_BO, ARG_SEQ, ARG_MB, ARG_ACC, ARG_CKPT, ARG_VRAM, ARG_HOST,
                ARG_DRIVES, ARG_DR, ARG_DW, ARG_LINK, ARG_TFLOPS, ARG_TBW, ARG_PLACEMENT,
                ARG_COMPUTE, ARG_SHARED, ARG_VLIM, ARG_HLIM, ARG_BLOCKS, ARG_PHASES, ARG_BENCH, ARG_NO_BENCH,
                ARG_SOCKET, ARG_NO_TIERD, ARG_PLAN,
        };
        static const struct option options[] = {
                { "json", no_argument, NULL, ARG_JSON },
                { "params", required_argument, NULL, ARG_PARAMS },
                { "layers", required_argument, NULL, ARG_LAYERS },
                { "hidden", required_argument, NULL, ARG_HIDDEN },
                { "ffn", required_argument, NULL, ARG_FFN },
                { "vocab", required_argument, NULL, ARG_VOCAB },
                { "heads", required_argument, NULL, ARG_HEADS },
                { "bytes-weights", required_argument, NULL, ARG_BW },
                { "bytes-grads", required_argument, NULL, ARG_BG },
                { "bytes-master", required_argument, NULL, ARG_BM },
                { "bytes-moments", required_argument, NULL, ARG_BO },
                { "seq", required_argument, NULL, ARG_SEQ },
                { "micro-batch", required_argument, NULL, ARG_MB },
                { "accumulation", required_argument, NULL, ARG_ACC },
                { "checkpointing", no_argument, NULL, ARG_CKPT },
                { "vram", required_argument, NULL, ARG_VRAM },
                { "host-ram", required_argument, NULL, ARG_HOST },
                { "drives", required_argument, NULL, ARG_DRIVES },
                { "drive-read", required_argument, NULL, ARG_DR },
                { "drive-write", required_argument, NULL, ARG_DW },
                { "link", required_argument, NULL, ARG_LINK },
                { "tflops", required_argument, NULL, ARG_TFLOPS },
                { "tbw", required_argument, NULL, ARG_TBW },
                { "placement", required_argument, NULL, ARG_PLACEMENT },
                { "compute-s", required_argument, NULL, ARG_COMPUTE },
                { "link-shared", no_argument, NULL, ARG_SHARED },
                { "vram-limit", required_argument, NULL, ARG_VLIM },
                { "host-limit", required_argument, NULL, ARG_HLIM },
                { "blocks", required_argument, NULL, ARG_BLOCKS },
                { "phase-times", required_argument, NULL, ARG_PHASES },
                { "plan", required_argument, NULL, ARG_PLAN },
                { "bench", required_argument, NULL, ARG_BENCH },
                { "no-bench", no_argument, NULL, ARG_NO_BENCH },
                { "socket", required_argument, NULL, ARG_SOCKET },
                { "no-tierd", no_argument, NULL, ARG_NO_TIERD },
                { "help", no_argument, NULL, 'h' },
                {}
        };
        PlanInput in;
        PlanResult r;
        const char *bench = NULL, *socket = arg_socket, *plan_path = NULL;
        PlanFile plan_file = {};
        bool no_bench = false, no_tierd = false;
        char err[256];
        uint64_t u;
        int c, li = -1;

        plan_input_init(&in);
        memset(hw_src, 0, sizeof(hw_src));
        memset(notes, 0, sizeof(notes));
        optind = 0;
        opterr = 0;
        while ((c = getopt_long(argc, argv, ":h", options, &li)) >= 0) {
                double *d = NULL;
                uint64_t *n = NULL;
                const char *name = li >= 0 ? options[li].name : "option";

                switch (c) {
                case 'h':
                        plan_help(stdout);
                        return EXIT_SUCCESS;
                case ARG_JSON:
                        arg_json = 1;
                        continue;
                case ARG_CKPT:
                        in.checkpointing = true;
                        continue;
                case ARG_SHARED:
                        in.link_shared = true;
                        hw_src[HW_LINK_SHARED] = "flag";
                        continue;
                case ARG_NO_BENCH:
                        no_bench = true;
                        continue;
                case ARG_NO_TIERD:
                        no_tierd = true;
                        continue;
                case ARG_BENCH:
                        bench = optarg;
                        continue;
                case ARG_PLAN:
                        plan_path = optarg;
                        continue;
                case ARG_SOCKET:
                        /* as tierctl --socket: libtier takes "" as "the default", another tierd's figures */
                        if (!*optarg) {
                                fprintf(stderr, "tierctl plan: --socket needs a path, not an empty string (leave "
                                        "--socket out for tierctl's, or give --no-tierd)\n");
                                return EXIT_USAGE;
                        }
                        socket = arg_socket = optarg;     /* (the deadline names it too) */
                        continue;
                case ARG_VLIM:
                case ARG_HLIM:
                        if (size_parse(optarg, c == ARG_VLIM ? &in.vram_limit : &in.host_limit) < 0 ||
                            !(c == ARG_VLIM ? in.vram_limit : in.host_limit))
                                return bad(c == ARG_VLIM ? "--vram-limit" : "--host-limit", optarg,
                                           "a size above 0 (24M, 16G)");
                        continue;
                case ARG_PHASES:
                        if (parse_shares(optarg, &in.fwd_share, &in.bwd_share, &in.opt_share) < 0 ||
                            !(in.fwd_share >= 0 && in.bwd_share >= 0 && in.opt_share >= 0) ||
                            !(in.fwd_share + in.bwd_share + in.opt_share > 0) ||
                            !isfinite(in.fwd_share + in.bwd_share + in.opt_share))
                                return bad("--phase-times", optarg, "three numbers F,B,O, 0 or more, not all 0 (16,34,16)");
                        li = -1;
                        continue;
                case ARG_PARAMS:
                        if (plan_parse_count(optarg, &in.params) < 0 || in.params <= 0)
                                return bad("--params", optarg, "a count of parameters above 0 (13B, 350M, 6.7e9)");
                        continue;
                case ARG_VRAM:
                case ARG_HOST:
                        if (size_parse(optarg, c == ARG_VRAM ? &in.vram : &in.host_ram) < 0)
                                return bad(c == ARG_VRAM ? "--vram" : "--host-ram", optarg, "a size (16G, 512G)");
                        hw_src[c == ARG_VRAM ? HW_VRAM : HW_HOST] = "flag";
                        continue;
                case ARG_PLACEMENT:
                        if (strlen(optarg) != 1 || !strchr("ABCabc", optarg[0]))
                                return bad("--placement", optarg, "A, B or C");
                        in.placement = (optarg[0] | 0x20) - 'a';
                        continue;
                case ARG_DRIVES:
                        if (parse_uint(optarg, &u) < 0 || u > 1024)
                                return bad("--drives", optarg, "a number of drives from 0 to 1024");
                        in.drives = (unsigned) u;
                        hw_src[HW_DRIVES] = "flag";
                        continue;
                case ARG_LAYERS: n = &in.layers; break;
                case ARG_HIDDEN: n = &in.hidden; break;
                case ARG_FFN: n = &in.ffn; break;
                case ARG_VOCAB: n = &in.vocab; break;
                case ARG_HEADS: n = &in.heads; break;
                case ARG_SEQ: n = &in.seq; break;
                case ARG_MB: n = &in.micro_batch; break;
                case ARG_ACC: n = &in.accumulation; break;
                case ARG_BW: d = &in.bytes[PLAN_CLASS_WEIGHTS]; break;
                case ARG_BG: d = &in.bytes[PLAN_CLASS_GRADS]; break;
                case ARG_BM: d = &in.bytes[PLAN_CLASS_MASTER]; break;
                case ARG_BO: d = &in.bytes[PLAN_CLASS_MOMENTS]; break;
                case ARG_DR: d = &in.drive_read_gbs; hw_src[HW_READ] = "flag"; break;
                case ARG_DW: d = &in.drive_write_gbs; hw_src[HW_WRITE] = "flag"; break;
                case ARG_LINK: d = &in.link_gbs; hw_src[HW_LINK] = "flag"; break;
                case ARG_COMPUTE: d = &in.compute_s; break;
                case ARG_BLOCKS: n = &in.blocks; break;
                case ARG_TFLOPS: d = &in.tflops; break;
                case ARG_TBW: d = &in.tbw; break;
                default:
                        return verb_bad_option("plan", c, argv);
                }
                if (n && (parse_uint(optarg, n) < 0 || *n == 0))
                        return bad(name, optarg, "a whole number above 0");
                if (d && plan_parse_number(optarg, d) < 0)
                        return bad(name, optarg, "a number, 0 or more");
                li = -1;
        }
        if (optind < argc) {
                fprintf(stderr, "tierctl plan: unexpected argument '%s' (try tierctl plan --help)\n", argv[optind]);
                return EXIT_USAGE;
        }
        c = hardware(&in, bench, no_bench, socket, no_tierd);
        if (c != EXIT_SUCCESS)
                return c;
        if (plan_path) {
                if (!in.vram_limit || !in.host_limit) {
                        fprintf(stderr, "tierctl plan: --plan replays the plan under the job's budgets: give "
                                "--vram-limit and --host-limit too\n");
                        return EXIT_USAGE;
                }
                if (plan_file_load(plan_path, &plan_file, err, sizeof(err)) < 0) {
                        fprintf(stderr, "tierctl plan: %s\n", err);
                        return EXIT_USAGE;
                }
                in.plan = &plan_file.plan;
                in.plan_kind = plan_file.kind;
        }
        if (plan_validate(&in, err, sizeof(err)) < 0) {
                fprintf(stderr, "tierctl plan: %s\n", err);
                plan_file_done(&plan_file);
                return EXIT_USAGE;
        }
        plan_compute(&in, &r);
        if (plan_compute_limits(&in, &r, err, sizeof(err)) < 0) {
                fprintf(stderr, "tierctl plan: %s\n", err);
                plan_file_done(&plan_file);
                return EXIT_USAGE;
        }
        c = arg_json ? print_json(&in, &r) : (print_text(&in, &r), EXIT_SUCCESS);
        plan_file_done(&plan_file);
        return c;
}
