/* SPDX-License-Identifier: MIT */
/* client-cuda.h: libtier's use of the CUDA driver: mapping "cuda" segments, events, host registration. */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* Bytes of a CUipcEventHandle on the wire. */
#define CLIENT_CUDA_EVENT_SIZE 64

typedef struct ClientCuda ClientCuda;

/*
 * client_cuda_new() - load libcuda.so.1 (dlopen: libtier does not link it)
 * and retain the primary context of the device whose PCI bus id is @device
 * (tierd's GPU, HelloReply.vram_device; NULL or "": device 0).  -ENODEV
 * with the reason in @error when CUDA cannot be used in this process.
 */
int client_cuda_new(ClientCuda **ret, const char *device, char *error, size_t size);
ClientCuda *client_cuda_free(ClientCuda *cc);
/* The reason for the last failure of a function below. */
const char *client_cuda_error(const ClientCuda *cc);

/*
 * client_cuda_map() - import a chunk tierd exported (@fd, borrowed: the
 * caller may close it afterwards), reserve address space, map it and allow
 * access from the device.  *@ret_va is the device address of its first byte;
 * *@ret_handle the imported allocation, kept for client_cuda_view_map().
 */
int client_cuda_map(ClientCuda *cc, int fd, uint64_t size, uint64_t *ret_va, uint64_t *ret_handle);
/* Unmap a chunk and release its handle. */
void client_cuda_unmap(ClientCuda *cc, uint64_t va, uint64_t size, uint64_t handle);

/*
 * Views: a tensor that spans chunks, as one device range.  view_new
 * reserves @size (rounded up to the granularity); view_map maps @len bytes
 * (rounded up) of the chunk @handle from @offset (on the granularity) at
 * @va; view_unmap undoes one view_map; view_free releases the range.
 */
int client_cuda_view_new(ClientCuda *cc, uint64_t size, uint64_t *ret_va, uint64_t *ret_size);
int client_cuda_view_map(ClientCuda *cc, uint64_t va, uint64_t handle, uint64_t offset, uint64_t len);
void client_cuda_view_unmap(ClientCuda *cc, uint64_t va, uint64_t len);
void client_cuda_view_free(ClientCuda *cc, uint64_t va, uint64_t size);

/* cuMemHostRegister / cuMemHostUnregister of a host-tier segment mapping. */
int client_cuda_host_register(ClientCuda *cc, void *p, uint64_t size);
void client_cuda_host_unregister(ClientCuda *cc, void *p);

/* Make @stream (a CUstream / cudaStream_t; NULL: the default stream) wait for tierd's event @handle. */
int client_cuda_stream_wait(ClientCuda *cc, const uint8_t handle[CLIENT_CUDA_EVENT_SIZE], void *stream);
/* Record an interprocess event on @stream and return its handle (for Unpin.ipc_event). */
int client_cuda_record(ClientCuda *cc, void *stream, uint8_t ret[CLIENT_CUDA_EVENT_SIZE]);
