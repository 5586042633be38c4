/* SPDX-License-Identifier: MIT */
/* test-timeout.c: a client with a request timeout gives up on a tierd that stopped answering (SIGSTOP). */

/*
 * tier_client_set_timeout(): tierd is stopped (SIGSTOP, and waitpid() says it
 * is), so that the request the client sends then is never answered while the
 * test looks: the call fails with -ETIMEDOUT (only that it returned and how is
 * asserted, never how long it took), the socket is closed at once, later calls
 * fail with -ECONNRESET (tier_phase_enter() too, which would otherwise wait for
 * ever), and the tierd continued after (SIGCONT) sees the connection end and
 * lets go of its pins.  With reconnecting on, the next call joins tierd again,
 * or, while tierd is still stopped, gives up after the reconnect timeout.  No
 * fd is left behind.  A fence not done when the connection ended (the client
 * closed it for a timeout, or tierd for a protocol error) never reads as done
 * once the job's next connection has its slot of the fence page.
 */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>
#include <tier.h>

#include "tests/helpers/harness.h"
#include "tests/helpers/json.h"

#define MiB (1024ull * 1024ull)
/* The client's timeout: short, as tierd is stopped for sure (only that the call returns is asserted). */
#define TIMEOUT_MS 100
/* How often, and how many times, tierd's status is read until it shows what the test waits for. */
#define STATUS_POLL_US 20000
#define STATUS_POLLS 500

static const char config_body[] =
        "[daemon]\nlinger_sec = 600\n"
        "[host]\ncapacity = 16M\nsegment_size = 4M\njob_limit = 16M\nuid_share = 0\n"
        "[vram]\nbackend = emulated\ncapacity = 8M\nchunk_size = 2M\njob_limit = 8M\n"
        "[nvme]\ntarget = @DIR@/t0.img:64M\nuid_share = 0\n";

/*
 * An async write-down of job "frozen" stays unfinished while the test looks: its NVMe writes complete
 * this late (tierd's limit for the rule; no other job's I/O is touched).
 */
#define FAULTS "nvme-delay:job=frozen,ms=60000"
/* Sockets enough to fill tierd's listen queue (its backlog is 128; the kernel's limit 4096). */
#define QUEUE_FILL_MAX 8192

static TestDaemon d;
/* The tierd the helpers below stop, continue and read: d, or a test's own (test_timeout_fences_not_taken_over()) */
static TestDaemon *cur = &d;

/* The fds this process has open. */
static int count_fds(void) {
        DIR *dir = opendir("/proc/self/fd");
        struct dirent *e;
        int n = 0;

        assert_non_null(dir);
        while ((e = readdir(dir)))
                n += e->d_name[0] != '.';
        closedir(dir);
        return n - 1;   /* the directory's own */
}

/* SIGSTOP tierd, and return once it is stopped: nothing it has not answered yet is answered until tierd_cont(). */
static void tierd_stop(void) {
        int st;

        assert_int_equal(kill(cur->pid, SIGSTOP), 0);
        assert_int_equal(waitpid(cur->pid, &st, WUNTRACED), cur->pid);
        assert_true(WIFSTOPPED(st));
}

static void tierd_cont(void) {
        assert_int_equal(kill(cur->pid, SIGCONT), 0);
}

/* Wait until tierd's status shows job @job with @connections connections and nothing pinned. */
static void wait_job_released(const char *job, long long connections) {
        for (int i = 0; i < STATUS_POLLS; i++) {
                json_t *status = test_daemon_status(cur);
                json_t *j;
                bool done;

                assert_non_null(status);
                j = test_json_job(status, job);
                assert_non_null(j);
                done = json_integer_value(json_object_get(j, "connections")) == connections &&
                       test_json_job_tier(status, job, "host", "pinned") == 0;
                json_decref(status);
                if (done)
                        return;
                usleep(STATUS_POLL_US);
        }
        fail_msg("job '%s' still has its connection or pins", job);
}

static void test_timeout_closes(void **state) {
        tier_client *c = NULL, *other = NULL;
        tier_tensor *t = NULL, *u = NULL;
        struct tier_grant g;
        struct tier_stat st;
        tier_fence f;
        tier_plan *p = NULL;
        int fds = count_fds(), fd;

        assert_int_equal(tier_client_new(d.socket, "stopped", 0, &c), 0);
        /* argument checks */
        assert_int_equal(tier_client_set_timeout(NULL, 10), -EINVAL);
        assert_int_equal(tier_client_set_timeout(c, -1), -EINVAL);
        assert_non_null(strstr(tier_client_last_error(c), "0 (none) or more"));
        assert_int_equal(tier_client_set_timeout(c, 0), 0);
        assert_int_equal(tier_client_set_timeout(c, TIMEOUT_MS), 0);

        /* with tierd answering, the timeout changes nothing */
        assert_int_equal(tier_tensor_create(c, "t", MiB, &t), 0);
        assert_int_equal(tier_tensor_create(c, "u", MiB, &u), 0);
        assert_int_equal(tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g), 0);
        memset(g.ptr, 0x5a, g.length);
        assert_int_equal(tier_prefetch_async(u, TIER_HOST, &f), 0);
        assert_int_equal(tier_fence_wait(c, f, -1), 0);
        assert_int_equal(tier_plan_new(c, &p), 0);
        assert_int_equal(tier_plan_add(p, 0, u, TIER_HOST, TIER_READ), 0);
        assert_int_equal(tier_plan_add(p, 1, u, TIER_HOST, TIER_READ), 0);
        assert_int_equal(tier_plan_submit(p), 0);
        assert_int_equal(tier_phase_enter(c, 0), 0);
        fd = tier_client_fd(c);
        assert_true(fd >= 0);

        tierd_stop();
        assert_int_equal(tier_tensor_stat(u, &st), -ETIMEDOUT);
        assert_non_null(strstr(tier_client_last_error(c), "did not answer"));
        /* the socket is closed already: tierd sees the connection end when it runs again */
        assert_int_equal(fcntl(fd, F_GETFD), -1);
        assert_int_equal(errno, EBADF);
        assert_int_equal(tier_client_fd(c), -ECONNRESET);
        /* later calls fail as after a lost connection, and wait for nothing */
        assert_int_equal(tier_tensor_stat(t, &st), -ECONNRESET);
        assert_non_null(strstr(tier_client_last_error(c), "the connection was closed"));
        assert_int_equal(tier_unpin(t, TIER_HOST, 1), -ECONNRESET);
        assert_int_equal(tier_phase_enter(c, 1), -ECONNRESET);
        assert_int_equal(tier_client_process(c), -ECONNRESET);
        /* a fence done before is still done; the grant's memory is still mapped */
        assert_int_equal(tier_fence_done(c, f), 1);
        assert_int_equal(tier_fence_wait(c, f, -1), 0);
        assert_int_equal(((unsigned char *) g.ptr)[g.length - 1], 0x5a);

        /* tierd runs again: the late answer goes nowhere, and the job's connection and pin are let go */
        tierd_cont();
        wait_job_released("stopped", 0);
        assert_int_equal(tier_client_new(d.socket, "stopped", 0, &other), 0);
        tier_client_free(other);

        tier_tensor_close(t);
        tier_tensor_close(u);
        tier_client_free(c);
        assert_int_equal(count_fds(), fds);
}

static void test_timeout_reconnects(void **state) {
        tier_client *c = NULL;
        tier_tensor *t = NULL;
        struct tier_grant g;
        struct tier_stat st;
        int fds = count_fds();

        assert_int_equal(tier_client_new(d.socket, "rejoin", 0, &c), 0);
        assert_int_equal(tier_client_set_reconnect(c, 30000), 0);
        assert_int_equal(tier_client_set_timeout(c, TIMEOUT_MS), 0);
        assert_int_equal(tier_tensor_create(c, "t", MiB, &t), 0);
        assert_int_equal(tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g), 0);
        memset(g.ptr, 0x3c, g.length);
        assert_int_equal(tier_unpin(t, TIER_HOST, 1), 0);
        assert_int_equal(tier_pin(t, TIER_HOST, TIER_READ, &g), 0);

        tierd_stop();
        /* the call that timed out says so; it does not reconnect to the stopped tierd itself */
        assert_int_equal(tier_tensor_stat(t, &st), -ETIMEDOUT);
        assert_int_equal(tier_client_restarts(c), 0);
        assert_int_equal(tier_client_fd(c), -ECONNRESET);
        tierd_cont();

        /* the next call joins tierd again: its pin went with the connection */
        assert_int_equal(tier_tensor_stat(t, &st), -ERESTART);
        assert_non_null(strstr(tier_client_last_error(c), "connected to tierd again"));
        assert_int_equal(tier_client_restarts(c), 1);
        assert_true(tier_client_fd(c) >= 0);
        assert_int_equal(tier_tensor_stat(t, &st), 0);
        assert_int_equal(tier_pin(t, TIER_HOST, TIER_READ, &g), 0);
        assert_int_equal(((unsigned char *) g.ptr)[0], 0x3c);
        assert_int_equal(tier_unpin(t, TIER_HOST, 0), 0);
        wait_job_released("rejoin", 1);

        tier_tensor_close(t);
        tier_client_free(c);
        assert_int_equal(count_fds(), fds);
}

/*
 * Reconnecting to a tierd that is still stopped: each attempt's Hello times out too (the socket
 * takes the connection, nobody answers), and once the reconnect timeout passed the call fails with
 * the error that broke the connection (a second attempt too, naming the first cause once); continued,
 * tierd is joined again by the next call, which says it connected again, not that tierd restarted.
 */
static void test_timeout_reconnect_gives_up(void **state) {
        tier_client *c = NULL;
        tier_tensor *t = NULL;
        struct tier_stat st;
        int fds = count_fds();

        assert_int_equal(tier_client_new(d.socket, "giveup", 0, &c), 0);
        assert_int_equal(tier_client_set_reconnect(c, 3 * TIMEOUT_MS), 0);
        assert_int_equal(tier_client_set_timeout(c, TIMEOUT_MS), 0);
        assert_int_equal(tier_tensor_create(c, "t", MiB, &t), 0);

        tierd_stop();
        assert_int_equal(tier_tensor_stat(t, &st), -ETIMEDOUT);
        assert_int_equal(tier_tensor_stat(t, &st), -ECONNRESET);
        assert_non_null(strstr(tier_client_last_error(c), "did not come back"));
        assert_int_equal(tier_client_fd(c), -ECONNRESET);
        assert_int_equal(tier_client_restarts(c), 0);
        /* a second attempt that gives up says the first cause once, not wrapped in the last attempt's words */
        assert_int_equal(tier_tensor_stat(t, &st), -ECONNRESET);
        assert_non_null(strstr(tier_client_last_error(c), "did not answer"));
        assert_null(strstr(tier_client_last_error(c), "went away (tierd went away"));
        assert_int_equal(tier_client_restarts(c), 0);
        tierd_cont();

        /* tierd did not restart: the attempts that gave up do not make the rejoin say it did */
        assert_int_equal(tier_tensor_stat(t, &st), -ERESTART);
        assert_non_null(strstr(tier_client_last_error(c), "connected to tierd again"));
        assert_null(strstr(tier_client_last_error(c), "tierd restarted"));
        assert_null(strstr(tier_client_last_error(c), "went away (tierd went away"));
        assert_int_equal(tier_client_restarts(c), 1);
        assert_int_equal(tier_tensor_stat(t, &st), 0);
        wait_job_released("giveup", 1);

        tier_tensor_close(t);
        tier_client_free(c);
        assert_int_equal(count_fds(), fds);
}

static volatile sig_atomic_t ticks;

static void on_tick(int sig) {
        (void) sig;
        ticks++;
}

/* Stop the interval timer test_timeout_signals() starts, and take SIGALRM's default back. */
static void ticks_stop(void) {
        struct itimerval off = {};
        struct sigaction dfl = { .sa_handler = SIG_DFL };

        (void) setitimer(ITIMER_REAL, &off, NULL);
        (void) sigaction(SIGALRM, &dfl, NULL);
}

/*
 * A process that takes signals more often than its timeout (a profiler's timer, here every 20 ms
 * against 100) interrupts every poll(): the call still gives up (it polls again for what is left of
 * the deadline).  Before: each EINTR polled again for the whole timeout, and the call waited for
 * ever.  (Every 1 ms, under valgrind each signal took longer than the next came: the test never
 * ended.)
 */
static void test_timeout_signals(void **state) {
        struct sigaction sa = { .sa_handler = on_tick };
        struct itimerval it = { .it_interval = { .tv_usec = 20000 }, .it_value = { .tv_usec = 20000 } };
        tier_client *c = NULL;
        tier_tensor *t = NULL;
        struct tier_stat st;
        int fds = count_fds(), r;

        assert_int_equal(tier_client_new(d.socket, "signals", 0, &c), 0);
        assert_int_equal(tier_client_set_timeout(c, TIMEOUT_MS), 0);
        assert_int_equal(tier_tensor_create(c, "t", MiB, &t), 0);

        tierd_stop();
        sigemptyset(&sa.sa_mask);
        assert_int_equal(sigaction(SIGALRM, &sa, NULL), 0);
        assert_int_equal(setitimer(ITIMER_REAL, &it, NULL), 0);
        r = tier_tensor_stat(t, &st);
        ticks_stop();
        assert_int_equal(r, -ETIMEDOUT);
        assert_int_equal(tier_client_fd(c), -ECONNRESET);
        tierd_cont();
        wait_job_released("signals", 0);

        tier_tensor_close(t);
        tier_client_free(c);
        assert_int_equal(count_fds(), fds);
}

/* A tierd of the test's own, with FAULTS (its writes to NVMe a minute late), made current: test_teardown() kills it. */
static void start_frozen(TestDaemon *df) {
        int r;

        assert_int_equal(setenv("TIERD_TEST_FAULTS", FAULTS, 1), 0);
        r = test_daemon_start(df, config_body);
        unsetenv("TIERD_TEST_FAULTS");
        assert_true(r >= 0);
        cur = df;
}

/*
 * A fence not done when the call timed out: tierd, continued, lets the connection go and gives its
 * slot of the job's fence page to the job's next connection, whose fences advance the slot.  The
 * closed client's fence must not read as done by them: it fails with the connection's error.  Before:
 * tier_fence_done() said 1 (done) for a write-down tierd never finished for it.
 */
static void test_timeout_fences_not_taken_over(void **state) {
        static TestDaemon df;
        tier_client *c = NULL, *next = NULL;
        tier_tensor *t = NULL, *w = NULL;
        struct tier_grant g;
        struct tier_stat st;
        tier_fence f, fn;
        int fds;

        start_frozen(&df);
        fds = count_fds();
        assert_int_equal(tier_client_new(df.socket, "frozen", 0, &c), 0);
        assert_int_equal(tier_client_set_timeout(c, TIMEOUT_MS), 0);
        assert_int_equal(tier_tensor_create(c, "t", MiB, &t), 0);
        assert_int_equal(tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g), 0);
        memset(g.ptr, 0x11, g.length);
        assert_int_equal(tier_unpin(t, TIER_HOST, 1), 0);
        /* its NVMe write completes a minute late (FAULTS): the fence is not done while the test looks */
        assert_int_equal(tier_evict_async(t, TIER_NVME, &f), 0);
        assert_true(f != 0);
        assert_int_equal(tier_fence_done(c, f), 0);

        tierd_stop();
        assert_int_equal(tier_tensor_stat(t, &st), -ETIMEDOUT);
        tierd_cont();
        wait_job_released("frozen", 0);

        /* the job's next connection: its first fence is done, on the slot the closed one had */
        assert_int_equal(tier_client_new(df.socket, "frozen", 0, &next), 0);
        assert_int_equal(tier_tensor_create(next, "w", MiB, &w), 0);
        assert_int_equal(tier_pin(w, TIER_HOST, TIER_READ_WRITE, &g), 0);
        memset(g.ptr, 0x22, g.length);
        assert_int_equal(tier_unpin(w, TIER_HOST, 1), 0);
        assert_int_equal(tier_prefetch_async(w, TIER_VRAM, &fn), 0);
        assert_true(fn != 0);
        assert_int_equal(tier_fence_wait(next, fn, -1), 0);

        /* the closed client's fence is not that one */
        assert_int_equal(tier_fence_done(c, f), -ECONNRESET);
        assert_int_equal(tier_fence_wait(c, f, 0), -ECONNRESET);

        tier_tensor_close(w);
        tier_client_free(next);
        tier_tensor_close(t);
        tier_client_free(c);
        assert_int_equal(count_fds(), fds);
}

/*
 * The same when tierd closes the connection (here for a malformed packet the client's socket is sent,
 * through tier_client_fd()): the slot goes to the job's next connection (another rank) as soon as
 * tierd has let the closed one go, before its client has looked.  Its fence must not read as done by
 * the next connection's fences (tierd bumps the slot's failed counter when it hands the slot out):
 * it fails with the connection's error.  Before: tier_fence_done() said 1 (done) for a write-down
 * tierd never finished for it.
 */
static void closed_fences(bool reconnect) {
        static TestDaemon df;
        static const uint8_t garbage[] = { 0xff };      /* a varint cut short: no Request */
        tier_client *c = NULL, *next = NULL;
        tier_tensor *t = NULL, *w = NULL;
        struct tier_grant g;
        tier_fence f, fn;
        int fds, r;

        start_frozen(&df);
        fds = count_fds();
        assert_int_equal(tier_client_new(df.socket, "frozen", 0, &c), 0);
        if (reconnect)
                assert_int_equal(tier_client_set_reconnect(c, 60000), 0);
        assert_int_equal(tier_tensor_create(c, "t", MiB, &t), 0);
        assert_int_equal(tier_pin(t, TIER_HOST, TIER_READ_WRITE, &g), 0);
        memset(g.ptr, 0x11, g.length);
        assert_int_equal(tier_unpin(t, TIER_HOST, 1), 0);
        /* its NVMe write completes a minute late (FAULTS): the fence is not done while the test looks */
        assert_int_equal(tier_evict_async(t, TIER_NVME, &f), 0);
        assert_true(f != 0);
        assert_int_equal(tier_fence_done(c, f), 0);

        /* tierd closes the connection (a protocol error); the client does not look until the end */
        assert_int_equal(send(tier_client_fd(c), garbage, sizeof(garbage), MSG_NOSIGNAL), (ssize_t) sizeof(garbage));
        wait_job_released("frozen", 0);

        /* the job's next connection takes the slot (the only one free, the first) and passes the fence */
        assert_int_equal(tier_client_new(df.socket, "frozen", 1, &next), 0);
        assert_int_equal(tier_tensor_create(next, "w", MiB, &w), 0);
        for (int i = 0; i < 2; i++) {
                assert_int_equal(tier_prefetch_async(w, TIER_HOST, &fn), 0);
                assert_true(fn != 0);
                assert_int_equal(tier_fence_wait(next, fn, -1), 0);
        }

        /*
         * the closed client's fence is not those: it fails as the connection did, with tierd's reason
         * (it was "tierd answered request 0 while request 0 was in flight", -EPROTO); a client that
         * reconnects does not join tierd again: the connection was closed for its own protocol error,
         * not because tierd went
         */
        r = tier_fence_done(c, f);
        assert_int_equal(r, -EBADMSG);
        assert_non_null(strstr(tier_client_last_error(c), "tierd closed the connection: malformed message"));
        assert_int_equal(tier_client_restarts(c), 0);
        assert_int_equal(tier_fence_wait(c, f, 0), r);
        assert_int_equal(tier_fence_wait(c, f, -1), r);

        tier_tensor_close(w);
        tier_client_free(next);
        tier_tensor_close(t);
        tier_client_free(c);
        assert_int_equal(count_fds(), fds);
}

static void test_closed_fences_not_taken_over(void **state) {
        closed_fences(false);
}

/* The same with reconnecting on: a connection tierd closed for the client's protocol error is not joined again. */
static void test_closed_fences_reconnect(void **state) {
        closed_fences(true);
}

/*
 * Reconnecting to a tierd that is stopped with its listen queue full (every attempt leaves one
 * connection there; here the test fills it): connect() is bounded by the timeout as the Hello is, and
 * the call gives up after the reconnect timeout.  Before: connect() waited for ever.
 */
static void test_timeout_reconnect_queue_full(void **state) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        int *fill = calloc(QUEUE_FILL_MAX, sizeof(int));
        tier_client *c = NULL;
        tier_tensor *t = NULL;
        struct tier_stat st;
        int fds = count_fds(), n = 0;
        bool full = false;

        assert_non_null(fill);
        assert_true(strlen(d.socket) < sizeof(sa.sun_path));
        strcpy(sa.sun_path, d.socket);
        assert_int_equal(tier_client_new(d.socket, "queue", 0, &c), 0);
        assert_int_equal(tier_client_set_reconnect(c, 3 * TIMEOUT_MS), 0);
        assert_int_equal(tier_client_set_timeout(c, TIMEOUT_MS), 0);
        assert_int_equal(tier_tensor_create(c, "t", MiB, &t), 0);

        tierd_stop();
        assert_int_equal(tier_tensor_stat(t, &st), -ETIMEDOUT);
        while (n < QUEUE_FILL_MAX && !full) {
                int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

                assert_true(fd >= 0);
                if (connect(fd, (const struct sockaddr *) &sa, sizeof(sa)) < 0) {
                        assert_int_equal(errno, EAGAIN);
                        full = true;
                        close(fd);
                } else
                        fill[n++] = fd;
        }
        assert_true(full);
        assert_int_equal(tier_tensor_stat(t, &st), -ECONNRESET);
        assert_non_null(strstr(tier_client_last_error(c), "did not come back"));
        assert_int_equal(tier_client_restarts(c), 0);
        for (int i = 0; i < n; i++)
                close(fill[i]);
        free(fill);
        tierd_cont();

        assert_int_equal(tier_tensor_stat(t, &st), -ERESTART);
        assert_int_equal(tier_tensor_stat(t, &st), 0);
        wait_job_released("queue", 1);

        tier_tensor_close(t);
        tier_client_free(c);
        assert_int_equal(count_fds(), fds);
}

static int setup(void **state) {
        if (!test_can_lock_memory(16 * MiB))
                return -1;
        return test_daemon_start(&d, config_body) < 0 ? -1 : 0;
}

/*
 * After each test, passed or failed: a test that failed while tierd was stopped leaves it stopped,
 * and the next test's tier_client_new() (no timeout) would wait for it for ever.
 */
static int test_teardown(void **state) {
        ticks_stop();
        if (cur->pid > 0)
                (void) kill(cur->pid, SIGCONT);
        if (cur != &d) {
                /* its write-down is a minute late (FAULTS): a stop would wait for it; nothing of it is kept */
                (void) test_daemon_kill(cur, SIGKILL, 10000);
                test_daemon_cleanup(cur);
                cur = &d;
        }
        return 0;
}

static int teardown(void **state) {
        if (d.pid > 0)
                (void) kill(d.pid, SIGCONT);    /* a test that failed while tierd was stopped */
        return test_daemon_stop(&d) == 0 ? 0 : -1;
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_teardown(test_timeout_closes, test_teardown),
                cmocka_unit_test_teardown(test_timeout_reconnects, test_teardown),
                cmocka_unit_test_teardown(test_timeout_reconnect_gives_up, test_teardown),
                cmocka_unit_test_teardown(test_timeout_signals, test_teardown),
                cmocka_unit_test_teardown(test_timeout_fences_not_taken_over, test_teardown),
                cmocka_unit_test_teardown(test_closed_fences_not_taken_over, test_teardown),
                cmocka_unit_test_teardown(test_closed_fences_reconnect, test_teardown),
                cmocka_unit_test_teardown(test_timeout_reconnect_queue_full, test_teardown),
        };

        if (!test_can_lock_memory(16 * MiB))
                return TEST_SKIP;
        if (getenv("TIER_TEST_FILTER"))                 /* one test, by name (a glob) */
                cmocka_set_test_filter(getenv("TIER_TEST_FILTER"));
        return cmocka_run_group_tests_name("timeout", tests, setup, teardown);
}
