/* SPDX-License-Identifier: MIT */
/* fake-cuda-streams.c: the fake CUDA driver's streams and events, interprocess ones too. */

/*
 * Theory of operation: streams run everything at once (copies are memcpy,
 * memset is memset).  Events complete when recorded unless a test holds
 * them (fake_cuda_hold) to see what waits for them.  Interprocess event
 * handles name the event by pid and serial number; opening one in the
 * process that made it gives an event that follows the original, in any
 * other process one that is complete.  State and counts are fake-cuda.c's,
 * behind its one mutex (fake-cuda-private.h).
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
        struct FakeEvent *next; /* all events of this process */
        bool alias;             /* opened from a handle of this process */
} FakeEvent;

typedef struct FakeStream {
        int unused;
} FakeStream;

typedef struct FakeIpcHandle {
        char magic[16];
        int32_t pid;
        int32_t pad;
        uint64_t serial;
} FakeIpcHandle;

static pthread_cond_t released = PTHREAD_COND_INITIALIZER;
static FakeEvent *events;
static uint64_t next_serial = 1;
static bool holding;
static uint64_t hold_epoch, released_epoch;

FAKE_API void fake_cuda_hold(void);
FAKE_API void fake_cuda_release(void);

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
        pthread_cond_broadcast(&released);
        pthread_mutex_unlock(&fake_lock);
}

CUresult CUDAAPI cuStreamCreate(CUstream *stream, unsigned int flags) {
        FakeStream *s;

        ENTER("cuStreamCreate");
        s = calloc(1, sizeof(*s));
        if (!s)
                LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
        fake_counts.streams++;
        *stream = (CUstream) s;
        LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuStreamDestroy(CUstream stream) {
        ENTER("cuStreamDestroy");
        free(stream);
        fake_counts.streams--;
        LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuStreamSynchronize(CUstream stream) {
        ENTER("cuStreamSynchronize");
        LEAVE(CUDA_SUCCESS);
}

CUresult CUDAAPI cuLaunchHostFunc(CUstream stream, CUhostFn fn, void *userdata) {
        ENTER("cuLaunchHostFunc");
        pthread_mutex_unlock(&fake_lock);
        fn(userdata);
        return CUDA_SUCCESS;
}

/* Called with the lock held. */
static FakeEvent *event_by_serial(uint64_t serial) {
        for (FakeEvent *e = events; e; e = e->next)
                if (!e->alias && e->serial == serial)
                        return e;
        return NULL;
}

/* Called with the lock held: the event whose state @e shows (itself, or the one it follows). */
static bool event_pending(const FakeEvent *e) {
        if (e->alias) {
                e = event_by_serial(e->serial);
                if (!e)
                        return false;
        }
        return e->epoch > released_epoch;
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
                        free(event);
                        fake_counts.events--;
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
        LEAVE(CUDA_SUCCESS);
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

CUresult CUDAAPI cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
        ENTER("cuStreamWaitEvent");
        /* the fake runs work at once: what a stream waits for must already be there */
        while (event_pending((FakeEvent *) event))
                pthread_cond_wait(&released, &fake_lock);
        fake_counts.stream_waits++;
        LEAVE(CUDA_SUCCESS);
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
