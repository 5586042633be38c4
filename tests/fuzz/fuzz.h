/* SPDX-License-Identifier: MIT */
/* fuzz.h: what every fuzz target shares: the libFuzzer entry points and a reader over the input. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/*
 * Each target defines LLVMFuzzerTestOneInput() and fuzz_write_seeds().
 * Built with -Dfuzzer=true (clang), libFuzzer's main drives it; otherwise
 * replay.c's main runs it over the files of its corpus (meson test, suite
 * "fuzz") and, with --write-seeds DIR, writes the seed corpus.
 */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);
/* Write the target's seed inputs into @dir (which exists); 0 or -errno. */
int fuzz_write_seeds(const char *dir);
/* Write one seed file @dir/@name; 0 or -errno. */
int fuzz_write_file(const char *dir, const char *name, const void *data, size_t size);

/* A cursor over the input: reads past the end give zeros, never fail. */
typedef struct FuzzIn {
        const uint8_t *p;
        size_t n;
} FuzzIn;

static inline uint8_t fin_u8(FuzzIn *in) {
        if (in->n == 0)
                return 0;
        in->n--;
        return *in->p++;
}

static inline uint16_t fin_u16(FuzzIn *in) {
        uint16_t lo = fin_u8(in);

        return (uint16_t) (lo | (uint16_t) fin_u8(in) << 8);
}

static inline uint32_t fin_u32(FuzzIn *in) {
        uint32_t lo = fin_u16(in);

        return lo | (uint32_t) fin_u16(in) << 16;
}

static inline uint64_t fin_u64(FuzzIn *in) {
        uint64_t lo = fin_u32(in);

        return lo | (uint64_t) fin_u32(in) << 32;
}

/* Up to @len bytes (fewer at the end of the input); *ret points into the input. */
static inline size_t fin_bytes(FuzzIn *in, size_t len, const uint8_t **ret) {
        if (len > in->n)
                len = in->n;
        *ret = in->p;
        in->p += len;
        in->n -= len;
        return len;
}

/* A growing buffer the seed writers build inputs in. */
typedef struct FuzzOut {
        uint8_t buf[65536];
        size_t n;
} FuzzOut;

static inline void fout_bytes(FuzzOut *o, const void *p, size_t len) {
        if (len > sizeof(o->buf) - o->n)
                len = sizeof(o->buf) - o->n;
        memcpy(o->buf + o->n, p, len);
        o->n += len;
}

static inline void fout_u8(FuzzOut *o, uint8_t v) {
        fout_bytes(o, &v, 1);
}

static inline void fout_u16(FuzzOut *o, uint16_t v) {
        fout_u8(o, (uint8_t) v);
        fout_u8(o, (uint8_t) (v >> 8));
}

static inline void fout_u32(FuzzOut *o, uint32_t v) {
        fout_u16(o, (uint16_t) v);
        fout_u16(o, (uint16_t) (v >> 16));
}

static inline void fout_u64(FuzzOut *o, uint64_t v) {
        fout_u32(o, (uint32_t) v);
        fout_u32(o, (uint32_t) (v >> 32));
}


/* The kinds of fd fuzz_make_fd() makes; a bit mask of them selects the fds one packet carries. */
enum {
        FD_MEMFD,               /* 4K, writable */
        FD_EVENTFD,
        FD_DEVNULL,
        FD_DIR_PATH,            /* a directory, O_PATH */
        FD_SOCKET,              /* one end of a socketpair whose other end is closed */
        FD_SEALED_MEMFD,        /* 4K, every seal set */
        FD_PIPE,                /* the read end of a pipe */
        FD_DIR,                 /* a directory, O_RDONLY */
        FD_MEMFD_BIG,           /* 1M, writable: room for a segment or a plan page */
        _FD_KIND_MAX,
};
/* A new fd of @kind (CLOEXEC); aborts on failure. */
int fuzz_make_fd(int kind);

/* The number of open fds of this process (a target checks it comes back to where it started). */
int fuzz_count_fds(void);

/* A target's own check: on failure say which, then abort() (a crash for libFuzzer, a failure for replay). */
#define FUZZ_CHECK(cond)                                                                                \
        do {                                                                                            \
                if (!(cond)) {                                                                          \
                        fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);        \
                        abort();                                                                        \
                }                                                                                       \
        } while (0)
