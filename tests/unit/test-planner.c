/* SPDX-License-Identifier: MIT */
/* test-planner.c: tierctl plan's arithmetic (client/tierctl/planner.c) against hand-computed cases. */

#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "client/tierctl/jsonget.h"
#include "client/tierctl/planfile.h"
#include "client/tierctl/planhw.h"
#include "client/tierctl/planner.h"
#include "client/tierctl/plansim.h"

#define GIB (UINT64_C(1) << 30)
#define MIB (UINT64_C(1) << 20)

/* @a equals @b to a relative 1e-9. */
#define assert_near(a, b) do {                                                          \
                double _a = (a), _b = (b);                                              \
                if (!(fabs(_a - _b) <= 1e-9 * fmax(1.0, fabs(_b))))                     \
                        fail_msg("%s = %.12g, expected %.12g", #a, _a, _b);            \
        } while (0)

/* 13B on a 16G card, 64G of host RAM, one 3.5/3.0 GB/s drive, PCIe 4.0 x16, 100 TFLOP/s. */
static void input_13b(PlanInput *in) {
        plan_input_init(in);
        in->params = 13e9;
        in->vram = 16 * GIB;
        in->host_ram = 64 * GIB;
        in->drives = 1;
        in->drive_read_gbs = 3.5;
        in->drive_write_gbs = 3.0;
        in->link_gbs = 25;
        in->tflops = 100;
}

static void compute_ok(const PlanInput *in, PlanResult *r) {
        char err[256] = "";

        if (plan_validate(in, err, sizeof(err)) != 0)
                fail_msg("plan_validate: %s", err);
        plan_compute(in, r);
}

static void test_state_13b(void **state) {
        PlanInput in;
        PlanResult r;

        input_13b(&in);
        compute_ok(&in, &r);
        assert_near(r.model_state_bytes, 208e9);
        assert_near(r.class_bytes[PLAN_CLASS_WEIGHTS], 26e9);
        assert_near(r.class_bytes[PLAN_CLASS_GRADS], 26e9);
        assert_near(r.class_bytes[PLAN_CLASS_MASTER], 52e9);
        assert_near(r.class_bytes[PLAN_CLASS_MOMENTS], 104e9);
        assert_false(r.fits_vram);
        assert_false(r.activations_known);
}

static void test_state_1t(void **state) {
        PlanInput in;
        PlanResult r;
        double p;

        input_13b(&in);
        assert_int_equal(plan_parse_count("1T", &p), 0);
        in.params = p;
        compute_ok(&in, &r);
        assert_near(r.model_state_bytes, 16e12);
}

/* Per-class bytes are configurable: bf16 everything with 8-bit moments = 2 + 2 + 2 + 2. */
static void test_state_configurable(void **state) {
        PlanInput in;
        PlanResult r;

        input_13b(&in);
        in.bytes[PLAN_CLASS_MASTER] = 2;
        in.bytes[PLAN_CLASS_MOMENTS] = 2;
        compute_ok(&in, &r);
        assert_near(r.model_state_bytes, 104e9);
}

/* 200 GB per step at 25 GB/s is 8 s, on the link and on the drives. */
static void test_200gb_at_25(void **state) {
        PlanInput in;
        PlanResult r;

        /* link: 2 * weights * P down = 2 * 1 * 100e9 = 200 GB; no grads up */
        input_13b(&in);
        in.params = 100e9;
        in.bytes[PLAN_CLASS_WEIGHTS] = 1;
        in.bytes[PLAN_CLASS_GRADS] = 0;
        compute_ok(&in, &r);
        assert_near(r.placements[PLAN_PLACEMENT_A].link_down_bytes, 200e9);
        assert_near(r.placements[PLAN_PLACEMENT_A].t_link, 8.0);

        /* NVMe (B): 100 GB read + 100 GB written, one drive at 25 GB/s each way */
        input_13b(&in);
        in.params = 10e9;
        in.bytes[PLAN_CLASS_MASTER] = 4;
        in.bytes[PLAN_CLASS_MOMENTS] = 6;
        in.drive_read_gbs = 25;
        in.drive_write_gbs = 25;
        compute_ok(&in, &r);
        assert_near(r.placements[PLAN_PLACEMENT_B].nvme_read_bytes + r.placements[PLAN_PLACEMENT_B].nvme_write_bytes,
                    200e9);
        assert_near(r.placements[PLAN_PLACEMENT_B].t_nvme, 8.0);
        /* two drives striped: half */
        in.drives = 2;
        compute_ok(&in, &r);
        assert_near(r.placements[PLAN_PLACEMENT_B].t_nvme, 4.0);
}

static void test_compute(void **state) {
        PlanInput in;
        PlanResult r;

        input_13b(&in);
        in.accumulation = 8;
        compute_ok(&in, &r);
        assert_near(r.tokens_per_step, 16384);
        assert_near(r.flops_per_step, 6.0 * 13e9 * 16384);
        assert_near(r.t_compute, 12.77952);
        in.checkpointing = true;
        compute_ok(&in, &r);
        assert_near(r.t_compute, 12.77952 * 8.0 / 6.0);
}

/* L = 2, h = 4, ffn = 16, vocab = 10, a = 2, s = 8, b = 1. */
static void test_shape(void **state) {
        PlanInput in;
        PlanResult r;

        input_13b(&in);
        in.params = 0;
        in.layers = 2;
        in.hidden = 4;
        in.ffn = 16;
        in.vocab = 10;
        in.heads = 2;
        in.seq = 8;
        compute_ok(&in, &r);
        /* 2 * (4*16 + 2*4*16) + 10*4 = 2 * 192 + 40 */
        assert_near(r.params, 424);
        assert_near(r.model_state_bytes, 424 * 16);
        assert_true(r.activations_known);
        /* per layer 8*1*4*(34 + 5*2*8/4) = 32 * 54 = 1728 */
        assert_near(r.activation_bytes, 2 * 1728);
        in.checkpointing = true;
        compute_ok(&in, &r);
        assert_near(r.activation_bytes, 2 * 2 * 8 * 4 + 1728);
        assert_int_equal(r.verdict, PLAN_VERDICT_GPU);
}

/* The case: 13B full fine-tune on a 16 GB card with one NVMe drive. */
static void test_13b_one_drive(void **state) {
        PlanInput in;
        PlanResult r;
        const PlanPlacementResult *b;
        double t_nvme = 156e9 / 3.5e9 + 156e9 / 3.0e9;
        double per_day;

        input_13b(&in);
        in.micro_batch = 4;
        in.tbw = 600;
        compute_ok(&in, &r);
        b = &r.placements[PLAN_PLACEMENT_B];
        assert_false(r.placements[PLAN_PLACEMENT_A].fits_host);        /* 208 GB > 64 GiB */
        assert_true(b->fits_host);                                      /* 52 GB of weights and grads */
        assert_int_equal(r.verdict, PLAN_VERDICT_PLACEMENT);
        assert_int_equal(r.chosen, PLAN_PLACEMENT_B);
        assert_int_equal(b->tier[PLAN_CLASS_WEIGHTS], PLAN_TIER_HOST);
        assert_int_equal(b->tier[PLAN_CLASS_MASTER], PLAN_TIER_NVME);
        assert_int_equal(b->tier[PLAN_CLASS_MOMENTS], PLAN_TIER_NVME);
        assert_near(b->host_bytes, 52e9);
        assert_near(b->nvme_bytes, 156e9);
        assert_near(b->link_down_bytes, 52e9);
        assert_near(b->link_up_bytes, 26e9);
        assert_near(b->nvme_read_bytes, 156e9);
        assert_near(b->nvme_write_bytes, 156e9);
        assert_near(r.t_compute, 6.0 * 13e9 * 8192 / 1e14);          /* 6.38976 s */
        assert_near(b->t_link, 52e9 / 25e9);                           /* 2.08 s */
        assert_near(b->t_nvme, t_nvme);                                 /* 96.57 s */
        assert_near(b->step_overlapped, t_nvme);
        assert_near(b->step_serial, r.t_compute + 2.08 + t_nvme);
        assert_int_equal(b->bottleneck, PLAN_BOTTLENECK_NVME);
        assert_false(b->io_hidden);
        assert_near(b->gpu_busy, r.t_compute / t_nvme);
        assert_near(b->tokens_per_s, 8192 / t_nvme);
        /* ceil(96.57 / 6.39) = ceil(15.11) */
        assert_int_equal(b->drives_needed, 16);
        assert_int_equal(b->accumulation_needed, 16);
        per_day = 156e9 * 86400 / t_nvme;
        assert_near(b->write_bytes_per_day_per_drive, per_day);
        assert_near(b->days_to_tbw, 600e12 / per_day);

        /* C adds the weights: read twice per micro-batch, written once */
        assert_near(r.placements[PLAN_PLACEMENT_C].nvme_read_bytes, 156e9 + 52e9);
        assert_near(r.placements[PLAN_PLACEMENT_C].nvme_write_bytes, 156e9 + 26e9);
        assert_near(r.placements[PLAN_PLACEMENT_C].host_bytes, 26e9);

        /* micro-batch 1: the link (2.08 s) is slower than compute (1.6 s): drives cannot help */
        in.micro_batch = 1;
        compute_ok(&in, &r);
        assert_int_equal(r.placements[PLAN_PLACEMENT_B].drives_needed, -1);
        assert_int_equal(r.placements[PLAN_PLACEMENT_B].accumulation_needed, -1);
        assert_int_equal(r.placements[PLAN_PLACEMENT_A].bottleneck, PLAN_BOTTLENECK_LINK);
}

static void test_decision_tree(void **state) {
        PlanInput in;
        PlanResult r;

        input_13b(&in);
        in.params = 100e6;      /* 1.6 GB */
        compute_ok(&in, &r);
        assert_int_equal(r.verdict, PLAN_VERDICT_GPU);

        in.params = 2e9;        /* 32 GB: host */
        compute_ok(&in, &r);
        assert_int_equal(r.verdict, PLAN_VERDICT_PLACEMENT);
        assert_int_equal(r.chosen, PLAN_PLACEMENT_A);
        /* t_compute 6 * 2e9 * 2048 / 1e14 = 0.246 s < t_link 8 GB / 25 GB/s = 0.32 s, per micro-batch */
        assert_near(r.placements[PLAN_PLACEMENT_A].t_link, 0.32);
        assert_int_equal(r.placements[PLAN_PLACEMENT_A].bottleneck, PLAN_BOTTLENECK_LINK);
        assert_int_equal(r.placements[PLAN_PLACEMENT_A].accumulation_needed, -1);
        assert_near(r.placements[PLAN_PLACEMENT_A].t_nvme, 0);
        assert_int_equal(r.placements[PLAN_PLACEMENT_A].drives_needed, 0);

        in.params = 13e9;       /* weights + grads 52 GB fit, the rest does not */
        compute_ok(&in, &r);
        assert_int_equal(r.chosen, PLAN_PLACEMENT_B);

        in.host_ram = 40 * GIB; /* 52 GB does not fit, 26 GB does */
        compute_ok(&in, &r);
        assert_int_equal(r.verdict, PLAN_VERDICT_PLACEMENT);
        assert_int_equal(r.chosen, PLAN_PLACEMENT_C);

        in.host_ram = 8 * GIB;
        compute_ok(&in, &r);
        assert_int_equal(r.verdict, PLAN_VERDICT_NO_FIT_HOST);

        in.host_ram = 64 * GIB;
        in.drives = 0;
        compute_ok(&in, &r);
        assert_int_equal(r.verdict, PLAN_VERDICT_NO_DRIVES);
        assert_false(r.placements[PLAN_PLACEMENT_B].possible);
        assert_true(isinf(r.placements[PLAN_PLACEMENT_B].t_nvme));
        assert_int_equal(r.placements[PLAN_PLACEMENT_B].drives_needed, -1);

        /* forced placement */
        in.drives = 1;
        in.placement = PLAN_PLACEMENT_C;
        compute_ok(&in, &r);
        assert_int_equal(r.verdict, PLAN_VERDICT_PLACEMENT);
        assert_int_equal(r.chosen, PLAN_PLACEMENT_C);
        in.placement = PLAN_PLACEMENT_A;
        compute_ok(&in, &r);
        assert_int_equal(r.verdict, PLAN_VERDICT_NO_FIT_HOST);

        /* activations larger than the card */
        in.placement = -1;
        in.params = 0;
        in.layers = 80;
        in.hidden = 8192;
        in.ffn = 28672;
        in.vocab = 128000;
        in.heads = 64;
        in.seq = 8192;
        in.micro_batch = 8;
        compute_ok(&in, &r);
        assert_int_equal(r.verdict, PLAN_VERDICT_NO_FIT_VRAM);
}

static void validate_fails(const PlanInput *in, const char *needle) {
        char err[256] = "";

        assert_int_equal(plan_validate(in, err, sizeof(err)), -EINVAL);
        if (!strstr(err, needle))
                fail_msg("error '%s' does not mention '%s'", err, needle);
}

static void test_validate(void **state) {
        PlanInput in;

        input_13b(&in);
        in.params = 0;
        validate_fails(&in, "--params");
        in.params = -1;
        validate_fails(&in, "--params");
        in.params = 13e9;
        in.layers = 2;
        validate_fails(&in, "not both");
        in.params = 0;
        validate_fails(&in, "all of --layers");
        in.hidden = 6;
        in.ffn = in.vocab = 1;
        in.heads = 4;
        validate_fails(&in, "multiple of --heads");

        input_13b(&in);
        in.bytes[PLAN_CLASS_GRADS] = -2;
        validate_fails(&in, "grads");
        input_13b(&in);
        for (unsigned c = 0; c < _PLAN_CLASS_MAX; c++)
                in.bytes[c] = 0;
        validate_fails(&in, "0 bytes per parameter");

        input_13b(&in);
        in.seq = 0;
        validate_fails(&in, "--seq");
        input_13b(&in);
        in.vram = 0;
        validate_fails(&in, "--vram");
        input_13b(&in);
        in.host_ram = 0;
        validate_fails(&in, "--host-ram");
        input_13b(&in);
        in.link_gbs = 0;
        validate_fails(&in, "--link");
        input_13b(&in);
        in.tflops = NAN;
        validate_fails(&in, "--tflops");
        input_13b(&in);
        in.drive_write_gbs = 0;
        validate_fails(&in, "--drive-write");
        input_13b(&in);
        in.tbw = -1;
        validate_fails(&in, "--tbw");
        input_13b(&in);
        in.drives = 0;
        in.placement = PLAN_PLACEMENT_B;
        validate_fails(&in, "--drives is 0");
        in.placement = PLAN_PLACEMENT_A;
        assert_int_equal(plan_validate(&in, (char[64]) {}, 64), 0);
}

static void test_parse(void **state) {
        static const struct { const char *s; double v; } ok[] = {
                { "13B", 13e9 }, { "13b", 13e9 }, { "13G", 13e9 }, { "1T", 1e12 }, { "350M", 350e6 },
                { "1.5B", 1.5e9 }, { "6.7e9", 6.7e9 }, { "7000000000", 7e9 }, { "64K", 64e3 }, { "0", 0 },
        };
        static const char *const bad[] = {
                "", "-1", "+1", "13X", "13BB", "B", "inf", "nan", "0x10", "1e400", " 1", "1 ", "1.5.5",
        };
        double v;

        for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
                v = -1;
                if (plan_parse_count(ok[i].s, &v) != 0)
                        fail_msg("plan_parse_count(\"%s\") failed", ok[i].s);
                assert_near(v, ok[i].v);
        }
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
                if (plan_parse_count(bad[i], &v) != -EINVAL)
                        fail_msg("plan_parse_count(\"%s\") accepted", bad[i]);
        assert_int_equal(plan_parse_number("3.5", &v), 0);
        assert_near(v, 3.5);
        assert_int_equal(plan_parse_number("3.5G", &v), -EINVAL);
        assert_int_equal(plan_parse_number("-3", &v), -EINVAL);
        assert_int_equal(plan_parse_count(NULL, &v), -EINVAL);
}

/* --compute-s replaces the FLOP count; --link-shared adds the directions: 52 + 26 GB at 25 GB/s = 3.12 s. */
static void test_compute_s_shared_link(void **state) {
        PlanInput in;
        PlanResult r;

        (void) state;
        input_13b(&in);
        in.tflops = 0;
        in.compute_s = 10;
        in.link_shared = true;
        compute_ok(&in, &r);
        assert_near(r.t_compute, 10);
        assert_near(r.placements[PLAN_PLACEMENT_B].t_link, 78e9 / 25e9);
        in.link_shared = false;
        compute_ok(&in, &r);
        assert_near(r.placements[PLAN_PLACEMENT_B].t_link, 52e9 / 25e9);
}

/*
 * Replay under budgets that hold everything: after warm-up nothing goes to
 * NVMe; the optimizer rewrites the weights in host, so each step they go
 * down once (the backward pass finds them still in VRAM) and the gradients
 * come up once: 4 layers of 1 MiB each way.
 */
static void test_replay_fits(void **state) {
        PlanSimInput in = { .layers = 4, .weights = MIB, .grads = MIB, .opt = MIB,
                            .vram_limit = 64 * MIB, .host_limit = 64 * MIB };
        PlanSimResult r;
        char err[256];

        (void) state;
        assert_int_equal(plan_simulate(&in, &r, err, sizeof(err)), 0);
        assert_near(r.link_down, 4.0 * MIB);
        assert_near(r.link_up, 4.0 * MIB);
        assert_near(r.nvme_read, 0);
        assert_near(r.nvme_write, 0);
}

/*
 * The timeline benchmark's budgets (8 layers of 4 MiB P, G, O; VRAM 24 MiB,
 * host 48 MiB): every tensor is rewritten each step and at most 72 MiB fit
 * above NVMe, so at least 24 MiB go down and come back per step; and no more
 * than streaming all 96 MiB.  The link moves at least the weights down and
 * the gradients up (64 MiB).  Lower budgets never move less.
 */
static void test_replay_timeline(void **state) {
        PlanSimInput in = { .layers = 8, .weights = 4.0 * MIB, .grads = 4.0 * MIB, .opt = 4.0 * MIB,
                            .vram_limit = 24 * MIB, .host_limit = 48 * MIB,
                            .fwd_s = 0.016, .bwd_s = 0.034, .opt_s = 0.016 };
        PlanSimResult r, lower;
        char err[256];

        (void) state;
        assert_int_equal(plan_simulate(&in, &r, err, sizeof(err)), 0);
        assert_true(r.nvme_read >= 24.0 * MIB && r.nvme_read <= 96.0 * MIB);
        assert_true(r.nvme_write >= 24.0 * MIB && r.nvme_write <= 96.0 * MIB);
        assert_true(r.link_down + r.link_up >= 64.0 * MIB);
        in.host_limit = 32 * MIB;
        assert_int_equal(plan_simulate(&in, &lower, err, sizeof(err)), 0);
        assert_true(lower.nvme_read >= r.nvme_read && lower.nvme_write >= r.nvme_write);
}

static void test_replay_refused(void **state) {
        PlanSimInput in = { .layers = 8, .weights = 4.0 * MIB, .grads = 4.0 * MIB, .opt = 4.0 * MIB,
                            .vram_limit = 8 * MIB, .host_limit = 48 * MIB };
        PlanSimResult r;
        char err[256] = "";

        (void) state;
        assert_int_equal(plan_simulate(&in, &r, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "--vram-limit"));
        in.vram_limit = 24 * MIB;
        in.host_limit = 16 * MIB;
        assert_int_equal(plan_simulate(&in, &r, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "--host-limit"));
        in.host_limit = 48 * MIB;
        in.layers = 0;
        assert_int_equal(plan_simulate(&in, &r, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "--layers"));
}

/* Budgets through plan_validate(): both or neither, layers and drives needed. */
/*
 * A plan file (bench/torch_plan.py's format) replays like the layer-by-layer
 * plan: W read in VRAM forward and backward, G written in VRAM and read in
 * host, W rewritten in host.  Under budgets that hold all, W goes down once
 * and G comes up once per step, nothing touches NVMe; the synthetic plan of
 * one layer with the same sizes moves the same bytes.
 */
static const char plan_doc[] =
        "{\"name\":\"tiny\",\"tensors\":[{\"name\":\"w\",\"size\":1048576},{\"name\":\"g\",\"size\":1048576},"
        "{\"name\":\"o\",\"size\":1048576}],\"phases\":["
        "{\"kind\":\"f\",\"access\":[[0,\"vram\",\"r\"]]},"
        "{\"kind\":\"b\",\"access\":[[0,\"vram\",\"r\"],[1,\"vram\",\"w\"]]},"
        "{\"kind\":\"o\",\"access\":[[1,\"host\",\"r\"],[2,\"host\",\"rw\"],[0,\"host\",\"rw\"]]}]}";

static void test_plan_file(void **state) {
        PlanSimInput in = { .layers = 1, .weights = MIB, .grads = MIB, .opt = MIB,
                            .vram_limit = 64 * MIB, .host_limit = 64 * MIB };
        PlanSimResult a, b;
        PlanFile f;
        char err[256];

        (void) state;
        assert_int_equal(plan_file_parse(plan_doc, &f, err, sizeof(err)), 0);
        assert_string_equal(f.name, "tiny");
        assert_int_equal(f.plan.n_tensors, 3);
        assert_int_equal(f.plan.n_phases, 3);
        assert_int_equal(f.plan.start[3], 6);
        assert_int_equal(f.kind[1], PLAN_FILE_BWD);
        assert_int_equal(f.plan.acc[4].tensor, 2);
        assert_int_equal(f.plan.acc[4].mode, PLAN_SIM_READ | PLAN_SIM_WRITE);
        assert_int_equal(plan_simulate_plan(&f.plan, 64 * MIB, 64 * MIB, &a, err, sizeof(err)), 0);
        assert_near(a.link_down, MIB);
        assert_near(a.link_up, MIB);
        assert_near(a.nvme_read, 0);
        assert_near(a.nvme_write, 0);
        assert_int_equal(plan_simulate(&in, &b, err, sizeof(err)), 0);
        assert_near(a.link_down, b.link_down);
        assert_near(a.link_up, b.link_up);
        /* two phases must fit: backward and optimizer need 2 MiB of VRAM, then 3 MiB of host */
        assert_int_equal(plan_simulate_plan(&f.plan, 1 * MIB, 64 * MIB, &a, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "--vram-limit"));
        assert_int_equal(plan_simulate_plan(&f.plan, 64 * MIB, 2 * MIB, &a, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "--host-limit"));
        plan_file_done(&f);
}

/*
 * Write-downs (tier.torch's placement C): on entering phase 0 the client evicts
 * O and W to NVMe.  W is accessed in phases 0 and 1, held by tierd: that eviction
 * ends with EBUSY, W stays.  O, dirty from the optimizer, goes down and comes back
 * for the next optimizer phase: one NVMe write and one read per step, and the
 * link moves what it moved without them.
 */
static void test_plan_file_write_down(void **state) {
        static const char doc[] =
                "{\"name\":\"tiny-c\",\"tensors\":[{\"name\":\"w\",\"size\":1048576},{\"name\":\"g\",\"size\":1048576},"
                "{\"name\":\"o\",\"size\":1048576}],\"phases\":["
                "{\"kind\":\"f\",\"access\":[[0,\"vram\",\"r\"]],\"write_down\":[2,0]},"
                "{\"kind\":\"b\",\"access\":[[0,\"vram\",\"r\"],[1,\"vram\",\"w\"]]},"
                "{\"kind\":\"o\",\"access\":[[1,\"host\",\"r\"],[2,\"host\",\"rw\"],[0,\"host\",\"rw\"]]}]}";
        PlanSimResult r;
        PlanFile f;
        char err[256];

        (void) state;
        assert_int_equal(plan_file_parse(doc, &f, err, sizeof(err)), 0);
        assert_non_null(f.plan.down_start);
        assert_int_equal(f.plan.down_start[0], 0);
        assert_int_equal(f.plan.down_start[1], 2);
        assert_int_equal(f.plan.down_start[3], 2);
        assert_int_equal(f.plan.down[0], 2);
        assert_int_equal(f.plan.down[1], 0);
        assert_int_equal(plan_simulate_plan(&f.plan, 64 * MIB, 64 * MIB, &r, err, sizeof(err)), 0);
        assert_near(r.nvme_write, MIB);
        assert_near(r.nvme_read, MIB);
        assert_near(r.link_down, MIB);
        assert_near(r.link_up, MIB);
        plan_file_done(&f);
        /* without them (the same plan as plan_doc): nothing touches NVMe */
        assert_int_equal(plan_file_parse(plan_doc, &f, err, sizeof(err)), 0);
        assert_null(f.plan.down_start);
        plan_file_done(&f);
}

static void test_plan_file_bad(void **state) {
        static const struct {
                const char *doc, *what;
        } bad[] = {
                { "{}", "\"tensors\" is missing" },
                { "{\"tensors\":[],\"phases\":[]}", "\"tensors\" has 0 entries" },
                { "{\"tensors\":[{\"size\":-1}],\"phases\":[{\"kind\":\"f\",\"access\":[]}]}",
                  "\"tensors.0.size\" is not a size" },
                { "{\"tensors\":[{\"size\":1}],\"phases\":[{\"kind\":\"x\",\"access\":[]}]}",
                  "\"phases.0.kind\" is not" },
                { "{\"tensors\":[{\"size\":1}],\"phases\":[{\"kind\":\"f\",\"access\":[[1,\"vram\",\"r\"]]}]}",
                  "\"phases.0.access.0.0\" is not a tensor index (0 to 0)" },
                { "{\"tensors\":[{\"size\":1}],\"phases\":[{\"kind\":\"f\",\"access\":[[0,\"nvme\",\"r\"]]}]}",
                  "\"phases.0.access.0.1\" is not \"vram\" or \"host\"" },
                { "{\"tensors\":[{\"size\":1}],\"phases\":[{\"kind\":\"f\",\"access\":[[0,\"host\",\"x\"]]}]}",
                  "\"phases.0.access.0.2\" is not" },
                { "{\"tensors\":[{\"size\":1}],\"phases\":[{\"kind\":\"f\",\"access\":7}]}",
                  "\"phases.0.access\" is not a list" },
                { "{\"tensors\":[{\"size\":1}],\"phases\":[{\"kind\":\"f\",\"access\":[],\"write_down\":7}]}",
                  "\"phases.0.write_down\" is not a list of tensor indices" },
                { "{\"tensors\":[{\"size\":1}],\"phases\":[{\"kind\":\"f\",\"access\":[],\"write_down\":[1]}]}",
                  "\"phases.0.write_down.0\" is not a tensor index (0 to 0)" },
        };
        char err[256];

        (void) state;
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                PlanFile f;

                err[0] = 0;
                assert_int_equal(plan_file_parse(bad[i].doc, &f, err, sizeof(err)), -EINVAL);
                if (!strstr(err, bad[i].what))
                        fail_msg("plan %zu: '%s' does not say '%s'", i, err, bad[i].what);
        }
        assert_true(plan_file_load("/nonexistent/plan.json", &(PlanFile) {}, err, sizeof(err)) == -ENOENT);
        assert_non_null(strstr(err, "cannot read --plan /nonexistent/plan.json"));
}

static void test_validate_limits(void **state) {
        PlanInput in;
        char err[256];

        (void) state;
        input_13b(&in);
        in.vram_limit = GIB;
        assert_int_equal(plan_validate(&in, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "both --vram-limit and --host-limit"));
        in.host_limit = 4 * GIB;
        assert_int_equal(plan_validate(&in, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "--blocks"));
        in.blocks = 40;
        assert_int_equal(plan_validate(&in, err, sizeof(err)), 0);
        in.drives = 0;
        assert_int_equal(plan_validate(&in, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "needs the drives"));
        in.drives = 1;
        in.tflops = 0;
        assert_int_equal(plan_validate(&in, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "--compute-s"));
}

static void test_jsonget(void **state) {
        const char *doc = " {\"a\": [1, {\"b\": \"x\\\"y\"}, null], \"c\": {\"d\": -2.5e3, \"e\": true},"
                          " \"s\": \"}]\", \"n\": null}";
        double v;
        size_t n;
        int b;
        char buf[8];

        (void) state;
        assert_int_equal(jget_number(doc, "a.0", &v), 0);
        assert_near(v, 1);
        assert_int_equal(jget_number(doc, "c.d", &v), 0);
        assert_near(v, -2500);
        assert_int_equal(jget_string(doc, "a.1.b", buf, sizeof(buf)), 0);
        assert_string_equal(buf, "x\"y");
        assert_int_equal(jget_string(doc, "s", buf, sizeof(buf)), 0);
        assert_string_equal(buf, "}]");
        assert_int_equal(jget_string(doc, "a.1.b", buf, 3), -ENOSPC);
        assert_int_equal(jget_length(doc, "a", &n), 0);
        assert_int_equal(n, 3);
        assert_int_equal(jget_length(doc, "c", &n), 0);
        assert_int_equal(n, 2);
        assert_int_equal(jget_bool(doc, "c.e", &b), 0);
        assert_int_equal(b, 1);
        assert_int_equal(jget_number(doc, "n", &v), -ENODATA);
        assert_int_equal(jget_number(doc, "a.2", &v), -ENODATA);
        assert_int_equal(jget_number(doc, "a.3", &v), -ENOENT);
        assert_int_equal(jget_number(doc, "x", &v), -ENOENT);
        assert_int_equal(jget_number(doc, "s", &v), -EINVAL);
        assert_int_equal(jget_number("{\"a\": [1, 2", "b", &v), -EINVAL);
        assert_int_equal(jget_number("{\"a\" 1}", "a", &v), -EINVAL);
        assert_int_equal(jget_length("[[[[", "", &n), -EINVAL);
        /* numbers as JSON spells them, nothing else */
        assert_int_equal(jget_number("{\"a\": 0x10}", "a", &v), -EINVAL);
        assert_int_equal(jget_number("{\"a\": -0x1p4}", "a", &v), -EINVAL);
        assert_int_equal(jget_number("{\"a\": 12abc}", "a", &v), -EINVAL);
        assert_int_equal(jget_number("{\"a\": 1.}", "a", &v), -EINVAL);
        assert_int_equal(jget_number("{\"a\": 01}", "a", &v), -EINVAL);
        assert_int_equal(jget_number("{\"a\": 1e}", "a", &v), -EINVAL);
        assert_int_equal(jget_number("{\"a\": nullx}", "a", &v), -EINVAL);
        assert_int_equal(jget_number("{\"a\": 1e999}", "a", &v), -EINVAL);
        assert_int_equal(jget_number("[4096]", "0", &v), 0);
        assert_near(v, 4096);
        assert_int_equal(jget_number("{\"a\": -0.5E+2 }", "a", &v), 0);
        assert_near(v, -50);
}

/* tests/unit/data/bench-fixture.json, inline */
static const char bench_doc[] =
        "{\"bench\":\"storage\",\"version\":1,\"time\":\"2026-12-01T20:00:00Z\",\"size\":1073741824,"
        "\"targets\":[{\"name\":\"t0\",\"path\":\"/a\",\"scratch\":\"/a/s\",\"link_gbps\":4.0},"
        "{\"name\":\"t1\",\"path\":\"/b\",\"scratch\":\"/b/s\",\"link_gbps\":null}],"
        "\"cells\":[{\"target\":\"t0\",\"op\":\"read\",\"bs\":131072,\"qd\":1,\"gbps\":1.5,\"suspect\":false},"
        "{\"target\":\"striped\",\"op\":\"read\",\"bs\":1048576,\"qd\":32,\"gbps\":6.0,\"suspect\":false},"
        "{\"target\":\"striped\",\"op\":\"read\",\"bs\":8388608,\"qd\":64,\"gbps\":12.0,\"suspect\":true},"
        "{\"target\":\"striped\",\"op\":\"write\",\"bs\":1048576,\"qd\":32,\"gbps\":5.0,\"suspect\":false}],"
        "\"best\":{},\"per_target_best\":[],\"fio\":null,\"sustained\":%s}";

/* The best striped non-suspect cell over the targets; the sustained write rate when there is one. */
static void test_bench_results(void **state) {
        char doc[sizeof(bench_doc) + 64], err[256];
        PlanBenchFigures f;

        (void) state;
        (void) snprintf(doc, sizeof(doc), bench_doc, "{\"target\":\"striped\",\"gbps_last\":2.0}");
        assert_int_equal(planhw_bench(doc, &f, err, sizeof(err)), 0);
        assert_int_equal(f.targets, 2);
        assert_near(f.read_gbs, 3.0);           /* 6.0 striped / 2; 12.0 is suspect */
        assert_near(f.write_gbs, 1.0);          /* sustained 2.0 striped / 2 */
        assert_true(f.write_sustained);
        (void) snprintf(doc, sizeof(doc), bench_doc, "{\"target\":\"t0\",\"gbps_last\":2.0}");
        assert_int_equal(planhw_bench(doc, &f, err, sizeof(err)), 0);
        assert_near(f.write_gbs, 2.0);          /* sustained on one drive */
        (void) snprintf(doc, sizeof(doc), bench_doc, "null");
        assert_int_equal(planhw_bench(doc, &f, err, sizeof(err)), 0);
        assert_near(f.write_gbs, 2.5);
        assert_false(f.write_sustained);
        assert_int_equal(planhw_bench("{\"bench\":\"io\"}", &f, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "not `tierctl bench` results"));
        assert_int_equal(planhw_bench("{\"bench\":\"storage\",\"version\":2}", &f, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "version"));
        /* one target, no striped cells: its own best */
        assert_int_equal(planhw_bench("{\"bench\":\"storage\",\"version\":1,\"targets\":[{}],\"cells\":["
                                      "{\"target\":\"t0\",\"op\":\"read\",\"gbps\":3.5,\"suspect\":false},"
                                      "{\"target\":\"t0\",\"op\":\"write\",\"gbps\":3.0}]}", &f, err, sizeof(err)), 0);
        assert_int_equal(f.targets, 1);
        assert_near(f.read_gbs, 3.5);
        assert_near(f.write_gbs, 3.0);
        assert_int_equal(planhw_bench("{\"bench\":\"storage\",\"version\":1,\"targets\":[{}],\"cells\":["
                                      "{\"target\":\"t0\",\"op\":\"read\",\"gbps\":3.5,\"suspect\":true}]}",
                                      &f, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "not suspect"));
}

static void test_tierd_status(void **state) {
        const char *doc = "{\"version\":\"0.1.0\",\"tiers\":["
                "{\"tier\":\"vram\",\"backend\":\"emulated\",\"capacity\":25165824,\"bandwidth\":1000000000},"
                "{\"tier\":\"host\",\"backend\":\"memfd\",\"capacity\":50331648,\"bandwidth\":0},"
                "{\"tier\":\"nvme\",\"backend\":\"file\",\"capacity\":1073741824,\"bandwidth\":400000000}],"
                "\"links\":[],\"targets\":[{\"path\":\"/t0\"},{\"path\":\"/t1\"}]}";
        PlanTierdFigures f;
        char err[256];

        (void) state;
        assert_int_equal(planhw_tierd(doc, &f, err, sizeof(err)), 0);
        assert_int_equal(f.vram_bytes, 24 * MIB);
        assert_int_equal(f.host_bytes, 48 * MIB);
        assert_int_equal(f.targets, 2);
        assert_int_equal(f.nvme_bandwidth, 400000000);
        assert_int_equal(f.vram_bandwidth, 1000000000);
        assert_true(f.vram_emulated);
        assert_int_equal(planhw_tierd("{\"version\":\"x\"}", &f, err, sizeof(err)), -EINVAL);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_state_13b),
                cmocka_unit_test(test_state_1t),
                cmocka_unit_test(test_state_configurable),
                cmocka_unit_test(test_200gb_at_25),
                cmocka_unit_test(test_compute),
                cmocka_unit_test(test_shape),
                cmocka_unit_test(test_13b_one_drive),
                cmocka_unit_test(test_decision_tree),
                cmocka_unit_test(test_validate),
                cmocka_unit_test(test_parse),
                cmocka_unit_test(test_compute_s_shared_link),
                cmocka_unit_test(test_replay_fits),
                cmocka_unit_test(test_replay_timeline),
                cmocka_unit_test(test_replay_refused),
                cmocka_unit_test(test_plan_file),
                cmocka_unit_test(test_plan_file_write_down),
                cmocka_unit_test(test_plan_file_bad),
                cmocka_unit_test(test_validate_limits),
                cmocka_unit_test(test_jsonget),
                cmocka_unit_test(test_bench_results),
                cmocka_unit_test(test_tierd_status),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
