/* SPDX-License-Identifier: MIT */
/* bench-ipc.c: request latency and pipelined throughput of tierd, against a raw SEQPACKET echo. */

/*
 * Theory of operation
 *
 * Baseline (raw): a socketpair(AF_UNIX, SOCK_SEQPACKET) with an echo peer in
 * a forked process, so that, as with tierd, every round trip crosses two
 * processes and two blocking syscalls per side.  It measures N round trips
 * of 64-byte messages one at a time (raw_rtt_us_*), then the same messages
 * pipelined with at most W in flight (raw_ops_per_s).
 *
 * tierd, through libtier: one 1 MiB tensor, pinned in HOST once and unpinned
 * so that it is resident; then N times tier_pin(HOST) and tier_unpin(HOST),
 * each call timed on its own (pin_rtt_us_*, unpin_rtt_us_*).  No data moves,
 * so this is the cost of a request: libtier, protobuf, the socket and tierd's
 * dispatch.
 *
 * tierd, pipelined: a second connection that speaks the protocol directly
 * (proto/wire.h and the generated protobuf-c code): Hello (joining the same
 * job as rank 1), Open of the tensor, then Pin and Unpin alternately with at
 * most min(W, limits.max_inflight) requests in flight, for --duration
 * seconds (ops_per_s counts successful replies per second).
 *
 * Placement matters more than anything here: a round trip between two
 * processes on one CPU is a pair of context switches, across CPUs it is a
 * pair of cross-CPU wakeups, which on a VM can cost several times more.
 * Left to the scheduler, either can happen in either measurement, so
 * --client-cpu and --peer-cpu pin this process and the echo peer; bench/run
 * pins tierd to the peer's CPU, so both sides of the comparison see the same
 * placement (by default all on one CPU: the steadiest figures, and the ones
 * that show what tierd adds to the bare socket).
 *
 * Nothing is asserted; the figures and the baselines are one JSON line.
 */

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tier.h>

#include "bench/common.h"
#include "proto/macro.h"
#include "proto/tier.pb-c.h"
#include "proto/wire.h"
#include "util/time-util.h"

/* Size of one baseline message: about a small request plus framing. */
#define RAW_MSG_SIZE 64
/* Size of the tensor that is pinned and unpinned. */
#define TENSOR_SIZE (UINT64_C(1) << 20)
/* Replies are small; a Pin reply may carry segment descriptions. */
#define REPLY_BUF_SIZE (64 * 1024)
/* Requests we send are a few dozen bytes. */
#define REQUEST_BUF_SIZE 512

typedef struct Args {
        const char *socket;
        const char *job;
        uint64_t iterations;
        uint64_t warmup;
        uint64_t window;
        double duration;
        int client_cpu;         /* -1: not pinned */
        int peer_cpu;
} Args;

static int pin_to_cpu(int cpu) {
        cpu_set_t set;

        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        if (sched_setaffinity(0, sizeof(set), &set) < 0)
                return negative_errno();
        return 0;
}

/* ---- raw SEQPACKET baseline --------------------------------------------- */

static ssize_t write_full(int fd, const void *buf, size_t len) {
        for (;;) {
                ssize_t n = write(fd, buf, len);
                if (n >= 0 || errno != EINTR)
                        return n;
        }
}

static ssize_t read_full(int fd, void *buf, size_t len) {
        for (;;) {
                ssize_t n = read(fd, buf, len);
                if (n >= 0 || errno != EINTR)
                        return n;
        }
}

static _Noreturn void echo_peer(int fd) {
        char buf[RAW_MSG_SIZE * 4];

        for (;;) {
                ssize_t n = read_full(fd, buf, sizeof(buf));
                if (n <= 0)
                        _exit(n == 0 ? 0 : 1);
                if (write_full(fd, buf, (size_t) n) != n)
                        _exit(1);
        }
}

typedef struct RawResult {
        double rtt_p50_us, rtt_p99_us;
        double ops_per_s;
} RawResult;

static int raw_baseline(const Args *a, uint64_t *samples, RawResult *ret) {
        char msg[RAW_MSG_SIZE], buf[RAW_MSG_SIZE * 4];
        uint64_t done = 0, sent = 0, inflight = 0, t0, deadline, end;
        int sv[2], status, r = 0;
        pid_t pid;

        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
                return negative_errno();
        fflush(NULL);
        pid = fork();
        if (pid < 0) {
                r = negative_errno();
                safe_close(sv[0]);
                safe_close(sv[1]);
                return r;
        }
        if (pid == 0) {
                safe_close(sv[0]);
                if (a->peer_cpu >= 0 && pin_to_cpu(a->peer_cpu) < 0) {
                        bench_log("echo peer: cannot pin to CPU %d: %m", a->peer_cpu);
                        _exit(1);
                }
                echo_peer(sv[1]);
        }
        safe_close(sv[1]);
        memset(msg, 0x5a, sizeof(msg));

        /* One at a time: warm up, then time each round trip. */
        for (uint64_t i = 0; i < a->warmup + a->iterations; i++) {
                uint64_t s = now_ns();

                if (write_full(sv[0], msg, sizeof(msg)) != (ssize_t) sizeof(msg) ||
                    read_full(sv[0], buf, sizeof(buf)) != (ssize_t) sizeof(msg)) {
                        r = -EIO;
                        goto finish;
                }
                if (i >= a->warmup)
                        samples[i - a->warmup] = now_ns() - s;
        }
        ret->rtt_p50_us = bench_percentile_us(samples, a->iterations, 0.50);
        ret->rtt_p99_us = bench_percentile_us(samples, a->iterations, 0.99);

        /* Pipelined: at most `window` messages in flight, for the duration. */
        t0 = now_ns();
        deadline = t0 + (uint64_t) (a->duration * 1e9);
        for (;;) {
                bool stop = now_ns() >= deadline;

                while (!stop && inflight < a->window) {
                        if (write_full(sv[0], msg, sizeof(msg)) != (ssize_t) sizeof(msg)) {
                                r = -EIO;
                                goto finish;
                        }
                        inflight++;
                        sent++;
                }
                if (inflight == 0)
                        break;
                if (read_full(sv[0], buf, sizeof(buf)) != (ssize_t) sizeof(msg)) {
                        r = -EIO;
                        goto finish;
                }
                inflight--;
                done++;
        }
        end = now_ns();
        ret->ops_per_s = (double) done / ((double) (end - t0) / 1e9);

finish:
        safe_close(sv[0]);      /* the peer reads end-of-stream and exits */
        while (waitpid(pid, &status, 0) < 0)
                if (errno != EINTR)
                        break;
        return r;
}

/* ---- libtier round trips ------------------------------------------------- */

typedef struct TierResult {
        double pin_p50_us, pin_p99_us;
        double unpin_p50_us, unpin_p99_us;
} TierResult;

static void log_tier_error(tier_client *c, int r, const char *what) {
        const char *why = c ? tier_client_last_error(c) : "";

        bench_log("%s failed: %s%s%s", what, tier_strerror(r), why && *why ? ": " : "", why && *why ? why : "");
}

static int tier_round_trips(const Args *a, tier_client *c, tier_tensor *t, uint64_t *pin_ns, uint64_t *unpin_ns,
                            TierResult *ret) {
        for (uint64_t i = 0; i < a->warmup + a->iterations; i++) {
                struct tier_grant g;
                uint64_t t0, t1, t2;
                int r;

                t0 = now_ns();
                r = tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g);
                t1 = now_ns();
                if (r < 0) {
                        log_tier_error(c, r, "tier_pin");
                        return r;
                }
                r = tier_unpin(t, TIER_HOST, 0);
                t2 = now_ns();
                if (r < 0) {
                        log_tier_error(c, r, "tier_unpin");
                        return r;
                }
                if (i >= a->warmup) {
                        pin_ns[i - a->warmup] = t1 - t0;
                        unpin_ns[i - a->warmup] = t2 - t1;
                }
        }
        ret->pin_p50_us = bench_percentile_us(pin_ns, a->iterations, 0.50);
        ret->pin_p99_us = bench_percentile_us(pin_ns, a->iterations, 0.99);
        ret->unpin_p50_us = bench_percentile_us(unpin_ns, a->iterations, 0.50);
        ret->unpin_p99_us = bench_percentile_us(unpin_ns, a->iterations, 0.99);
        return 0;
}

/* ---- raw protocol connection ---------------------------------------------- */

typedef struct RawConn {
        int fd;
        uint64_t seq;
        uint8_t *rbuf;
} RawConn;

static int raw_conn_open(RawConn *rc, const char *path) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        _cleanup_close_ int fd = -1;

        if (strlen(path) >= sizeof(sa.sun_path))
                return -ENAMETOOLONG;
        strcpy(sa.sun_path, path);
        fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return negative_errno();
        if (connect(fd, (const struct sockaddr *) &sa, sizeof(sa)) < 0)
                return negative_errno();
        rc->rbuf = malloc(REPLY_BUF_SIZE);
        if (!rc->rbuf)
                return -ENOMEM;
        rc->fd = TAKE_FD(fd);
        rc->seq = 0;
        return 0;
}

static void raw_conn_close(RawConn *rc) {
        rc->fd = safe_close(rc->fd);
        free(rc->rbuf);
        rc->rbuf = NULL;
}

/* Pack and send @req with the next seq; returns the seq used. */
static int raw_send(RawConn *rc, Tier__Request *req, uint64_t *ret_seq) {
        uint8_t buf[REQUEST_BUF_SIZE];
        size_t len;

        req->seq = ++rc->seq;
        len = tier__request__get_packed_size(req);
        if (len > sizeof(buf))
                return -EMSGSIZE;
        (void) tier__request__pack(req, buf);
        if (ret_seq)
                *ret_seq = req->seq;
        return wire_send(rc->fd, buf, len, NULL, 0);
}

/*
 * raw_recv_response() - the next Response (Events are skipped).  Fds that
 * came along (segments, fence page) are closed: this connection maps nothing.
 */
static int raw_recv_response(RawConn *rc, Tier__Reply **ret) {
        for (;;) {
                int fds[WIRE_MAX_FDS];
                size_t len, n_fds;
                Tier__Reply *reply;
                int r;

                r = wire_recv(rc->fd, rc->rbuf, REPLY_BUF_SIZE, &len, fds, &n_fds);
                if (r < 0)
                        return r;
                wire_close_fds(fds, n_fds);
                reply = tier__reply__unpack(NULL, len, rc->rbuf);
                if (!reply)
                        return -EBADMSG;
                if (reply->kind_case == TIER__REPLY__KIND_RESPONSE && reply->response) {
                        *ret = reply;
                        return 0;
                }
                if (reply->kind_case == TIER__REPLY__KIND_EVENT && reply->event &&
                    reply->event->kind_case == TIER__EVENT__KIND_SHUTDOWN) {
                        tier__reply__free_unpacked(reply, NULL);
                        return -ESHUTDOWN;
                }
                tier__reply__free_unpacked(reply, NULL);
        }
}

/* Send @req and wait for its response; *ret must be freed by the caller. */
static int raw_call(RawConn *rc, Tier__Request *req, Tier__Reply **ret) {
        Tier__Reply *reply;
        uint64_t seq;
        int r;

        r = raw_send(rc, req, &seq);
        if (r < 0)
                return r;
        r = raw_recv_response(rc, &reply);
        if (r < 0)
                return r;
        if (reply->response->seq != seq) {
                tier__reply__free_unpacked(reply, NULL);
                return -EPROTO;
        }
        if (reply->response->status != 0) {
                bench_log("request %" PRIu64 " failed: %s: %s", seq, strerror(-reply->response->status),
                          reply->response->error ? reply->response->error : "");
                r = reply->response->status < 0 ? reply->response->status : -EPROTO;
                tier__reply__free_unpacked(reply, NULL);
                return r;
        }
        *ret = reply;
        return 0;
}

typedef struct PipeResult {
        double ops_per_s;
        uint64_t ops;
        uint64_t errors;
        uint64_t window;
        uint64_t max_inflight;
} PipeResult;

static int raw_pipelined(const Args *a, const char *socket, const char *job, const char *tensor_name,
                         PipeResult *ret) {
        RawConn rc = { .fd = -1 };
        Tier__Request req = TIER__REQUEST__INIT;
        Tier__Hello hello = TIER__HELLO__INIT;
        Tier__Open open_req = TIER__OPEN__INIT;
        Tier__Pin pin = TIER__PIN__INIT;
        Tier__Unpin unpin = TIER__UNPIN__INIT;
        Tier__Reply *reply = NULL;
        _cleanup_free_ char *job_copy = NULL, *name_copy = NULL;
        uint64_t tensor, window, sent = 0, inflight = 0, done = 0, errors = 0, t0, deadline, end;
        int first_error = 0, r;

        job_copy = strdup(job);
        name_copy = strdup(tensor_name);
        if (!job_copy || !name_copy)
                return -ENOMEM;

        r = raw_conn_open(&rc, socket);
        if (r < 0) {
                bench_log("connecting to %s: %s", socket, strerror(-r));
                return r;
        }

        hello.version = TIER_PROTOCOL_VERSION;
        hello.job = job_copy;
        hello.rank = 1;
        req.op_case = TIER__REQUEST__OP_HELLO;
        req.hello = &hello;
        r = raw_call(&rc, &req, &reply);
        if (r < 0) {
                bench_log("hello: %s", strerror(-r));
                goto finish;
        }
        if (reply->response->result_case != TIER__RESPONSE__RESULT_HELLO || !reply->response->hello) {
                bench_log("hello: no HelloReply");
                r = -EPROTO;
                goto finish;
        }
        ret->max_inflight = reply->response->hello->limits ? reply->response->hello->limits->max_inflight : 0;
        tier__reply__free_unpacked(reply, NULL);
        reply = NULL;

        window = a->window;
        if (ret->max_inflight > 0)
                window = MIN(window, ret->max_inflight);
        ret->window = window;

        open_req.name = name_copy;
        req.op_case = TIER__REQUEST__OP_OPEN;
        req.open = &open_req;
        r = raw_call(&rc, &req, &reply);
        if (r < 0) {
                bench_log("open \"%s\": %s", tensor_name, strerror(-r));
                goto finish;
        }
        if (reply->response->result_case != TIER__RESPONSE__RESULT_TENSOR || !reply->response->tensor) {
                bench_log("open: no TensorInfo");
                r = -EPROTO;
                goto finish;
        }
        tensor = reply->response->tensor->tensor;
        tier__reply__free_unpacked(reply, NULL);
        reply = NULL;

        pin.tensor = tensor;
        pin.tier = TIER__TIER__TIER_HOST;
        pin.async = false;
        unpin.tensor = tensor;
        unpin.tier = TIER__TIER__TIER_HOST;
        unpin.dirty = false;

        /* Sliding window: refill to `window`, then take one reply.  Stop after an Unpin. */
        t0 = now_ns();
        deadline = t0 + (uint64_t) (a->duration * 1e9);
        for (;;) {
                bool stop = (sent % 2 == 0) && now_ns() >= deadline;

                while (!stop && inflight < window) {
                        if (sent % 2 == 0) {
                                req.op_case = TIER__REQUEST__OP_PIN;
                                req.pin = &pin;
                        } else {
                                req.op_case = TIER__REQUEST__OP_UNPIN;
                                req.unpin = &unpin;
                        }
                        r = raw_send(&rc, &req, NULL);
                        if (r < 0) {
                                bench_log("sending request: %s", strerror(-r));
                                goto finish;
                        }
                        inflight++;
                        sent++;
                        if (sent % 2 == 0 && now_ns() >= deadline)
                                stop = true;
                }
                if (inflight == 0)
                        break;
                r = raw_recv_response(&rc, &reply);
                if (r < 0) {
                        bench_log("receiving reply: %s", strerror(-r));
                        goto finish;
                }
                inflight--;
                if (reply->response->status == 0)
                        done++;
                else {
                        if (errors++ == 0) {
                                first_error = reply->response->status;
                                bench_log("pipelined request %" PRIu64 " failed: %s: %s", reply->response->seq,
                                          strerror(-first_error),
                                          reply->response->error ? reply->response->error : "");
                        }
                }
                tier__reply__free_unpacked(reply, NULL);
                reply = NULL;
        }
        end = now_ns();

        ret->ops = done;
        ret->errors = errors;
        ret->ops_per_s = (double) done / ((double) (end - t0) / 1e9);
        r = 0;

finish:
        if (reply)
                tier__reply__free_unpacked(reply, NULL);
        raw_conn_close(&rc);
        return r;
}

/* ---- main ------------------------------------------------------------------- */

static void usage(void) {
        fprintf(stderr,
                "usage: %s [options]\n"
                "  --socket PATH     tierd socket (default $TIER_SOCKET, else the built-in one)\n"
                "  --iterations N    timed round trips (default 20000)\n"
                "  --warmup N        untimed round trips first (default 1000)\n"
                "  --window W        most requests in flight when pipelining (default 64)\n"
                "  --duration SEC    length of each pipelined run (default 2)\n"
                "  --job NAME        job name (default bench-ipc-PID)\n"
                "  --client-cpu N    pin this process to CPU N\n"
                "  --peer-cpu N      pin the raw echo peer to CPU N (bench/run pins tierd there too)\n"
                "Prints one JSON line on stdout; progress on stderr.\n",
                program_invocation_short_name);
}

static int parse_args(int argc, char **argv, Args *a) {
        enum { ARG_SOCKET = 0x100, ARG_ITERATIONS, ARG_WARMUP, ARG_WINDOW, ARG_DURATION, ARG_JOB,
               ARG_CLIENT_CPU, ARG_PEER_CPU };
        static const struct option options[] = {
                { "help", no_argument, NULL, 'h' },
                { "socket", required_argument, NULL, ARG_SOCKET },
                { "iterations", required_argument, NULL, ARG_ITERATIONS },
                { "warmup", required_argument, NULL, ARG_WARMUP },
                { "window", required_argument, NULL, ARG_WINDOW },
                { "duration", required_argument, NULL, ARG_DURATION },
                { "job", required_argument, NULL, ARG_JOB },
                { "client-cpu", required_argument, NULL, ARG_CLIENT_CPU },
                { "peer-cpu", required_argument, NULL, ARG_PEER_CPU },
                {}
        };
        uint64_t v;
        int c;

        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
                switch (c) {
                case 'h':
                        usage();
                        exit(EXIT_SUCCESS);
                case ARG_SOCKET:
                        a->socket = optarg;
                        break;
                case ARG_ITERATIONS:
                        if (bench_parse_uint(optarg, 1, 100000000, &a->iterations) < 0) {
                                bench_log("bad --iterations \"%s\"", optarg);
                                return -EINVAL;
                        }
                        break;
                case ARG_WARMUP:
                        if (bench_parse_uint(optarg, 0, 100000000, &a->warmup) < 0) {
                                bench_log("bad --warmup \"%s\"", optarg);
                                return -EINVAL;
                        }
                        break;
                case ARG_WINDOW:
                        if (bench_parse_uint(optarg, 1, 4096, &a->window) < 0) {
                                bench_log("bad --window \"%s\" (1..4096)", optarg);
                                return -EINVAL;
                        }
                        break;
                case ARG_DURATION:
                        if (bench_parse_seconds(optarg, &a->duration) < 0 || a->duration > 3600) {
                                bench_log("bad --duration \"%s\"", optarg);
                                return -EINVAL;
                        }
                        break;
                case ARG_JOB:
                        a->job = optarg;
                        break;
                case ARG_CLIENT_CPU:
                case ARG_PEER_CPU:
                        if (bench_parse_uint(optarg, 0, CPU_SETSIZE - 1, &v) < 0) {
                                bench_log("bad --%s \"%s\"", c == ARG_CLIENT_CPU ? "client-cpu" : "peer-cpu",
                                          optarg);
                                return -EINVAL;
                        }
                        if (c == ARG_CLIENT_CPU)
                                a->client_cpu = (int) v;
                        else
                                a->peer_cpu = (int) v;
                        break;
                default:
                        return -EINVAL;
                }
        }
        if (optind < argc) {
                bench_log("unexpected argument \"%s\"", argv[optind]);
                return -EINVAL;
        }
        return 0;
}

int main(int argc, char **argv) {
        Args a = {
                .iterations = 20000,
                .warmup = 1000,
                .window = 64,
                .duration = 2.0,
                .client_cpu = -1,
                .peer_cpu = -1,
        };
        _cleanup_free_ uint64_t *s1 = NULL, *s2 = NULL;
        RawResult raw = {};
        TierResult tr = {};
        PipeResult pipe_res = {};
        tier_client *c = NULL;
        tier_tensor *t = NULL;
        struct tier_grant g;
        const char *tensor_name = "bench-ipc";
        char job[64];
        BenchJson j;
        int r;

        r = parse_args(argc, argv, &a);
        if (r < 0)
                return 2;
        if (!a.job) {
                (void) snprintf(job, sizeof(job), "bench-ipc-%ld", (long) getpid());
                a.job = job;
        }
        a.socket = bench_socket_path(a.socket);
        /* A dead peer must show as an error, not kill us. */
        (void) signal(SIGPIPE, SIG_IGN);
        if (a.client_cpu >= 0) {
                r = pin_to_cpu(a.client_cpu);
                if (r < 0) {
                        bench_log("cannot pin to CPU %d: %s", a.client_cpu, strerror(-r));
                        return 1;
                }
        }

        s1 = calloc(a.iterations, sizeof(*s1));
        s2 = calloc(a.iterations, sizeof(*s2));
        if (!s1 || !s2) {
                bench_log("out of memory");
                return 1;
        }

        /* The baseline first, before this process holds any connection to tierd. */
        bench_log("raw SEQPACKET echo: %" PRIu64 " round trips, then pipelined (window %" PRIu64 ")",
                  a.iterations, a.window);
        r = raw_baseline(&a, s1, &raw);
        if (r < 0) {
                bench_log("raw baseline: %s", strerror(-r));
                return 1;
        }

        r = bench_connect(&c, a.socket, a.job, 0, 10000);
        if (r < 0) {
                bench_log("connecting to tierd at %s: %s", a.socket, tier_strerror(r));
                return 1;
        }
        r = tier_tensor_create(c, tensor_name, TENSOR_SIZE, &t);
        if (r < 0) {
                log_tier_error(c, r, "tier_tensor_create");
                goto finish;
        }
        /* Make it resident in HOST, so the timed pins move no data. */
        r = tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g);
        if (r < 0) {
                log_tier_error(c, r, "first tier_pin");
                goto finish;
        }
        r = tier_unpin(t, TIER_HOST, 0);
        if (r < 0) {
                log_tier_error(c, r, "first tier_unpin");
                goto finish;
        }

        bench_log("libtier: %" PRIu64 " x tier_pin + tier_unpin of a resident 1 MiB tensor", a.iterations);
        r = tier_round_trips(&a, c, t, s1, s2, &tr);
        if (r < 0)
                goto finish;

        bench_log("raw protocol: pipelined Pin/Unpin for %.1f s", a.duration);
        r = raw_pipelined(&a, a.socket, a.job, tensor_name, &pipe_res);
        if (r < 0)
                goto finish;

finish:
        if (t) {
                int k = tier_tensor_destroy(t);
                if (k < 0)
                        log_tier_error(c, k, "tier_tensor_destroy");
        }
        c = tier_client_free(c);
        if (r < 0)
                return 1;

        bench_json_init(&j, "ipc");
        bench_json_u64(&j, "iterations", a.iterations);
        bench_json_double(&j, "pin_rtt_us_p50", tr.pin_p50_us);
        bench_json_double(&j, "pin_rtt_us_p99", tr.pin_p99_us);
        bench_json_double(&j, "unpin_rtt_us_p50", tr.unpin_p50_us);
        bench_json_double(&j, "unpin_rtt_us_p99", tr.unpin_p99_us);
        bench_json_double(&j, "ops_per_s", pipe_res.ops_per_s);
        bench_json_u64(&j, "ops_window", pipe_res.window);
        bench_json_u64(&j, "ops_errors", pipe_res.errors);
        bench_json_u64(&j, "max_inflight", pipe_res.max_inflight);
        bench_json_double(&j, "raw_rtt_us_p50", raw.rtt_p50_us);
        bench_json_double(&j, "raw_rtt_us_p99", raw.rtt_p99_us);
        bench_json_double(&j, "raw_ops_per_s", raw.ops_per_s);
        bench_json_double(&j, "pin_vs_raw", raw.rtt_p50_us > 0 ? tr.pin_p50_us / raw.rtt_p50_us : NAN);
        bench_json_double(&j, "ops_vs_raw", raw.ops_per_s > 0 ? pipe_res.ops_per_s / raw.ops_per_s : NAN);
        bench_json_i64(&j, "client_cpu", a.client_cpu);
        bench_json_i64(&j, "peer_cpu", a.peer_cpu);
        r = bench_json_print(&j);
        if (r < 0) {
                bench_log("printing the result: %s", strerror(-r));
                return 1;
        }
        return 0;
}
