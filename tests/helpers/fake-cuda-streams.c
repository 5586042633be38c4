/* SPDX-License-Identifier: MIT */
/* fake-cuda-streams.c: the fake CUDA driver's streams and events, interprocess ones too. */

/*
 * Theory of operation: streams run their work in order, at once while
 * nothing holds them up (copies are memcpy, memset is memset).  Each stream
 * has a queue: cuStreamWaitEvent() on an event still pending returns at
 * once, like the driver's, and leaves the wait at the stream's tail, so what
 * is queued after it (copies, records, host functions) runs only once that
 * record of the event has completed.  An event is pending while a test holds
 * it (fake_cuda_hold: every event recorded from then on; fake_cuda_hold_event:
 * that one event) or while its record still waits in a stream's queue.
 * Whatever may let queued work run (a release, a record, a new op) runs every
 * stream as far as it goes (streams_run()) and wakes whoever waits.  The NULL
 * stream is a stream like the others (no legacy synchronization).
 * Interprocess event handles name the event by pid and serial number;
 * opening one in the process that made it gives an event that follows the
 * original, in any other process one that is complete.  State and counts are
 * fake-cuda.c's, behind its one mutex (fake-cuda-private.h).
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/helpers/fake-cuda-private.h"

#define FAKE_IPC_MAGIC "fakecuda-ipcev"

typedef struct FakeEvent {
        unsigned flags;
        uint64_t serial;        /* of this event, or of the one it follows */
        uint64_t epoch;         /* pending while > released_epoch */
        uint64_t recorded;      /* records of it so far */
        uint64_t reached;       /* the latest of them its stream has run */
        bool held;              /* fake_cuda_hold_event() */
        struct FakeEvent *next; /* all events of this process */
        bool alias;             /* opened from a handle of this process */
} FakeEvent;

typedef enum FakeOpKind {
        FAKE_OP_COPY,           /* memcpy(dst, src, n) */
        FAKE_OP_SET,            /* memset(dst, value, n) */
        FAKE_OP_RECORD,         /* record number @gen of @event is reached */
        FAKE_OP_WAIT,           /* until record number @gen of @event has completed */
        FAKE_OP_HOST,           /* fn(userdata), without the lock */
} FakeOpKind;

typedef struct FakeOp {
        FakeOpKind kind;
        void *dst;
        const void *src;
        size_t n;
        unsigned char value;
        FakeEvent *event;       /* NULL: destroyed meanwhile (a wait then holds up nothing) */
        uint64_t gen;
        CUhostFn fn;
        void *userdata;
        struct FakeOp *next;
} FakeOp;

typedef struct FakeStream {
        FakeOp *head, **tail;   /* queued, in order */
        bool running;           /* its head, a host function, runs without the lock */
        bool destroyed;         /* freed once its queue is empty, as the driver does */
        struct FakeStream *next;        /* all streams */
} FakeStream;

typedef struct FakeIpcHandle {
        char magic[16];
        int32_t pid;
        int32_t pad;
        uint64_t serial;
} FakeIpcHandle;

static pthread_cond_t released = PTHREAD_COND_INITIALIZER;     /* broadcast when work may have run */
static FakeEvent *events;
static FakeStream legacy_stream = { .tail = &legacy_stream.head };     /* the NULL stream */
static FakeStream *streams = &legacy_stream;                            /* all, the NULL stream last */
static uint64_t next_serial = 1;
static bool holding;
static uint64_t hold_epoch, released_epoch;

FAKE_API void fake_cuda_hold(void);
FAKE_API void fake_cuda_release(void);
FAKE_API void fake_cuda_hold_event(void *event);
FAKE_API void fake_cuda_release_event(void *event);
static void streams_run(void);

FAKE_API void fake_cuda_hold(void) {
        pthread_mutex_lock(&fake_lock);
        holding = true;
        hold_epoch = released_epoch + 1;
        pthread_mutex_unlock(&fake_lock);
}

FAKE_API void fake_cuda_release(void) {
        pthread_mutex_lock(&fake_lock);
        holding = false;
        released_epoch = hold_epoch;
        streams_run();
        pthread_mutex_unlock(&fake_lock);
}

FAKE_API void fake_cuda_hold_event(void *event) {
        pthread_mutex_lock(&fake_lock);
        ((FakeEvent *) event)->held = true;
        pthread_mutex_unlock(&fake_lock);
}

FAKE_API void fake_cuda_release_event(void *event) {
        pthread_mutex_lock(&fake_lock);
        ((FakeEvent *) event)->held = false;
        streams_run();
        pthread_mutex_unlock(&fake_lock);
}

/* Called with the lock held. */
static FakeEvent *event_by_serial(uint64_t serial) {
        for (FakeEvent *e = events; e; e = e->next)
                if (!e->alias && e->serial == serial)
                        return e;
        return NULL;
}

/* Called with the lock held: the event whose state @e shows (itself, or the one it follows), or NULL. */
static FakeEvent *event_origin(FakeEvent *e) {
        return e->alias ? event_by_serial(e->serial) : e;
}

/* Called with the lock held: has record number @gen of @e completed (and is it not held)? */
static bool record_done(const FakeEvent *e, uint64_t gen) {
        return e->epoch <= released_epoch && !e->held && e->reached >= gen;
}

/* Called with the lock held: is @e pending, as cuEventQuery() tells? */
static bool event_pending(FakeEvent *e) {
        e = event_origin(e);
        return e && !record_done(e, e->recorded);
}

static FakeStream *stream_of(CUstream stream) {
        return stream ? (FakeStream *) stream : &legacy_stream;
}

static bool op_ready(const FakeOp *op) {
        return op->kind != FAKE_OP_WAIT || !op->event || record_done(op->event, op->gen);
}

/* Called with the lock held: run every stream as far as it goes, then wake whoever waits on one. */
static void streams_run(void) {
        bool again;

        do {
                again = false;
                for (FakeStream *t = streams; t && !again; t = t->next)
                        while (t->head && !t->running && op_ready(t->head) && !again) {
                                FakeOp *op = t->head;

                                t->head = op->next;
                                if (!t->head)
                                        t->tail = &t->head;
                                switch (op->kind) {
                                case FAKE_OP_COPY:
                                        memcpy(op->dst, op->src, op->n);
                                        break;
                                case FAKE_OP_SET:
                                        memset(op->dst, op->value, op->n);
                                        break;
                                case FAKE_OP_RECORD:
                                        if (op->event && op->event->reached < op->gen)
                                                op->event->reached = op->gen;
                                        again = true;   /* a stream seen already may wait for it */
                                        break;
                                case FAKE_OP_WAIT:
                                        break;
                                case FAKE_OP_HOST:
                                        /* the stream's next work waits for it: nothing else runs it meanwhile */
                                        t->running = true;
                                        pthread_mutex_unlock(&fake_lock);
                                        op->fn(op->userdata);
                                        pthread_mutex_lock(&fake_lock);
                                        t->running = false;
                                        again = true;   /* the lists may have changed meanwhile */
                                        break;
                                }
                                free(op);
                        }
        } while (again);
        for (FakeStream **p = &streams; *p;) {
                FakeStream *t = *p;

                if (t->destroyed && !t->head && !t->running) {
                        *p = t->next;
                        free(t);
                } else
                        p = &t->next;
        }
        pthread_cond_broadcast(&released);
}

/* Called with the lock held: queue @op on @stream, then run what can run. */
static CUresult submit(CUstream stream, FakeOp op) {
        FakeStream *t = stream_of(stream);
        FakeOp *q;

        if (t->destroyed)
                return CUDA_ERROR_INVALID_HANDLE;
        q = malloc(sizeof(*q));
        if (!q)
                return CUDA_ERROR_OUT_OF_MEMORY;
        *q = op;
        q->next = NULL;
        *t->tail = q;
        t->tail = &q->next;
        streams_run();
        return CUDA_SUCCESS;
}

CUresult fake_submit_copy(CUstream stream, void *dst, const void *src, size_t n) {
        return submit(stream, (FakeOp) { .kind = FAKE_OP_COPY, .dst = dst, .src = src, .n = n });
}

CUresult fake_submit_set(CUstream stream, void *dst, unsigned char value, size_t n) {
        return submit(stream, (FakeOp) { .kind = FAKE_OP_SET, .dst = dst, .value = value, .n = n });
}

/* Called with the lock held: @e goes; queued records of it are dropped, waits for it hold up nothing. */
static void ops_forget_event(FakeEvent *e) {
        for (FakeStream *t = streams; t; t = t->next)
                for (FakeOp *op = t->head; op; op = op->next)
                        if (op->event == e)
                                op->event = NULL;
}

CUresult CUDAAPI cuStreamCreate(CUstream *stream, unsigned int flags) {
        FakeStream *s;

        ENTER("cuStreamCreate");
        s = calloc(1, sizeof(*s));
        if (!s)
                LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
        s->tail = &s->head;
        s->next = streams;
        streams = s;
        fake_counts.streams++;
        *stream = (CUstream) s;
        LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuStreamDestroy(CUstream stream) {
        FakeStream *t = stream_of(stream);

        ENTER("cuStreamDestroy");
        if (t == &legacy_stream || t->destroyed)
                LEAVE(CUDA_ERROR_INVALID_HANDLE);
        /* as the driver: returns at once, the work queued on it still runs */
        t->destroyed = true;
        fake_counts.streams--;
        streams_run();
        LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuStreamSynchronize(CUstream stream) {
        FakeStream *t = stream_of(stream);

        ENTER("cuStreamSynchronize");
        while (t->head || t->running)
                pthread_cond_wait(&released, &fake_lock);
        LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuLaunchHostFunc(CUstream stream, CUhostFn fn, void *userdata) {
        ENTER("cuLaunchHostFunc");
        LEAVE(submit(stream, (FakeOp) { .kind = FAKE_OP_HOST, .fn = fn, .userdata = userdata }));
}

static CUresult event_new(unsigned flags, uint64_t serial, bool alias, CUevent *ret) {
        FakeEvent *e = calloc(1, sizeof(*e));

        if (!e)
                return CUDA_ERROR_OUT_OF_MEMORY;
        e->flags = flags;
        e->serial = serial;
        e->alias = alias;
        e->next = events;
        events = e;
        fake_counts.events++;
        *ret = (CUevent) e;
        return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventCreate(CUevent *event, unsigned int flags) {
        CUresult r;

        ENTER("cuEventCreate");
        if ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING))
                LEAVE(CUDA_ERROR_INVALID_VALUE);
        r = event_new(flags, next_serial++, false, event);
        LEAVE(r);
}

CUresult CUDAAPI cuEventDestroy(CUevent event) {
        ENTER("cuEventDestroy");
        for (FakeEvent **p = &events; *p; p = &(*p)->next)
                if (*p == (FakeEvent *) event) {
                        *p = (*p)->next;
                        ops_forget_event((FakeEvent *) event);
                        free(event);
                        fake_counts.events--;
                        streams_run();
                        LEAVE(CUDA_SUCCESS);
                }
        LEAVE(CUDA_ERROR_INVALID_HANDLE);
}

CUresult CUDAAPI cuEventRecord(CUevent event, CUstream stream) {
        FakeEvent *e = (FakeEvent *) event;

        ENTER("cuEventRecord");
        if (e->alias)
                LEAVE(CUDA_ERROR_INVALID_HANDLE);       /* like the driver: only the owner records */
        e->epoch = holding ? hold_epoch : 0;
        e->recorded++;
        LEAVE(submit(stream, (FakeOp) { .kind = FAKE_OP_RECORD, .event = e, .gen = e->recorded }));
}

CUresult CUDAAPI cuEventQuery(CUevent event) {
        ENTER("cuEventQuery");
        LEAVE(event_pending((FakeEvent *) event) ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS);
}

CUresult CUDAAPI cuEventSynchronize(CUevent event) {
        ENTER("cuEventSynchronize");
        while (event_pending((FakeEvent *) event))
                pthread_cond_wait(&released, &fake_lock);
        LEAVE(CUDA_SUCCESS);
}

/* As the driver: returns at once; what @stream runs after it waits for the event's latest record. */
CUresult CUDAAPI cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
        FakeEvent *e;
        CUresult r = CUDA_SUCCESS;

        ENTER("cuStreamWaitEvent");
        e = event_origin((FakeEvent *) event);
        if (e)
                r = submit(stream, (FakeOp) { .kind = FAKE_OP_WAIT, .event = e, .gen = e->recorded });
        if (r == CUDA_SUCCESS)
                fake_counts.stream_waits++;
        LEAVE(r);
}

CUresult CUDAAPI cuIpcGetEventHandle(CUipcEventHandle *handle, CUevent event) {
        FakeEvent *e = (FakeEvent *) event;
        FakeIpcHandle h = { .magic = FAKE_IPC_MAGIC };

        ENTER("cuIpcGetEventHandle");
        if (!(e->flags & CU_EVENT_INTERPROCESS) || e->alias)
                LEAVE(CUDA_ERROR_INVALID_VALUE);
        h.pid = (int32_t) getpid();
        h.serial = e->serial;
        memset(handle, 0, sizeof(*handle));
        memcpy(handle->reserved, &h, sizeof(h));
        fake_counts.ipc_gets++;
        LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuIpcOpenEventHandle(CUevent *event, CUipcEventHandle handle) {
        FakeIpcHandle h;
        CUresult r;

        ENTER("cuIpcOpenEventHandle");
        memcpy(&h, handle.reserved, sizeof(h));
        if (memcmp(h.magic, FAKE_IPC_MAGIC, sizeof(FAKE_IPC_MAGIC)) != 0)
                LEAVE(CUDA_ERROR_INVALID_VALUE);
        /* an event of another process is complete by the time the fake could see it */
        if (h.pid == (int32_t) getpid())
                r = event_new(CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING, h.serial, true, event);
        else
                r = event_new(CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING, 0, false, event);
        if (r == CUDA_SUCCESS)
                fake_counts.ipc_opens++;
        LEAVE(r);
}
