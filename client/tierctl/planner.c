/* SPDX-License-Identifier: MIT */
/* planner.c: the arithmetic of tierctl plan; the formulas are in planner.h and docs/PLANNING.md. */

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/tierctl/planner.h"
#include "client/tierctl/plansim.h"
#include "proto/macro.h"

#define GB 1e9

void plan_input_init(PlanInput *in) {
        *in = (PlanInput) {
                .bytes = { [PLAN_CLASS_WEIGHTS] = 2, [PLAN_CLASS_GRADS] = 2,
                           [PLAN_CLASS_MASTER] = 4, [PLAN_CLASS_MOMENTS] = 8 },
                .seq = 2048,
                .micro_batch = 1,
                .accumulation = 1,
                .placement = -1,
        };
}

_printf_(3, 4) static int fail(char *err, size_t err_size, const char *fmt, ...) {
        va_list ap;

        va_start(ap, fmt);
        (void) vsnprintf(err, err_size, fmt, ap);
        va_end(ap);
        return -EINVAL;
}

static bool positive(double v) {
        return isfinite(v) && v > 0;
}

int plan_validate(const PlanInput *in, char *err, size_t err_size) {
        bool shape = in->layers || in->hidden || in->ffn || in->vocab || in->heads;
        double sum = 0;

        if (in->params != 0 && shape)
                return fail(err, err_size, "give the model either by size (--params) or by shape "
                            "(--layers --hidden --ffn --vocab --heads), not both");
        if (shape) {
                if (!in->layers || !in->hidden || !in->ffn || !in->vocab || !in->heads)
                        return fail(err, err_size, "a model shape needs all of --layers, --hidden, --ffn, "
                                    "--vocab and --heads, each above 0");
                if (in->hidden % in->heads)
                        return fail(err, err_size, "--hidden %llu is not a multiple of --heads %llu",
                                    (unsigned long long) in->hidden, (unsigned long long) in->heads);
        } else if (!positive(in->params))
                return fail(err, err_size, "no model: give --params (e.g. 13B) or the shape "
                            "(--layers --hidden --ffn --vocab --heads)");
        for (unsigned c = 0; c < _PLAN_CLASS_MAX; c++) {
                if (!isfinite(in->bytes[c]) || in->bytes[c] < 0)
                        return fail(err, err_size, "bytes per parameter of %s must be 0 or more",
                                    plan_class_name(c));
                sum += in->bytes[c];
        }
        if (sum <= 0)
                return fail(err, err_size, "the state classes add up to 0 bytes per parameter: "
                            "give at least one --bytes-* above 0");
        if (!in->seq || !in->micro_batch || !in->accumulation)
                return fail(err, err_size, "--seq, --micro-batch and --accumulation must be at least 1");
        if (!in->vram)
                return fail(err, err_size, "--vram must be above 0 (the GPU's memory, e.g. 16G)");
        if (!in->host_ram)
                return fail(err, err_size, "--host-ram must be above 0 (the host memory for the job, e.g. 64G)");
        if (!positive(in->link_gbs))
                return fail(err, err_size, "--link must be above 0 GB/s (host<->GPU, e.g. 25 for PCIe 4.0 x16)");
        if (!positive(in->tflops) && !positive(in->compute_s))
                return fail(err, err_size, "give --tflops (the achieved TFLOP/s, not the peak) or --compute-s "
                            "(the measured compute time of a step), above 0");
        if ((in->vram_limit > 0) != (in->host_limit > 0))
                return fail(err, err_size, "give both --vram-limit and --host-limit (the job's budgets) or neither");
        if (in->vram_limit > 0 && !in->blocks && !in->layers && !in->plan)
                return fail(err, err_size, "a replay under --vram-limit and --host-limit needs the layers: "
                            "give the shape, --blocks N or --plan FILE");
        if (in->vram_limit > 0 && in->drives == 0)
                return fail(err, err_size, "a replay under --vram-limit and --host-limit needs the drives "
                            "(--drives N --drive-read GB/s --drive-write GB/s): what does not fit goes there");
        if (in->drives > 0 && (!positive(in->drive_read_gbs) || !positive(in->drive_write_gbs)))
                return fail(err, err_size, "with --drives %u, --drive-read and --drive-write must be above 0 GB/s",
                            in->drives);
        if (!isfinite(in->tbw) || in->tbw < 0)
                return fail(err, err_size, "--tbw must be 0 (not given) or more");
        if (in->placement >= _PLAN_PLACEMENT_MAX || in->placement < -1)
                return fail(err, err_size, "--placement must be A, B or C");
        if (in->placement > PLAN_PLACEMENT_A && in->drives == 0)
                return fail(err, err_size, "--placement %s puts state on NVMe but --drives is 0: "
                            "give the drives (--drives N --drive-read GB/s --drive-write GB/s) or use --placement A",
                            plan_placement_name(in->placement));
        return 0;
}

/* Activation bytes (fp16) on the GPU for one micro-batch (Korthikanti et al. 2022, no sequence parallelism). */
static double activations(const PlanInput *in) {
        double s = (double) in->seq, b = (double) in->micro_batch, h = (double) in->hidden;
        double a = (double) in->heads, L = (double) in->layers;
        double full = s * b * h * (34.0 + 5.0 * a * s / h);

        if (in->checkpointing)
                return L * 2.0 * s * b * h + full;
        return L * full;
}

/* Smallest n >= 1 with n * per + fixed <= n * c; 0 when n = current already does, -1 when none. */
static int64_t accumulation_needed(double c, double per, double fixed, uint64_t current) {
        double n;

        if ((double) current * c >= fixed + (double) current * per)
                return 0;
        if (c <= per)
                return -1;
        n = ceil(fixed / (c - per));
        return n > (double) INT64_MAX ? -1 : (int64_t) n;
}

static void placement(const PlanInput *in, const PlanResult *r, PlanPlacement p, PlanPlacementResult *ret) {
        double P = r->params, A = (double) in->accumulation;
        double w = in->bytes[PLAN_CLASS_WEIGHTS] * P, g = in->bytes[PLAN_CLASS_GRADS] * P;
        double opt = (in->bytes[PLAN_CLASS_MASTER] + in->bytes[PLAN_CLASS_MOMENTS]) * P;
        double read_bw = in->drives * in->drive_read_gbs * GB, write_bw = in->drives * in->drive_write_gbs * GB;
        double c = r->t_compute / A;    /* compute of one micro-batch */
        double nvme_per = 0, nvme_fixed = 0, link_per;
        PlanPlacementResult x = {};

        x.tier[PLAN_CLASS_WEIGHTS] = p == PLAN_PLACEMENT_C ? PLAN_TIER_NVME : PLAN_TIER_HOST;
        x.tier[PLAN_CLASS_GRADS] = PLAN_TIER_HOST;
        x.tier[PLAN_CLASS_MASTER] = x.tier[PLAN_CLASS_MOMENTS] = p == PLAN_PLACEMENT_A ? PLAN_TIER_HOST : PLAN_TIER_NVME;
        for (unsigned k = 0; k < _PLAN_CLASS_MAX; k++)
                *(x.tier[k] == PLAN_TIER_HOST ? &x.host_bytes : &x.nvme_bytes) += r->class_bytes[k];
        x.fits_host = x.host_bytes <= (double) in->host_ram;
        x.possible = x.fits_host && (p == PLAN_PLACEMENT_A || in->drives > 0);

        x.link_down_bytes = A * 2.0 * w;
        x.link_up_bytes = A * g;
        link_per = (in->link_shared ? 2.0 * w + g : fmax(2.0 * w, g)) / (in->link_gbs * GB);
        x.t_link = A * link_per;
        if (p != PLAN_PLACEMENT_A) {
                x.nvme_read_bytes = opt;
                x.nvme_write_bytes = opt;
        }
        if (p == PLAN_PLACEMENT_C) {
                x.nvme_read_bytes += A * 2.0 * w;
                x.nvme_write_bytes += w;
        }
        if (in->drives > 0) {
                x.t_nvme = x.nvme_read_bytes / read_bw + x.nvme_write_bytes / write_bw;
                nvme_fixed = opt / read_bw + opt / write_bw;
                if (p == PLAN_PLACEMENT_C) {
                        nvme_per = 2.0 * w / read_bw;
                        nvme_fixed += w / write_bw;
                }
                if (p == PLAN_PLACEMENT_A)
                        nvme_fixed = 0;
        } else if (p != PLAN_PLACEMENT_A)
                x.t_nvme = INFINITY;

        x.step_overlapped = fmax(r->t_compute, fmax(x.t_link, x.t_nvme));
        x.step_serial = r->t_compute + x.t_link + x.t_nvme;
        x.bottleneck = x.step_overlapped == r->t_compute ? PLAN_BOTTLENECK_COMPUTE :
                       x.step_overlapped == x.t_link ? PLAN_BOTTLENECK_LINK : PLAN_BOTTLENECK_NVME;
        x.io_hidden = x.t_link <= r->t_compute && x.t_nvme <= r->t_compute;
        x.tokens_per_s = isfinite(x.step_overlapped) ? r->tokens_per_step / x.step_overlapped : 0;
        x.gpu_busy = isfinite(x.step_overlapped) ? r->t_compute / x.step_overlapped : 0;

        /* drives of this speed: t_nvme scales as 1 / drives */
        if (p == PLAN_PLACEMENT_A || x.t_nvme <= r->t_compute)
                x.drives_needed = 0;
        else if (in->drives == 0)
                x.drives_needed = -1;
        else
                x.drives_needed = (int64_t) ceil(x.t_nvme * in->drives / r->t_compute);
        if (x.drives_needed > 0 && x.t_link > r->t_compute)
                x.drives_needed = -1;   /* the link stays the bottleneck whatever the drives */

        /* accumulation: each link and the drives must hide behind A * c */
        {
                int64_t l = accumulation_needed(c, link_per, 0, in->accumulation);
                int64_t n = in->drives > 0 ? accumulation_needed(c, nvme_per, nvme_fixed, in->accumulation) :
                            (p == PLAN_PLACEMENT_A ? 0 : -1);

                /* l is 0 or -1 (the link has no per-step part) */
                x.accumulation_needed = l < 0 || n < 0 ? -1 : (l > n ? l : n);
        }

        if (in->drives > 0 && x.nvme_write_bytes > 0 && isfinite(x.step_overlapped)) {
                x.write_bytes_per_day_per_drive = x.nvme_write_bytes / in->drives * (86400.0 / x.step_overlapped);
                if (in->tbw > 0)
                        x.days_to_tbw = in->tbw * 1e12 / x.write_bytes_per_day_per_drive;
        }
        *ret = x;
}

void plan_compute(const PlanInput *in, PlanResult *ret) {
        PlanResult r = {};
        double factor = in->checkpointing ? 8.0 : 6.0;

        if (in->params > 0)
                r.params = in->params;
        else {
                double h = (double) in->hidden;
                r.params = (double) in->layers * (4.0 * h * h + 2.0 * h * (double) in->ffn) + (double) in->vocab * h;
                r.activations_known = true;
                r.activation_bytes = activations(in);
        }
        for (unsigned c = 0; c < _PLAN_CLASS_MAX; c++) {
                r.class_bytes[c] = in->bytes[c] * r.params;
                r.model_state_bytes += r.class_bytes[c];
        }
        r.tokens_per_step = (double) in->seq * (double) in->micro_batch * (double) in->accumulation;
        r.flops_per_step = factor * r.params * r.tokens_per_step;
        r.t_compute = in->compute_s > 0 ? in->compute_s : r.flops_per_step / (in->tflops * 1e12);
        r.fits_vram = r.model_state_bytes + r.activation_bytes <= (double) in->vram;
        for (unsigned p = 0; p < _PLAN_PLACEMENT_MAX; p++)
                placement(in, &r, p, &r.placements[p]);

        /* The decision tree of docs/PLANNING.md. */
        if (r.activation_bytes > (double) in->vram)
                r.verdict = PLAN_VERDICT_NO_FIT_VRAM;
        else if (in->placement >= 0) {
                r.chosen = in->placement;
                r.verdict = r.placements[r.chosen].fits_host ? PLAN_VERDICT_PLACEMENT : PLAN_VERDICT_NO_FIT_HOST;
        } else if (r.fits_vram)
                r.verdict = PLAN_VERDICT_GPU;
        else if (r.placements[PLAN_PLACEMENT_A].fits_host) {
                r.verdict = PLAN_VERDICT_PLACEMENT;
                r.chosen = PLAN_PLACEMENT_A;
        } else if (in->drives == 0)
                r.verdict = PLAN_VERDICT_NO_DRIVES;
        else if (r.placements[PLAN_PLACEMENT_B].fits_host) {
                r.verdict = PLAN_VERDICT_PLACEMENT;
                r.chosen = PLAN_PLACEMENT_B;
        } else if (r.placements[PLAN_PLACEMENT_C].fits_host) {
                r.verdict = PLAN_VERDICT_PLACEMENT;
                r.chosen = PLAN_PLACEMENT_C;
        } else
                r.verdict = PLAN_VERDICT_NO_FIT_HOST;
        *ret = r;
}

int plan_compute_limits(const PlanInput *in, PlanResult *r, char *err, size_t err_size) {
        PlanLimitsResult *x = &r->limits;
        double L = (double) (in->blocks ? in->blocks : in->layers);
        double fs = in->fwd_share, bs = in->bwd_share, os = in->opt_share;
        PlanSimInput si;
        PlanSimResult sr;
        int k;

        if (!in->vram_limit)
                return 0;
        if (fs == 0 && bs == 0 && os == 0) {
                fs = os = 1;
                bs = 2;                 /* the backward pass is about twice the forward */
        }
        si = (PlanSimInput) {
                .layers = (unsigned) (L > PLAN_SIM_MAX_LAYERS ? PLAN_SIM_MAX_LAYERS + 1 : L),
                .weights = r->class_bytes[PLAN_CLASS_WEIGHTS] / L,
                .grads = r->class_bytes[PLAN_CLASS_GRADS] / L,
                .opt = (r->class_bytes[PLAN_CLASS_MASTER] + r->class_bytes[PLAN_CLASS_MOMENTS]) / L,
                .vram_limit = (double) in->vram_limit, .host_limit = (double) in->host_limit,
                .fwd_s = fs, .bwd_s = bs, .opt_s = os,
        };
        if (in->plan) {
                double *phase_s = calloc(in->plan->n_phases, sizeof(*phase_s));
                PlanSimPlan plan = *in->plan;

                if (!phase_s)
                        return -ENOMEM;
                for (size_t p = 0; p < plan.n_phases; p++)
                        phase_s[p] = in->plan_kind[p] == 0 ? fs : in->plan_kind[p] == 1 ? bs : os;
                plan.phase_s = phase_s;
                k = plan_simulate_plan(&plan, si.vram_limit, si.host_limit, &sr, err, err_size);
                free(phase_s);
        } else
                k = plan_simulate(&si, &sr, err, err_size);
        if (k < 0)
                return k;
        x->given = true;
        x->link_down_bytes = sr.link_down;
        x->link_up_bytes = sr.link_up;
        x->nvme_read_bytes = sr.nvme_read;
        x->nvme_write_bytes = sr.nvme_write;
        x->t_link = (in->link_shared ? sr.link_down + sr.link_up : fmax(sr.link_down, sr.link_up)) /
                    (in->link_gbs * GB);
        x->t_nvme = sr.nvme_read / (in->drives * in->drive_read_gbs * GB) +
                    sr.nvme_write / (in->drives * in->drive_write_gbs * GB);
        x->step_overlapped = fmax(r->t_compute, fmax(x->t_link, x->t_nvme));
        x->step_serial = r->t_compute + x->t_link + x->t_nvme;
        x->bottleneck = x->step_overlapped == r->t_compute ? PLAN_BOTTLENECK_COMPUTE :
                        x->step_overlapped == x->t_link ? PLAN_BOTTLENECK_LINK : PLAN_BOTTLENECK_NVME;
        return 0;
}

static int parse_decimal(const char *s, double *ret, const char **rest) {
        char *end;
        double v;

        if (!s || !((*s >= '0' && *s <= '9') || *s == '.') || strpbrk(s, "xXpP"))
                return -EINVAL;         /* no sign, no hexadecimal, no inf or nan */
        errno = 0;
        v = strtod(s, &end);
        if (errno || end == s || !isfinite(v) || v < 0)
                return -EINVAL;
        *ret = v;
        *rest = end;
        return 0;
}

int plan_parse_count(const char *s, double *ret) {
        static const struct { char c; double mul; } units[] = {
                { 'K', 1e3 }, { 'M', 1e6 }, { 'B', 1e9 }, { 'G', 1e9 }, { 'T', 1e12 },
        };
        const char *rest;
        double v, mul = 1;

        if (parse_decimal(s, &v, &rest) < 0)
                return -EINVAL;
        if (*rest) {
                size_t i;

                for (i = 0; i < sizeof(units) / sizeof(units[0]); i++)
                        if (*rest == units[i].c || *rest == units[i].c + ('a' - 'A'))
                                break;
                if (i == sizeof(units) / sizeof(units[0]) || rest[1])
                        return -EINVAL;
                mul = units[i].mul;
        }
        if (!isfinite(v * mul))
                return -EINVAL;
        *ret = v * mul;
        return 0;
}

int plan_parse_number(const char *s, double *ret) {
        const char *rest;
        double v;

        if (parse_decimal(s, &v, &rest) < 0 || *rest)
                return -EINVAL;
        *ret = v;
        return 0;
}

const char *plan_placement_name(PlanPlacement p) {
        static const char *const n[] = { "A", "B", "C" };
        return (unsigned) p < _PLAN_PLACEMENT_MAX ? n[p] : "?";
}

const char *plan_tier_name(PlanTier t) {
        return t == PLAN_TIER_NVME ? "nvme" : "host";
}

const char *plan_class_name(PlanClass c) {
        static const char *const n[] = { "weights", "grads", "master", "moments" };
        return (unsigned) c < _PLAN_CLASS_MAX ? n[c] : "?";
}

const char *plan_bottleneck_name(PlanBottleneck b) {
        static const char *const n[] = { "compute", "link", "nvme" };
        return (unsigned) b <= PLAN_BOTTLENECK_NVME ? n[b] : "?";
}

const char *plan_verdict_name(PlanVerdict v) {
        static const char *const n[] = { "gpu", "placement", "no-fit-vram", "no-fit-host", "no-drives" };
        return (unsigned) v <= PLAN_VERDICT_NO_DRIVES ? n[v] : "?";
}
