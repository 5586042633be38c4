/* SPDX-License-Identifier: MIT */
/* test-client-hostile.h: test-client-hostile's scripted fake tierd, for the tests in its other files. */
#pragma once

#include <pthread.h>
#include <stdbool.h>

enum {
        SC_PLAN_SHORT_MEMFD,    /* plan page_size 64 KiB, memfd 0 bytes */
        SC_PLAN_ERROR_WRAPS,    /* daemon.error = 1 << 32: never ready */
        SC_SEGMENT_HUGE,        /* a 1 GiB segment (sparse): its mmap fails under RLIMIT_AS */
        SC_PLAIN,               /* nothing hostile: a client's life around its plans */
        SC_SHUTDOWN,            /* after the Hello, a Shutdown event, and the connection closed */
        SC_FENCE_FAILED,        /* a pin answered with fence 1, then a FenceFailed event for it */
        SC_REPLIES,             /* status, metrics, jobs, tensors and traces answered, through memfds or inline */
        SC_GONE,                /* a pin answered with fence 1, never done: the connection closed after it */
        SC_GONE_BACK,           /* SC_GONE, then each next connection served plainly (a tierd that came back) */
};

typedef struct Fake {
        int scenario;
        int *inline_replies;    /* SC_REPLIES: in the packet, not through a memfd (MAP_SHARED: the child sets it) */
        const char *job_name;   /* SC_REPLIES: the name of its one job (NULL: "job") */
        bool stopping;          /* SC_REPLIES, SC_GONE_BACK: the connection fake_stop() makes ends the fake */
        unsigned served;        /* connections served so far (the fake's thread alone) */
        pthread_barrier_t started;      /* fake_start() returns once the thread runs fake_main(): a fork()
                                         * after it never copies a thread half made (the sanitizers' locks) */
        int listen_fd;
        char dir[64], path[96];
        pthread_t thread;
} Fake;

/* Start the fake on a socket of its own (@f->path), serving @scenario; fake_stop() joins it. */
void fake_start(Fake *f, int scenario);
void fake_stop(Fake *f);
/* Run @fn in a child (so a crash is seen as one); its exit status, or 128 + signal. */
int in_child(int (*fn)(const char *path), const char *path);

/* The tests of test-client-hostile-gone.c */
void test_fence_done_after_tierd_gone(void **state);
void test_fence_done_reconnects(void **state);

/* The tests of test-client-hostile-quota.c */
void test_quota_get_lists_every_name(void **state);
