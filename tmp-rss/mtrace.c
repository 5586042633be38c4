/* LD_PRELOAD malloc tracer for tierd: live allocations (pointer, size, 4 frames)
 * in a table; mt_dump(path) (called from gdb) writes the live ones by address. */
#define _GNU_SOURCE
#include <execinfo.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

extern void *__libc_malloc(size_t), *__libc_calloc(size_t, size_t), *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);

#define CAP (1u << 21)
#define NF 6
typedef struct { uintptr_t p; size_t n; void *f[NF]; uint64_t seq; } Ent;
static Ent *tab;
static uint64_t seq;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static __thread int busy;
static int ready;

static size_t h(uintptr_t p) { return (size_t) (((p >> 4) * 0x9E3779B97F4A7C15ull) >> 40) & (CAP - 1); }

__attribute__((constructor)) static void init(void) {
        void *b[4];
        busy = 1;
        backtrace(b, 4);
        tab = mmap(NULL, sizeof(Ent) * CAP, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        busy = 0;
        ready = 1;
}

static void add(void *p, size_t n) {
        void *b[NF + 2] = {0};
        if (!p || busy || !ready) return;
        busy = 1;
        int k = backtrace(b, NF + 2);
        (void) k;
        pthread_mutex_lock(&mu);
        for (size_t i = h((uintptr_t) p);; i = (i + 1) & (CAP - 1))
                if (tab[i].p <= 1) {
                        tab[i].p = (uintptr_t) p; tab[i].n = n; tab[i].seq = ++seq;
                        memcpy(tab[i].f, b + 2, sizeof(tab[i].f));
                        break;
                }
        pthread_mutex_unlock(&mu);
        busy = 0;
}

static void del(void *p) {
        if (!p || !ready) return;
        pthread_mutex_lock(&mu);
        for (size_t i = h((uintptr_t) p); tab[i].p; i = (i + 1) & (CAP - 1))
                if (tab[i].p == (uintptr_t) p) { tab[i].p = 1; break; }
        pthread_mutex_unlock(&mu);
}

void *malloc(size_t n) { void *p = __libc_malloc(n); add(p, n); return p; }
void *calloc(size_t a, size_t b) { void *p = __libc_calloc(a, b); add(p, a * b); return p; }
void free(void *p) { del(p); __libc_free(p); }
void *realloc(void *o, size_t n) { del(o); void *p = __libc_realloc(o, n); if (p) add(p, n); else if (o && n) add(o, n); return p; }
void *reallocarray(void *o, size_t a, size_t b) { return realloc(o, a * b); }
int posix_memalign(void **r, size_t al, size_t n) { void *p = __libc_memalign(al, n); if (!p) return 12; add(p, n); *r = p; return 0; }
void *aligned_alloc(size_t al, size_t n) { void *p = __libc_memalign(al, n); add(p, n); return p; }
void *memalign(size_t al, size_t n) { void *p = __libc_memalign(al, n); add(p, n); return p; }

static int cmp(const void *a, const void *b) {
        const Ent *x = a, *y = b;
        return x->p < y->p ? -1 : x->p > y->p;
}

/* live allocations, sorted by address, to @path */
int mt_dump(void) {
        static Ent out[1u << 20];
        static int k;
        char path[256];
        snprintf(path, sizeof(path), "%s.%d", getenv("MT_DUMP") ? getenv("MT_DUMP") : "/tmp/mt", ++k);
        size_t m = 0;
        busy = 1;
        pthread_mutex_lock(&mu);
        for (size_t i = 0; i < CAP && m < (1u << 20); i++)
                if (tab[i].p > 1) out[m++] = tab[i];
        pthread_mutex_unlock(&mu);
        qsort(out, m, sizeof(Ent), cmp);
        FILE *f = fopen(path, "w");
        if (!f) { busy = 0; return -1; }
        for (size_t i = 0; i < m; i++) {
                fprintf(f, "%#lx %zu %lu", (unsigned long) out[i].p, out[i].n, (unsigned long) out[i].seq);
                for (int j = 0; j < NF; j++) fprintf(f, " %p", out[i].f[j]);
                fputc('\n', f);
        }
        fclose(f);
        busy = 0;
        return (int) m;
}
