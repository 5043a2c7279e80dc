/* tpushim C ABI 1.4: caller events, buffer ready events, chunked
 * host-to-device transfers; the host_released event.
 *
 * Part of tpushim's C ABI: include "tpushim/c_api.h", which includes this
 * file where it belongs; the conventions at the top of c_api.h hold here.
 */

#ifndef TPUSHIM_C_API_EVENTS_H_
#define TPUSHIM_C_API_EVENTS_H_

#ifndef TPUSHIM_C_API_H_
#error "include tpushim/c_api.h, which includes tpushim/c_api_events.h"
#endif

/* ---- 1.4: events */
/*
 * A host→device transfer has two events: `event` (ready: the bytes are on
 * the device) and `host_released` (the caller may reuse or free its host
 * buffer). Staged transfers release the buffer once its last byte is in
 * staging, before the DMA ends; zero-copy and pinned ones with `event`.
 * host_released is never ready after `event`; it is OK when every byte
 * was read from the caller's buffer (even if the DMA then fails),
 * otherwise it carries the transfer's failure.
 *
 * Caller events (Event_Create / Event_Set) work wherever an event of the
 * system does: wait_for lists, Event_Await, Event_AddCallback. Setting one
 * twice is FAILED_PRECONDITION. Destroying its handle with Event_Destroy
 * before setting it fails it with CANCELLED (nobody can set it any more,
 * so waiters must not wait forever); so does System_Destroy.
 */

/* A pending event of `system`, set later with Event_Set.
 * FAILED_PRECONDITION while the system is being destroyed;
 * RESOURCE_EXHAUSTED when 2^24 event handles are live. */
typedef struct TpuShim_Event_Create_Args {
  size_t struct_size;
  TpuShim_System system; /* in */
  TpuShim_Event event;   /* out: destroy with Event_Destroy */
} TpuShim_Event_Create_Args;
#define TPUSHIM_EVENT_CREATE_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_Event_Create_Args, event)
typedef TpuShim_Error* TpuShim_Event_Create_Fn(TpuShim_Event_Create_Args* args);

/* Makes an event from Event_Create ready with status `code` (a
 * TpuShim_ErrorCode; 0 = OK) and `message` (may be NULL). INVALID_ARGUMENT
 * for a bad handle, an event not made by Event_Create, or a code outside
 * 0..16; FAILED_PRECONDITION when it was set already, or its system was
 * destroyed first. */
typedef struct TpuShim_Event_Set_Args {
  size_t struct_size;
  TpuShim_Event event; /* in */
  int32_t code;        /* in: 0 (OK) .. 16 */
  const char* message; /* in: may be NULL; copied */
} TpuShim_Event_Set_Args;
#define TPUSHIM_EVENT_SET_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_Event_Set_Args, message)
typedef TpuShim_Error* TpuShim_Event_Set_Fn(TpuShim_Event_Set_Args* args);

/* The buffer's ready event: ready when every write issued to it so far
 * (transfers into it, an open chunked transfer) has completed; it fails
 * with the first write to the buffer that ever failed. INVALID_ARGUMENT
 * for a bad handle. */
typedef struct TpuShim_DeviceBuffer_ReadyEvent_Args {
  size_t struct_size;
  TpuShim_System system;       /* in */
  TpuShim_DeviceBuffer buffer; /* in */
  TpuShim_Event event;         /* out: destroy with Event_Destroy */
} TpuShim_DeviceBuffer_ReadyEvent_Args;
#define TPUSHIM_DEVICEBUFFER_READYEVENT_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_DeviceBuffer_ReadyEvent_Args, event)
typedef TpuShim_Error* TpuShim_DeviceBuffer_ReadyEvent_Fn(
    TpuShim_DeviceBuffer_ReadyEvent_Args* args);

/* Opens a chunked host→device transfer into `buffer` (PJRT's
 * CreateBuffersForAsyncHostToDevice): its ready event then resolves only
 * once the chunk marked `is_last` and every chunk before it completed.
 * FAILED_PRECONDITION when one is open on the buffer already. Deallocating
 * the buffer (or destroying the system) before the last chunk fails it
 * with CANCELLED, naming the bytes no chunk covered; Transfer_AbortChunked
 * fails it with the caller's error. */
typedef struct TpuShim_Transfer_BeginChunked_Args {
  size_t struct_size;
  TpuShim_System system;       /* in */
  TpuShim_DeviceBuffer buffer; /* in */
} TpuShim_Transfer_BeginChunked_Args;
#define TPUSHIM_TRANSFER_BEGINCHUNKED_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_Transfer_BeginChunked_Args, buffer)
typedef TpuShim_Error* TpuShim_Transfer_BeginChunked_Fn(
    TpuShim_Transfer_BeginChunked_Args* args);

/* One chunk (PJRT's TransferData): `size` bytes from `src` to `dst` at
 * `dst_offset`, in the buffer's device bytes (a shaped buffer's tiled
 * image). FAILED_PRECONDITION for a chunk after the last or without
 * Transfer_BeginChunked; INVALID_ARGUMENT for a chunk past the buffer's
 * end; other errors as for Transfer_ToDevice. Nothing changes on error. */
typedef struct TpuShim_Transfer_Chunk_Args {
  size_t struct_size;
  TpuShim_System system;         /* in */
  const void* src;               /* in: host memory, `size` bytes */
  TpuShim_DeviceBuffer dst;      /* in */
  uint64_t dst_offset;           /* in */
  uint64_t size;                 /* in: bytes, >= 1 */
  int32_t is_last;               /* in: nonzero for the last chunk */
  int32_t semantics;             /* in: a TpuShim_HostBufferSemantics value */
  const TpuShim_Event* wait_for; /* in: may be NULL when num_wait_for is 0 */
  size_t num_wait_for;           /* in */
  TpuShim_Event event;           /* out: this chunk's; Event_Destroy */
  TpuShim_Event host_released;   /* out: this chunk's; Event_Destroy */
} TpuShim_Transfer_Chunk_Args;
#define TPUSHIM_TRANSFER_CHUNK_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_Transfer_Chunk_Args, host_released)
typedef TpuShim_Error* TpuShim_Transfer_Chunk_Fn(
    TpuShim_Transfer_Chunk_Args* args);

/* Gives up the open chunked transfer into `buffer` (PJRT's
 * SetBufferError): the buffer's ready event fails with `code` (a
 * TpuShim_ErrorCode, 1..16; ABORTED or CANCELLED suit) and `message`,
 * followed by the bytes no chunk covered ("3072 of the buffer's 4096 bytes
 * never came (1 chunk gave 1024 bytes)"), instead of waiting for a last
 * chunk that will not come; so does every later ready event of the buffer.
 * Chunks already queued still run; later chunks are FAILED_PRECONDITION
 * until another Transfer_BeginChunked. INVALID_ARGUMENT for a bad handle
 * or a code outside 1..16; FAILED_PRECONDITION when no chunked transfer
 * is open on the buffer. */
typedef struct TpuShim_Transfer_AbortChunked_Args {
  size_t struct_size;
  TpuShim_System system;       /* in */
  TpuShim_DeviceBuffer buffer; /* in */
  int32_t code;                /* in: 1 .. 16 */
  const char* message;         /* in: may be NULL; copied */
} TpuShim_Transfer_AbortChunked_Args;
#define TPUSHIM_TRANSFER_ABORTCHUNKED_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_Transfer_AbortChunked_Args, message)
typedef TpuShim_Error* TpuShim_Transfer_AbortChunked_Fn(
    TpuShim_Transfer_AbortChunked_Args* args);

#endif /* TPUSHIM_C_API_EVENTS_H_ */
