/* SPDX-License-Identifier: MIT */
/* fuzz-config.c: fuzz target: tierd.conf and its drop-ins, parsed, validated, printed and capacity-checked. */

/*
 * Theory of operation: the input is a main file and drop-ins, separated by
 * lines "%%" ("\n%%\n"): the first part becomes DIR/tierd.conf, the k-th
 * after it DIR/tierd.conf.d/NN.conf (at most 8), and config_load() reads
 * them as tierd does at start and on SIGHUP (read, parse, drop-ins in name
 * order, config_finish()).  A configuration that loads is printed
 * (config_print(), as --check-config does), every key formatted and
 * copied into a second Config and compared (what reload does), and
 * checked against made-up machine facts (capacity_check(), a pure
 * function).  Every part is also parsed alone with config_parse_text().
 * Nothing may crash, leak or leave an fd open.
 */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/base/config.h"
#include "daemon/core/capacity.h"
#include "tests/fuzz/fuzz.h"

#define MAX_DROPINS 8
#define SEP "\n%%\n"

static char dir[] = "/tmp/tierd-fuzz-config.XXXXXX";
static char main_path[sizeof(dir) + 32], dropin_dir[sizeof(main_path) + 8];
static FILE *devnull;

static void cleanup(void) {
        char path[sizeof(dropin_dir) + 16];

        for (unsigned i = 0; i < MAX_DROPINS; i++) {
                snprintf(path, sizeof(path), "%s/%02u.conf", dropin_dir, i);
                (void) unlink(path);
        }
        (void) rmdir(dropin_dir);
        (void) unlink(main_path);
        (void) rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
        if (!mkdtemp(dir)) {
                perror("mkdtemp");
                abort();
        }
        snprintf(main_path, sizeof(main_path), "%s/tierd.conf", dir);
        snprintf(dropin_dir, sizeof(dropin_dir), "%s.d", main_path);
        if (mkdir(dropin_dir, 0700) < 0) {
                perror("mkdir");
                abort();
        }
        devnull = fopen("/dev/null", "we");
        if (!devnull)
                abort();
        atexit(cleanup);
        return 0;
}

static void write_part(const char *path, const uint8_t *p, size_t n) {
        FILE *f = fopen(path, "we");

        if (!f || (n > 0 && fwrite(p, n, 1, f) != 1)) {
                perror(path);
                abort();
        }
        fclose(f);
}

static void parse_alone(const uint8_t *p, size_t n) {
        char *text = malloc(n + 1), *error = NULL;
        Config c;

        FUZZ_CHECK(text);
        memcpy(text, p, n);
        text[n] = 0;
        config_init(&c);
        if (config_parse_text(&c, text, "fuzz.conf", &error) >= 0 && config_finish(&c, &error) >= 0)
                (void) config_print(devnull, &c);
        free(error);
        config_deinit(&c);
        free(text);
}

static void check_loaded(Config *c) {
        CapacityFacts f = {
                .mem_total = 64ull << 30,
                .mem_available = 32ull << 30,
                .cgroup_limit = UINT64_MAX,
                .memlock_limit = 8ull << 20,
                .vram_emulated = c->vram_backend != VRAM_BACKEND_CUDA,
        };
        char *msg = NULL;
        Config copy;
        const ConfigKey *k;

        FUZZ_CHECK(config_print(devnull, c) >= 0);
        config_init(&copy);
        for (size_t i = 0; (k = config_key_at(i)); i++) {
                char *s = config_value_format(k, c);

                FUZZ_CHECK(s);
                free(s);
                if (!k->live)           /* reload copies live keys only */
                        continue;
                FUZZ_CHECK(config_value_copy(k, &copy, c) >= 0);
                if (!config_value_equal(k, &copy, c)) {
                        fprintf(stderr, "key [%s] %s differs after config_value_copy()\n", k->section, k->name);
                        abort();
                }
        }
        config_deinit(&copy);

        for (size_t i = 0; i < c->n_targets && i < CONFIG_MAX_TARGETS; i++)
                f.targets[i] = (CapacityTarget) { .kind = (CapacityTargetKind) (i % _CAPACITY_TARGET_KIND_MAX),
                                                  .fs_id = i / 2, .fs_free = 1ull << 40, .device_size = 1ull << 36 };
        (void) capacity_check(c, &f, &msg);
        free(msg);
        f.cap_ipc_lock = true;
        f.cgroup_limit = 1ull << 30;
        f.cgroup_usage = 1ull << 29;
        (void) capacity_check(c, &f, &msg);
        free(msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        const uint8_t *p = data, *end = data + size;
        unsigned n_dropins = 0;
        char *error = NULL;
        int fds = fuzz_count_fds();
        Config c;

        for (unsigned part = 0; part <= MAX_DROPINS; part++) {
                const uint8_t *sep = memmem(p, (size_t) (end - p), SEP, strlen(SEP));
                const uint8_t *stop = sep ? sep : end;
                char path[sizeof(dropin_dir) + 16];

                if (part == 0)
                        snprintf(path, sizeof(path), "%s", main_path);
                else {
                        snprintf(path, sizeof(path), "%s/%02u.conf", dropin_dir, part - 1);
                        n_dropins++;
                }
                write_part(path, p, (size_t) (stop - p));
                parse_alone(p, (size_t) (stop - p));
                if (!sep)
                        break;
                p = sep + strlen(SEP);
        }

        if (config_load(&c, main_path, true, &error) >= 0) {
                FUZZ_CHECK(!error);     /* success leaves no message */
                check_loaded(&c);
                config_deinit(&c);
        } else if (!error) {
                fprintf(stderr, "config_load() failed without saying why\n");
                abort();
        }
        free(error);

        for (unsigned i = 0; i < n_dropins; i++) {
                char path[sizeof(dropin_dir) + 16];

                snprintf(path, sizeof(path), "%s/%02u.conf", dropin_dir, i);
                (void) unlink(path);
        }
        if (fuzz_count_fds() != fds) {
                fprintf(stderr, "fds leaked: %d open before, %d after\n", fds, fuzz_count_fds());
                abort();
        }
        return 0;
}

static const char *const seeds[] = {
        "",
        "[daemon]\nsocket = /run/tierd/tierd.sock\nstate_dir = /var/lib/tierd\nlog_level = debug\n"
        "linger_sec = 30\nmax_connections = 64\nmax_connections_per_uid = 16\n"
        "[limits]\nmax_message = 1M\nmax_tensors = 4096\nmax_inflight = 256\nmax_name = 255\n"
        "[host]\ncapacity = 64M\nsegment_size = 4M\nnuma_node = auto\njob_limit = 32M\n"
        "[vram]\nbackend = emulated\ncapacity = 16M\nchunk_size = 2M\njob_limit = 8M\nbandwidth = 1G\n"
        "[nvme]\ntarget = /var/tmp/t0.img:64M\ntarget = t1.img\nextent_size = 1M\nqueue_depth = 32\n"
        "job_limit = 1G\nbandwidth = 500M\n"
        "[sched]\npolicy = timeline\ndefault_weight = 100\n",
        "# comment\n; other comment\n[host]\n  capacity=1GiB  \n" SEP "[host]\ncapacity = 2G\n" SEP
        "[sched]\npolicy = lru\n",
        "[vram]\nbackend = cuda\ncapacity = 0\n" SEP "[daemon]\nlog_level = warning\n",
        "[host]\nsegment_size = 3K\n",
        "[nvme]\ntarget = /dev/nvme0n1\ntarget = /dev/nvme0n1\n",
        "[host]\ncapacity 4G\n[nosuch]\n",
        "[sched]\npolicy = ondemand\ndefault_weight = 1000\n" SEP SEP "[limits]\nmax_name = 16\n",
        "[daemon]\nlinger_sec = 0.5\nsocket = relative\n[host]\nnuma_node = 1023\njob_limit = 1E\n",
        "[host\n=\n[]\n[ host ]\nkey = \n",
        /* sections newer than some builds of this target: an unknown section there, parsed where known */
        "[quota]\nuser = root\nhost = 32M\nhost_min = 8M\n\n[quota]\njob = train\nowner = root\nvram = 1G\nweight = 2\n" SEP
        "[quota]\ngroup = root\nnvme = 1G\n[quota]\nuid = 0\nweight = 1000\n",
        "[metrics]\ntextfile = /var/tmp/tierd.prom\ninterval_sec = 15\n" SEP "[metrics]\ntextfile =\n",
        /* owners of job names (a uid, a user), the per-uid tensor bound; a drop-in changing both */
        "[limits]\nmax_tensors = 4096\nmax_tensors_per_uid = 1000\n[quota]\njob = train\nowner = 1000\nweight = 3\n"
        "[quota]\njob = eval\nowner = root\nhost_min = 1M\n" SEP
        "[limits]\nmax_tensors_per_uid = 2\n[quota]\njob = train\nowner = 0\n",
        /* owners and names refused: no job, a user rule, twice, unknown, empty; bidi and C1 in a job name; 0 tensors */
        "[quota]\nowner = root\n" SEP "[quota]\nuser = root\nowner = root\n" SEP
        "[quota]\njob = a\nowner = 0\nowner = 1\n" SEP "[quota]\njob = b\nowner = no-such-user-x\n" SEP
        "[quota]\njob = c\nowner =\n" SEP "[quota]\njob = tr\xe2\x80\xaein\nowner = 0\n" SEP
        "[quota]\njob = x\xc2\x85y\n" SEP "[limits]\nmax_tensors_per_uid = 0\nmax_tensors_per_uid = 99999999999\n",
};

int fuzz_write_seeds(const char *out) {
        for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++) {
                char name[32];
                int r;

                snprintf(name, sizeof(name), "seed-%02zu", i);
                r = fuzz_write_file(out, name, seeds[i], strlen(seeds[i]));
                if (r < 0)
                        return r;
        }
        return 0;
}
