/* tpushim's C ABI: one versioned function table, returned by
 * TpuShim_GetApi(), over the C++ API of tpushim/system.h.
 *
 * Pure C99 (usable from C++), no other tpushim or abseil header needed.
 *
 * Conventions (they hold for every function unless its comment says
 * otherwise):
 *
 *  - Errors. Every function of the table except the Error_* ones returns a
 *    TpuShim_Error*: NULL means success; otherwise the caller owns the
 *    error and frees it with Error_Destroy. Error_Code gives abseil's
 *    absl::StatusCode number (TpuShim_ErrorCode below), Error_Message the
 *    text. Messages are for people; the code is for programs.
 *
 *  - Argument structs. Every function other than the Error_* ones takes a
 *    single pointer to its args struct, whose first member is
 *    `size_t struct_size`. Set it to TPUSHIM_<NAME>_ARGS_STRUCT_SIZE (or
 *    sizeof) and zero the struct before filling it in, e.g.
 *
 *        TpuShim_Event_Await_Args args = {0};
 *        args.struct_size = TPUSHIM_EVENT_AWAIT_ARGS_STRUCT_SIZE;
 *        args.event = event;
 *        TpuShim_Error* error = api->Event_Await(&args);
 *
 *    Fields marked "in" are read, fields marked "out" are written, and
 *    only on success; out fields are never read.
 *
 *  - Versioning (the struct_size rule). TPUSHIM_API_MAJOR changes only
 *    with an incompatible change; TPUSHIM_API_MINOR grows when fields are
 *    appended to structs or functions appended to the table. Nothing is
 *    ever reordered or removed within a major version. So:
 *      * struct_size smaller than the 1.0 size of that struct (the
 *        TPUSHIM_*_STRUCT_SIZE macro) is INVALID_ARGUMENT, as is a NULL
 *        args pointer;
 *      * struct_size from 1.0 up to the size this library knows: fields at
 *        or beyond struct_size are not read (in) or written (out); in
 *        fields take their documented defaults. An older caller, built
 *        against an older header, keeps working;
 *      * struct_size larger than the size this library knows (a caller
 *        built against a newer minor version) is accepted: the extra
 *        trailing fields are ignored, in fields keeping the 1.0 behaviour
 *        and out fields left untouched. Such a caller checks api_minor
 *        (or TpuShim_Api.struct_size) to learn whether a field it relies
 *        on is honoured.
 *    The same rule holds for TpuShim_Stats and for the table itself: a
 *    function appended in a later minor version is present only when
 *    `TpuShim_Api.struct_size` covers it (TPUSHIM_API_HAS).
 *
 *  - Handles. TpuShim_System, TpuShim_HostBuffer, TpuShim_DeviceBuffer and
 *    TpuShim_Event are small structs holding an id, passed by value; id 0
 *    is "no handle". Ids carry their kind and a generation, and the
 *    library keeps tables of live ids: a handle that is stale (freed,
 *    destroyed, or of a destroyed system), doubly freed, of another kind,
 *    of another system where a system is named, or simply made up yields
 *    INVALID_ARGUMENT naming the handle kind: never undefined behaviour.
 *
 *  - Ownership. Handles returned in out fields belong to the caller:
 *    systems are destroyed with System_Destroy, host buffers freed with
 *    HostBuffer_Free, device buffers with DeviceBuffer_Deallocate (except
 *    the one MemoryBuffer_GetInfo lends, which goes with its memory
 *    buffer), events with Event_Destroy. Destroying a system also invalidates every buffer
 *    handle of that system; its event handles stay valid (and are ready).
 *
 *  - Pointers. A NULL pointer where one is required is INVALID_ARGUMENT.
 *    Pointers that are not NULL must point to memory valid for the stated
 *    size; that the library cannot check.
 *
 * Thread-safety: every function may be called from any thread, at any
 * time, concurrently with any other, including from event callbacks
 * (except System_Destroy, of any system; see there).
 *
 * fork(): a child inherits the handles but not the system. The region,
 * the bounce pool and the devices' memory are not inherited
 * (MADV_DONTFORK): touching an inherited host buffer in the child raises
 * SIGSEGV. Calls that allocate, transfer, deallocate or wait on an
 * inherited system's handles return FAILED_PRECONDITION naming both
 * processes (device queries answer from the copy), and System_Destroy in
 * the child returns at once without touching the parent's system. A child
 * that needs the runtime creates its own system.
 *
 * Usage:
 *
 *   const TpuShim_Api* api = TpuShim_GetApi();
 *   TpuShim_Option options[] = {{"TPU_PREMAPPED_BUFFER_SIZE", "67108864"}};
 *   TpuShim_System_Create_Args create = {0};
 *   create.struct_size = TPUSHIM_SYSTEM_CREATE_ARGS_STRUCT_SIZE;
 *   create.options = options;
 *   create.num_options = 1;
 *   TpuShim_Error* error = api->System_Create(&create);
 *   if (error != NULL) {
 *     fprintf(stderr, "%d %s\n", api->Error_Code(error),
 *             api->Error_Message(error));
 *     api->Error_Destroy(error);
 *   }
 *   ... create.system ...
 */

#ifndef TPUSHIM_C_API_H_
#define TPUSHIM_C_API_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tpushim/export.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TPUSHIM_API_MAJOR 1
#define TPUSHIM_API_MINOR 4

/* The size of `type` up to and including `last_field`: a struct's size at
 * the version whose last field that was. */
#define TPUSHIM_STRUCT_SIZE(type, last_field) \
  (offsetof(type, last_field) + sizeof(((type*)0)->last_field))

/* ---- Errors */

/* Opaque. NULL means OK. */
typedef struct TpuShim_Error TpuShim_Error;

/* Error_Code's values: absl::StatusCode's numbers. */
typedef enum TpuShim_ErrorCode {
  TPUSHIM_CODE_OK = 0,
  TPUSHIM_CODE_CANCELLED = 1, /* an operation cancelled by System_Destroy */
  TPUSHIM_CODE_UNKNOWN = 2,
  TPUSHIM_CODE_INVALID_ARGUMENT = 3, /* bad args, value or handle */
  TPUSHIM_CODE_DEADLINE_EXCEEDED = 4,
  TPUSHIM_CODE_NOT_FOUND = 5,
  TPUSHIM_CODE_ALREADY_EXISTS = 6,
  TPUSHIM_CODE_PERMISSION_DENIED = 7,
  TPUSHIM_CODE_RESOURCE_EXHAUSTED = 8,  /* region or device memory full */
  TPUSHIM_CODE_FAILED_PRECONDITION = 9, /* e.g. the region is off */
  TPUSHIM_CODE_ABORTED = 10,
  TPUSHIM_CODE_OUT_OF_RANGE = 11,
  TPUSHIM_CODE_UNIMPLEMENTED = 12,
  TPUSHIM_CODE_INTERNAL = 13,
  TPUSHIM_CODE_UNAVAILABLE = 14, /* a device that is gone */
  TPUSHIM_CODE_DATA_LOSS = 15,
  TPUSHIM_CODE_UNAUTHENTICATED = 16
} TpuShim_ErrorCode;

/* Frees `error`. NULL is fine (nothing happens). */
typedef void TpuShim_Error_Destroy_Fn(TpuShim_Error* error);
/* The error's absl::StatusCode number (a TpuShim_ErrorCode value);
 * TPUSHIM_CODE_OK for NULL. */
typedef int TpuShim_Error_Code_Fn(const TpuShim_Error* error);
/* The error's message, NUL-terminated, owned by the error and valid until
 * it is destroyed; "" for NULL. */
typedef const char* TpuShim_Error_Message_Fn(const TpuShim_Error* error);

/* ---- Handles */

/* A running tpushim system: premapped region, devices, transfer engine. */
typedef struct TpuShim_System {
  uint64_t id;
} TpuShim_System;

/* A buffer of the system's premapped region ("pinned host" memory that
 * devices DMA to and from directly: the zero-copy path). */
typedef struct TpuShim_HostBuffer {
  uint64_t id;
} TpuShim_HostBuffer;
/* 1.4: a registration of the caller's host memory (HostMemory_Register). */
typedef struct TpuShim_HostRegistration {
  uint64_t id;
} TpuShim_HostRegistration;

/* A buffer in one device's memory. */
typedef struct TpuShim_DeviceBuffer {
  uint64_t id;
} TpuShim_DeviceBuffer;

/* The completion of one asynchronous operation (a transfer or a
 * deallocation). It becomes ready exactly once, with a status (OK or an
 * error); it can be polled, awaited (with or without a timeout) and carry
 * callbacks. An event does not belong to its system: it stays valid, and
 * ready, after the system is destroyed. */
typedef struct TpuShim_Event {
  uint64_t id;
} TpuShim_Event;

/* ---- Enums */

/* When the caller may reuse its host buffer, from most to least
 * restrictive for the library (PJRT's HostBufferSemantics). 0, the value a
 * zeroed args struct holds, is the safest for the caller. Args structs
 * hold it as an int32_t (an enum's size is the compiler's choice); any
 * other value is INVALID_ARGUMENT. */
typedef enum TpuShim_HostBufferSemantics {
  /* The library is done with the host buffer when the call returns: a
   * staged host->device transfer returns once its bytes are in staging
   * buffers; every other transfer returns once it has completed (which,
   * with wait_for, includes waiting for those events). The caller may then
   * reuse or free the buffer at once. */
  TPUSHIM_HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL = 0,
  /* The caller keeps the buffer valid (and, host->device, unchanged;
   * device->host, untouched) until the transfer's event is ready. The call
   * returns at once; the device may DMA straight from/to the buffer
   * later. */
  TPUSHIM_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES = 1,
  /* 1.4: PJRT's zero-copy semantics, for MemoryBuffer_FromHost: the buffer
   * may alias the caller's bytes (immutable: the caller keeps them valid
   * and unchanged until the buffer is freed; mutable: what lands in the
   * buffer lands in them). Given to a transfer they mean
   * TPUSHIM_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES. */
  TPUSHIM_HOST_BUFFER_IMMUTABLE_ZERO_COPY = 2,
  TPUSHIM_HOST_BUFFER_MUTABLE_ZERO_COPY = 3
} TpuShim_HostBufferSemantics;

/* Indexes of TpuShim_Stats' per-direction, per-path arrays. */
typedef enum TpuShim_Direction {
  TPUSHIM_DIRECTION_HOST_TO_DEVICE = 0,
  TPUSHIM_DIRECTION_DEVICE_TO_HOST = 1
} TpuShim_Direction;
#define TPUSHIM_HOST_DIRECTION_COUNT 2

/* The path a host<->device transfer took (see docs/transfers.md). */
typedef enum TpuShim_TransferPath {
  TPUSHIM_PATH_ZERO_COPY = 0, /* in the premapped region or a registration */
  TPUSHIM_PATH_STAGED = 1,    /* through transient premapped buffers */
  TPUSHIM_PATH_PINNED = 2     /* the caller's pages pinned for the transfer */
} TpuShim_TransferPath;
#define TPUSHIM_TRANSFER_PATH_COUNT 3

/* ---- System */

/* One setting, named by its environment variable, with its value as text,
 * parsed exactly as the variable would be, e.g.
 * {"TPU_PREMAPPED_BUFFER_SIZE", "67108864"}, {"TPUSHIM_DEVICE",
 * "sim://?devices=2"}, {"TPU_LOG_DIR", "disabled"}. Array element: its
 * layout is fixed for the whole major version. */
typedef struct TpuShim_Option {
  const char* name;  /* e.g. "TPUSHIM_PREFAULT_THREADS"; case-sensitive */
  const char* value; /* e.g. "1" */
} TpuShim_Option;

/* Brings a system up (tpushim::System::Create): options -> logging ->
 * premapped region -> devices -> transfer engine, logging libtpu's start-up
 * lines.
 *
 * The options win over LIBTPU_INIT_ARGS and the environment, which still
 * apply to every setting the options leave out (and are still validated).
 * A name given twice: the last one wins.
 *
 * Errors: INVALID_ARGUMENT for an unknown option name (the message names
 * it and lists the known ones), a NULL name or value, or a malformed value
 * (the message names the variable and the value); RESOURCE_EXHAUSTED when
 * the host cannot hold the region; the failing OS call's status otherwise.
 * Nothing is left mapped, pinned, open or running after an error. */
/* How far System_Create has come (see tpushim::StartupProgress): phase 0
 * while the premapped region is populated (done_bytes of total_bytes),
 * then once phase 1, start-up finished (successfully or not). */
typedef struct TpuShim_StartupProgress {
  size_t struct_size; /* of this struct as the library filled it */
  int32_t phase;      /* 0 premapping, 1 done */
  uint64_t done_bytes;
  uint64_t total_bytes; /* the region's size; 0 when it is off */
  double elapsed_seconds;
} TpuShim_StartupProgress;

/* Called from a library thread during System_Create, never concurrently,
 * at most about 20 times a second and once with every byte done, then
 * once with phase 1, the last call, before System_Create returns. With
 * TPUSHIM_PREMAP=background System_Create returns while the region is
 * still being premapped: that last phase 1 call then has done_bytes <
 * total_bytes (the bytes premapped so far), and the callback is never
 * called again: `progress_user_data` may point into the caller's stack
 * frame.
 *
 * 1.4: with `progress_after_create` set, the calls go on after
 * System_Create returned instead, from the premapping thread, up to phase
 * 1 when premapping ends (the whole region, done_bytes == total_bytes), or
 * fails, or is stopped by System_Destroy (which makes that call before it
 * returns); done_bytes < total_bytes in it says the region is not all
 * premapped. `progress_user_data` must then stay valid until that call.
 *
 * `progress` is valid only during the call. It must return quickly and
 * not call into the library. */
typedef void TpuShim_StartupProgress_Fn(const TpuShim_StartupProgress* progress,
                                        void* user_data);

typedef struct TpuShim_System_Create_Args {
  size_t struct_size;
  const TpuShim_Option* options; /* in: may be NULL when num_options is 0 */
  size_t num_options;            /* in */
  TpuShim_System system;         /* out: destroy with System_Destroy */
  /* 1.1: in, may be NULL: start-up progress, with `progress_user_data`. */
  TpuShim_StartupProgress_Fn* progress;
  void* progress_user_data;
  /* 1.4: in, 0 (the default, and what a caller whose struct ends before it
   * gets): `progress` is called during System_Create only. Not 0: with
   * TPUSHIM_PREMAP=background it goes on after System_Create returns,
   * until premapping ends (see TpuShim_StartupProgress_Fn). */
  int32_t progress_after_create;
} TpuShim_System_Create_Args;
#define TPUSHIM_SYSTEM_CREATE_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_System_Create_Args, system)
typedef TpuShim_Error* TpuShim_System_Create_Fn(
    TpuShim_System_Create_Args* args);

/* Destroys a system: stops premapping its region if that goes on behind
 * the caller (a HostBuffer_Allocate waiting for it returns CANCELLED),
 * waits for calls on it running in other threads to return, frees its
 * host buffers (their memory is unmapped: `data` pointers dangle),
 * cancels operations that have not started (their events become ready
 * with CANCELLED), lets started ones finish, runs every pending callback
 * and releases every device buffer and the region.
 * Every host and device buffer handle of the system, and the system
 * handle, are stale afterwards (calls racing the destroy on them get
 * INVALID_ARGUMENT); its events stay valid and are ready. When it returns,
 * every callback of the system has run. Destroy every system before the
 * process exits: one still alive then is not torn down.
 *
 * Errors: INVALID_ARGUMENT for a bad system handle (a second destroy
 * included); FAILED_PRECONDITION when called from an event callback
 * running on the callback thread of any system (this one or another), in
 * which case nothing is destroyed: destroying a system waits for its
 * callbacks, so from its own callback it would wait for itself, and two
 * systems destroying each other from their callbacks would wait for each
 * other forever. Destroy systems from a thread of your own (one the
 * callback signals, say). A callback run at once by Event_AddCallback
 * (its event was ready) runs on the caller's thread, and counts as a
 * callback only if that thread is a callback thread. */
typedef struct TpuShim_System_Destroy_Args {
  size_t struct_size;
  TpuShim_System system; /* in */
} TpuShim_System_Destroy_Args;
#define TPUSHIM_SYSTEM_DESTROY_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_System_Destroy_Args, system)
typedef TpuShim_Error* TpuShim_System_Destroy_Fn(
    TpuShim_System_Destroy_Args* args);

/* The number of devices (N >= 1; they are numbered 0..N-1). */
typedef struct TpuShim_System_GetDeviceCount_Args {
  size_t struct_size;
  TpuShim_System system; /* in */
  int device_count;      /* out */
} TpuShim_System_GetDeviceCount_Args;
#define TPUSHIM_SYSTEM_GETDEVICECOUNT_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_System_GetDeviceCount_Args, device_count)
typedef TpuShim_Error* TpuShim_System_GetDeviceCount_Fn(
    TpuShim_System_GetDeviceCount_Args* args);

/* What device `device` is. INVALID_ARGUMENT when `device` is not in
 * [0, device count). */
typedef struct TpuShim_System_GetDeviceInfo_Args {
  size_t struct_size;
  TpuShim_System system; /* in */
  int device;            /* in */
  /* out: "sim:0"; NUL-terminated, owned by the system, valid until the
   * system is destroyed. */
  const char* name;
  /* out: "sim"; as `name`. */
  const char* backend;
  uint64_t hbm_bytes; /* out: device memory */
  int dma_engines;    /* out: per direction */
  int numa_node;      /* out: the device's NUMA node, or -1 when unknown */
  double link_gbps;   /* out: 0 = unthrottled */
  double latency_us;  /* out */
} TpuShim_System_GetDeviceInfo_Args;
#define TPUSHIM_SYSTEM_GETDEVICEINFO_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_System_GetDeviceInfo_Args, latency_us)
typedef TpuShim_Error* TpuShim_System_GetDeviceInfo_Fn(
    TpuShim_System_GetDeviceInfo_Args* args);

/* A snapshot of a system's counters, size-versioned like an args struct:
 * the caller sets struct_size (at least TPUSHIM_STATS_STRUCT_SIZE) and the
 * library fills the fields that lie within it. Counters are cumulative
 * since the system was created unless marked "now". */
typedef struct TpuShim_Stats {
  size_t struct_size;
  /* The premapped region (all 0 when it is off). */
  int32_t region_enabled; /* 1 when TPU_PREMAPPED_BUFFER_SIZE > 0 */
  int32_t region_locked;  /* 1 when mlock succeeded */
  uint64_t region_capacity_bytes;
  uint64_t region_threshold_bytes;
  uint64_t region_bytes_in_use; /* now: host buffers and staging */
  uint64_t region_peak_bytes_in_use;
  uint64_t region_free_bytes;         /* now */
  uint64_t region_largest_free_block; /* now */
  uint64_t region_live_allocations;   /* now */
  uint64_t region_allocations;
  uint64_t region_frees;
  uint64_t region_failures; /* RESOURCE_EXHAUSTED answers */
  /* Host transfers by [TpuShim_Direction][TpuShim_TransferPath]: completed
   * (successfully or not), bytes of the successful ones, failed ones. */
  uint64_t transfers[TPUSHIM_HOST_DIRECTION_COUNT][TPUSHIM_TRANSFER_PATH_COUNT];
  uint64_t transfer_bytes[TPUSHIM_HOST_DIRECTION_COUNT]
                         [TPUSHIM_TRANSFER_PATH_COUNT];
  uint64_t transfer_failures[TPUSHIM_HOST_DIRECTION_COUNT]
                            [TPUSHIM_TRANSFER_PATH_COUNT];
  uint64_t device_to_device_transfers;
  uint64_t device_to_device_bytes;
  uint64_t device_to_device_failures;
  /* Staging. */
  uint64_t staging_waits;           /* transfers that waited for room */
  int64_t staging_wait_ns;          /* total time they waited */
  uint64_t staging_bytes_in_flight; /* now */
  uint64_t peak_staging_bytes;
  /* Pinned fallbacks, by reason. */
  uint64_t pinned_over_threshold;
  uint64_t pinned_region_off;
  uint64_t pinned_staging_timeout;
  uint64_t pinned_bytes_now; /* now: caller pages pinned */
  /* Device memory and events. */
  uint64_t device_buffers_live; /* now */
  uint64_t device_bytes_live;   /* now */
  uint64_t events_pending;      /* now: operations not yet ready */
  uint64_t callbacks_run;
  /* 1.2: transfers staged whatever their size because the device cannot
   * DMA the caller's buffer where it is (not aligned for it); written only
   * when struct_size covers it. */
  uint64_t staged_misaligned;
  /* 1.4: with the premapped region off, small transfers staged through the
   * engine's own pinned bounce pool, and the pool's size (0 when there is
   * none); written only when struct_size covers them. */
  uint64_t staged_bounce;
  uint64_t bounce_pool_bytes;
  /* 1.4: registered host memory (HostMemory_Register): zero-copy transfers
   * by [TpuShim_Direction] whose host range lay in a registration (counted
   * in transfers[d][zero-copy] too; bytes of the successful ones), and the
   * registrations live now with their bytes; written only when struct_size
   * covers them. */
  uint64_t zero_copy_registered_transfers[TPUSHIM_HOST_DIRECTION_COUNT];
  uint64_t zero_copy_registered_bytes[TPUSHIM_HOST_DIRECTION_COUNT];
  uint64_t registrations_live;
  uint64_t registered_bytes;
} TpuShim_Stats;
#define TPUSHIM_STATS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_Stats, callbacks_run)

/* Fills *stats. INVALID_ARGUMENT when `stats` is NULL or its struct_size
 * is below TPUSHIM_STATS_STRUCT_SIZE. */
typedef struct TpuShim_System_GetStats_Args {
  size_t struct_size;
  TpuShim_System system; /* in */
  TpuShim_Stats* stats;  /* in: caller-owned, struct_size set; filled */
} TpuShim_System_GetStats_Args;
#define TPUSHIM_SYSTEM_GETSTATS_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_System_GetStats_Args, stats)
typedef TpuShim_Error* TpuShim_System_GetStats_Fn(
    TpuShim_System_GetStats_Args* args);

/* ---- Host buffers (the premapped region) */

/* Allocates `size` bytes of the system's premapped region. Transfers from
 * or to this memory take the zero-copy path.
 *
 * This can BLOCK while the region is premapped behind the caller
 * (TPUSHIM_PREMAP=background): a buffer that fits only in the part not
 * premapped yet waits until premapping reaches it. System_Destroy stops
 * premapping first, which ends such a wait at once with CANCELLED. A
 * buffer that could not fit even in the whole region with the buffers now
 * live fails at once. 1.4: TPUSHIM_HOSTBUFFER_NO_WAIT in `flags` never
 * waits: UNAVAILABLE instead (retry later).
 *
 * Errors: INVALID_ARGUMENT for size 0, an alignment that is not a power
 * of two <= 4096 or an unknown flag; RESOURCE_EXHAUSTED with libtpu's text
 * ("Attempting to allocate 8.00M. That was not possible. There are 6.43M
 * free." ..., or naming TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES when
 * `size` is above the threshold); FAILED_PRECONDITION when the region is
 * off (TPU_PREMAPPED_BUFFER_SIZE=0); UNAVAILABLE with
 * TPUSHIM_HOSTBUFFER_NO_WAIT where it would wait; CANCELLED when
 * System_Destroy ended its wait. */
/* 1.4: HostBuffer_Allocate's `flags`. */
#define TPUSHIM_HOSTBUFFER_NO_WAIT 0x1u /* UNAVAILABLE instead of waiting */
typedef struct TpuShim_HostBuffer_Allocate_Args {
  size_t struct_size;
  TpuShim_System system; /* in */
  uint64_t size;         /* in: bytes, >= 1 */
  size_t alignment;      /* in: a power of two <= 4096; 0 = 64 (at least 64) */
  TpuShim_HostBuffer buffer; /* out: free with HostBuffer_Free */
  /* out: the memory, `size` bytes, writable and readable by the caller
   * until the buffer is freed or its system destroyed. */
  void* data;
  uint32_t flags; /* 1.4: in, TPUSHIM_HOSTBUFFER_* bits; 0 = wait */
} TpuShim_HostBuffer_Allocate_Args;
#define TPUSHIM_HOSTBUFFER_ALLOCATE_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_HostBuffer_Allocate_Args, data)
typedef TpuShim_Error* TpuShim_HostBuffer_Allocate_Fn(
    TpuShim_HostBuffer_Allocate_Args* args);

/* Returns the buffer's memory to the region now; the handle is stale
 * afterwards. REQUIRES (not checked): no transfer still in flight uses the
 * memory. INVALID_ARGUMENT for a bad handle, or one of another system. */
typedef struct TpuShim_HostBuffer_Free_Args {
  size_t struct_size;
  TpuShim_System system;     /* in: the buffer's system */
  TpuShim_HostBuffer buffer; /* in */
} TpuShim_HostBuffer_Free_Args;
#define TPUSHIM_HOSTBUFFER_FREE_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_HostBuffer_Free_Args, buffer)
typedef TpuShim_Error* TpuShim_HostBuffer_Free_Fn(
    TpuShim_HostBuffer_Free_Args* args);

/* ---- Device buffers */

/* Allocates `size` (>= 1) bytes on `device`.
 *
 * Errors: INVALID_ARGUMENT for a bad device or size 0; RESOURCE_EXHAUSTED
 * with XLA's text when it does not fit ("Error allocating device buffer:
 * Attempting to allocate 8.00M. That was not possible. There are 6.43M
 * free.; (0x0x0_HBM0)"). */
typedef struct TpuShim_DeviceBuffer_Allocate_Args {
  size_t struct_size;
  TpuShim_System system;       /* in */
  int device;                  /* in: [0, device count) */
  uint64_t size;               /* in: bytes */
  TpuShim_DeviceBuffer buffer; /* out: free with DeviceBuffer_Deallocate */
} TpuShim_DeviceBuffer_Allocate_Args;
#define TPUSHIM_DEVICEBUFFER_ALLOCATE_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_DeviceBuffer_Allocate_Args, buffer)
typedef TpuShim_Error* TpuShim_DeviceBuffer_Allocate_Fn(
    TpuShim_DeviceBuffer_Allocate_Args* args);

/* Frees the buffer once the `wait_for` events and every operation already
 * submitted on it are done. The handle is stale as soon as the call
 * returns successfully. `event` is ready when the memory is free; with the
 * first failed dependency's status when one failed (the memory is freed
 * all the same). INVALID_ARGUMENT for a bad buffer or event handle, and
 * RESOURCE_EXHAUSTED when 2^24 event handles are live: then nothing is
 * freed and the buffer stays usable. */
typedef struct TpuShim_DeviceBuffer_Deallocate_Args {
  size_t struct_size;
  TpuShim_System system;         /* in */
  TpuShim_DeviceBuffer buffer;   /* in */
  const TpuShim_Event* wait_for; /* in: may be NULL when num_wait_for is 0 */
  size_t num_wait_for;           /* in */
  TpuShim_Event event;           /* out: destroy with Event_Destroy */
} TpuShim_DeviceBuffer_Deallocate_Args;
#define TPUSHIM_DEVICEBUFFER_DEALLOCATE_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_DeviceBuffer_Deallocate_Args, event)
typedef TpuShim_Error* TpuShim_DeviceBuffer_Deallocate_Fn(
    TpuShim_DeviceBuffer_Deallocate_Args* args);

/* ---- Transfers */
/*
 * Every transfer is queued and returns an event. It starts once it is at
 * the head of its queue (per device and direction; operations start in
 * submission order) and every `wait_for` event is ready; if one of those
 * failed, the transfer fails with that same status without moving a byte.
 * `wait_for` names events of the same system (ready or not, the same one
 * more than once if need be); an event of another system is
 * INVALID_ARGUMENT, even a ready one (a system must not wait for one that
 * may be destroyed first). The same holds for DeviceBuffer_Deallocate.
 *
 * Errors at submission come back from the call, and nothing is queued:
 * INVALID_ARGUMENT for a bad handle, a NULL host pointer, size 0, a range
 * outside the buffer, an unknown `semantics`; RESOURCE_EXHAUSTED when
 * 2^24 event handles are live (the call's event would have none: destroy
 * some). Errors while the transfer runs (a DMA or pin failure, a failed
 * dependency, CANCELLED at System_Destroy) come back as the event's
 * status.
 */

/* Copies `size` bytes from host `src` to `dst` at `dst_offset`. The path
 * (zero-copy, staged, pinned) is chosen by where `src` lies and `size`. */
typedef struct TpuShim_Transfer_ToDevice_Args {
  size_t struct_size;
  TpuShim_System system;         /* in */
  const void* src;               /* in: host memory, `size` bytes */
  TpuShim_DeviceBuffer dst;      /* in */
  uint64_t dst_offset;           /* in */
  uint64_t size;                 /* in: bytes, >= 1 */
  const TpuShim_Event* wait_for; /* in: may be NULL when num_wait_for is 0 */
  size_t num_wait_for;           /* in */
  /* in: a TpuShim_HostBufferSemantics value: when `src` may be reused */
  int32_t semantics;
  TpuShim_Event event; /* out: destroy with Event_Destroy */
  /* 1.4: out, when struct_size covers it: the host_released event (`src`
   * may be reused or freed once it is ready; see "1.4: events" below).
   * Destroy with Event_Destroy. */
  TpuShim_Event host_released;
} TpuShim_Transfer_ToDevice_Args;
#define TPUSHIM_TRANSFER_TODEVICE_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_Transfer_ToDevice_Args, event)
typedef TpuShim_Error* TpuShim_Transfer_ToDevice_Fn(
    TpuShim_Transfer_ToDevice_Args* args);

/* Copies `size` bytes from `src` at `src_offset` to host `dst`. */
typedef struct TpuShim_Transfer_FromDevice_Args {
  size_t struct_size;
  TpuShim_System system;         /* in */
  TpuShim_DeviceBuffer src;      /* in */
  uint64_t src_offset;           /* in */
  void* dst;                     /* in: host memory, `size` bytes */
  uint64_t size;                 /* in: bytes, >= 1 */
  const TpuShim_Event* wait_for; /* in: may be NULL when num_wait_for is 0 */
  size_t num_wait_for;           /* in */
  /* in: a TpuShim_HostBufferSemantics value: when `dst` may be touched */
  int32_t semantics;
  TpuShim_Event event; /* out: destroy with Event_Destroy */
} TpuShim_Transfer_FromDevice_Args;
#define TPUSHIM_TRANSFER_FROMDEVICE_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_Transfer_FromDevice_Args, event)
typedef TpuShim_Error* TpuShim_Transfer_FromDevice_Fn(
    TpuShim_Transfer_FromDevice_Args* args);

/* Copies `size` bytes between device buffers of one system, on the same
 * device or two (queued on the source device). The ranges may overlap
 * (`src` and `dst` the same buffer): the destination then holds what
 * memmove gives, the source's bytes as they were when the copy started. */
typedef struct TpuShim_Transfer_DeviceToDevice_Args {
  size_t struct_size;
  TpuShim_System system;         /* in */
  TpuShim_DeviceBuffer src;      /* in */
  uint64_t src_offset;           /* in */
  TpuShim_DeviceBuffer dst;      /* in */
  uint64_t dst_offset;           /* in */
  uint64_t size;                 /* in: bytes, >= 1 */
  const TpuShim_Event* wait_for; /* in: may be NULL when num_wait_for is 0 */
  size_t num_wait_for;           /* in */
  TpuShim_Event event;           /* out: destroy with Event_Destroy */
} TpuShim_Transfer_DeviceToDevice_Args;
#define TPUSHIM_TRANSFER_DEVICETODEVICE_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_Transfer_DeviceToDevice_Args, event)
typedef TpuShim_Error* TpuShim_Transfer_DeviceToDevice_Fn(
    TpuShim_Transfer_DeviceToDevice_Args* args);

/* ---- Events */
/*
 * The error returned by Event_Await / Event_AwaitWithTimeout is the
 * event's own status when the handle is good, so an INVALID_ARGUMENT from
 * them may be either. A caller that must tell them apart calls
 * Event_IsReady first, which fails only for a bad handle; handle errors'
 * messages start with "Invalid TpuShim_".
 */

/* Whether the event is ready (never blocks). */
typedef struct TpuShim_Event_IsReady_Args {
  size_t struct_size;
  TpuShim_Event event; /* in */
  bool is_ready;       /* out */
} TpuShim_Event_IsReady_Args;
#define TPUSHIM_EVENT_ISREADY_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_Event_IsReady_Args, is_ready)
typedef TpuShim_Error* TpuShim_Event_IsReady_Fn(
    TpuShim_Event_IsReady_Args* args);

/* Blocks until the event is ready and returns its status: NULL for OK,
 * else an error with the operation's code and message (the caller owns
 * it). Another thread may destroy the handle meanwhile; the wait is not
 * disturbed. */
typedef struct TpuShim_Event_Await_Args {
  size_t struct_size;
  TpuShim_Event event; /* in */
} TpuShim_Event_Await_Args;
#define TPUSHIM_EVENT_AWAIT_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_Event_Await_Args, event)
typedef TpuShim_Error* TpuShim_Event_Await_Fn(TpuShim_Event_Await_Args* args);

/* Waits at most `timeout_ns` for the event. Ready in time: `ready` is
 * true and the return value is the event's status (NULL for OK). Not
 * ready: `ready` is false and NULL is returned. A timeout <= 0 polls. */
typedef struct TpuShim_Event_AwaitWithTimeout_Args {
  size_t struct_size;
  TpuShim_Event event; /* in */
  int64_t timeout_ns;  /* in: INT64_MAX waits (practically) forever */
  bool ready;          /* out: written whenever the handle is good */
} TpuShim_Event_AwaitWithTimeout_Args;
#define TPUSHIM_EVENT_AWAITWITHTIMEOUT_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_Event_AwaitWithTimeout_Args, ready)
typedef TpuShim_Error* TpuShim_Event_AwaitWithTimeout_Fn(
    TpuShim_Event_AwaitWithTimeout_Args* args);

/* An event callback. `status` is NULL when the event is OK, else an error
 * with its status that the callee owns and must free with Error_Destroy.
 * `user_arg` is the caller's pointer, passed through untouched. */
typedef void (*TpuShim_EventCallback)(TpuShim_Error* status, void* user_arg);

/* Runs `callback(status, user_arg)` exactly once, when the event is ready.
 * Where: added to a pending event, it runs after the event becomes ready
 * on its system's callback thread (never on a DMA thread, never under a
 * library lock), in the order callbacks became runnable; added to an
 * event that is already ready, it runs at once on the calling thread,
 * before Event_AddCallback returns. Callbacks share one thread per
 * system: keep them short. They may call any function of this table
 * (System_Destroy of their own system excepted) and may destroy the
 * event's handle. Destroying the handle (or the system) does not drop
 * callbacks already added: each still runs once. */
typedef struct TpuShim_Event_AddCallback_Args {
  size_t struct_size;
  TpuShim_Event event;            /* in */
  TpuShim_EventCallback callback; /* in: not NULL */
  void* user_arg;                 /* in: passed to the callback */
} TpuShim_Event_AddCallback_Args;
#define TPUSHIM_EVENT_ADDCALLBACK_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_Event_AddCallback_Args, user_arg)
typedef TpuShim_Error* TpuShim_Event_AddCallback_Fn(
    TpuShim_Event_AddCallback_Args* args);

/* Releases the event handle; the handle is stale afterwards. The
 * operation itself carries on (destroying an event cancels nothing), and
 * callbacks already added still run. */
typedef struct TpuShim_Event_Destroy_Args {
  size_t struct_size;
  TpuShim_Event event; /* in */
} TpuShim_Event_Destroy_Args;
#define TPUSHIM_EVENT_DESTROY_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_Event_Destroy_Args, event)
typedef TpuShim_Error* TpuShim_Event_Destroy_Fn(
    TpuShim_Event_Destroy_Args* args);

/* ---- Shaped device memory (1.3; TPUSHIM_API_HAS before calling) */
/*
 * A shaped device buffer holds one XLA array (docs/shapes.md): the device
 * reserves its size in its tiled layout, padding included; running out of
 * device memory adds XLA's report of what holds it to the
 * RESOURCE_EXHAUSTED message. Transfer_Array* move the whole array between
 * the dense row-major copy a host holds and the tiled layout on the
 * device; Transfer_ToDevice / Transfer_FromDevice move the device layout's
 * bytes as they are.
 */

/* Allocates the array `shape` on `device`.
 *
 * Errors: INVALID_ARGUMENT for a bad device, a NULL or malformed shape
 * (the message names the column), a tuple or an empty array;
 * RESOURCE_EXHAUSTED as for DeviceBuffer_Allocate, with the report.
 * Nothing is allocated on any error. */
typedef struct TpuShim_DeviceBuffer_AllocateShaped_Args {
  size_t struct_size;
  TpuShim_System system; /* in */
  int device;            /* in: [0, device count) */
  /* in: XLA's shape string of one array, NUL-terminated, e.g.
   * "f32[1024,1000]" (TPU's default layout) or "f32[8,128]{1,0:T(8,128)}" */
  const char* shape;
  const char* label;       /* in: its name in reports; may be NULL */
  const char* op_metadata; /* in: "Operator:" in reports; may be NULL */
  /* in: may be NULL; receives the shape with the layout used,
   * NUL-terminated, cut to layout_capacity - 1 characters */
  char* layout;
  size_t layout_capacity;      /* in: bytes at `layout` */
  size_t layout_length;        /* out: length of the whole string */
  TpuShim_DeviceBuffer buffer; /* out: free with DeviceBuffer_Deallocate */
  uint64_t size;               /* out: device bytes, padding included */
  uint64_t unpadded_bytes;     /* out: the elements' bytes */
  uint64_t host_bytes;         /* out: the dense host array's bytes */
} TpuShim_DeviceBuffer_AllocateShaped_Args;
#define TPUSHIM_DEVICEBUFFER_ALLOCATESHAPED_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_DeviceBuffer_AllocateShaped_Args, host_bytes)
typedef TpuShim_Error* TpuShim_DeviceBuffer_AllocateShaped_Fn(
    TpuShim_DeviceBuffer_AllocateShaped_Args* args);

/* Copies the whole array from the host's dense copy (`host_bytes` of the
 * buffer at `src`) into the device's layout, padding zero. On a byte
 * buffer, its whole size. Errors as for Transfer_ToDevice. */
typedef struct TpuShim_Transfer_ArrayToDevice_Args {
  size_t struct_size;
  TpuShim_System system;         /* in */
  const void* src;               /* in: the dense host array */
  TpuShim_DeviceBuffer dst;      /* in */
  const TpuShim_Event* wait_for; /* in: may be NULL when num_wait_for is 0 */
  size_t num_wait_for;           /* in */
  int32_t semantics;             /* in: a TpuShim_HostBufferSemantics value */
  TpuShim_Event event;           /* out: destroy with Event_Destroy */
  /* 1.4: out, when struct_size covers it: the host_released event, as for
   * Transfer_ToDevice. Destroy with Event_Destroy. */
  TpuShim_Event host_released;
} TpuShim_Transfer_ArrayToDevice_Args;
#define TPUSHIM_TRANSFER_ARRAYTODEVICE_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_Transfer_ArrayToDevice_Args, event)
typedef TpuShim_Error* TpuShim_Transfer_ArrayToDevice_Fn(
    TpuShim_Transfer_ArrayToDevice_Args* args);

/* The inverse: the whole array into the host's dense copy at `dst`. */
typedef struct TpuShim_Transfer_ArrayFromDevice_Args {
  size_t struct_size;
  TpuShim_System system;         /* in */
  TpuShim_DeviceBuffer src;      /* in */
  void* dst;                     /* in: the dense host array */
  const TpuShim_Event* wait_for; /* in: may be NULL when num_wait_for is 0 */
  size_t num_wait_for;           /* in */
  int32_t semantics;             /* in: a TpuShim_HostBufferSemantics value */
  TpuShim_Event event;           /* out: destroy with Event_Destroy */
} TpuShim_Transfer_ArrayFromDevice_Args;
#define TPUSHIM_TRANSFER_ARRAYFROMDEVICE_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_Transfer_ArrayFromDevice_Args, event)
typedef TpuShim_Error* TpuShim_Transfer_ArrayFromDevice_Fn(
    TpuShim_Transfer_ArrayFromDevice_Args* args);

/* One device's memory now. Padded bytes are the live buffers' sizes in
 * their layouts (a byte buffer's size), unpadded the bytes of their data;
 * peaks since the system was created. INVALID_ARGUMENT for a bad device. */
typedef struct TpuShim_System_GetDeviceMemoryStats_Args {
  size_t struct_size;
  TpuShim_System system;       /* in */
  int device;                  /* in */
  uint64_t hbm_bytes;          /* out: capacity */
  uint64_t hbm_in_use;         /* out: what the device's allocator holds */
  uint64_t hbm_free;           /* out */
  uint64_t largest_free_block; /* out */
  uint64_t buffers_live;       /* out */
  uint64_t padded_bytes_in_use;
  uint64_t unpadded_bytes_in_use;
  uint64_t peak_padded_bytes;
  uint64_t peak_unpadded_bytes;
  /* 1.4: out, written only when struct_size covers them: buffers allocated
   * on the device since the system was created, and the largest (its size
   * in its layout). */
  uint64_t num_allocs;
  uint64_t largest_alloc_size;
} TpuShim_System_GetDeviceMemoryStats_Args;
#define TPUSHIM_SYSTEM_GETDEVICEMEMORYSTATS_ARGS_STRUCT_SIZE    \
  TPUSHIM_STRUCT_SIZE(TpuShim_System_GetDeviceMemoryStats_Args, \
                      peak_unpadded_bytes)
typedef TpuShim_Error* TpuShim_System_GetDeviceMemoryStats_Fn(
    TpuShim_System_GetDeviceMemoryStats_Args* args);

/* 1.4: memory kinds and registered host memory; caller events, buffer
 * ready events and chunked transfers. Declared in files of their own. */
#include "tpushim/c_api_memory.h"
#include "tpushim/c_api_events.h"

/* ---- Chips (1.4) */

/* One chip of the host (see tpushim/chips.h). Array element: its layout is
 * fixed for the whole major version. Strings are NUL-terminated, cut to
 * their arrays. */
typedef struct TpuShim_ChipInfo {
  int32_t host_chip;      /* the host's index (0 for a vfio:// function) */
  int32_t held;           /* 1 when a System holds it, else 0 */
  int64_t pid;            /* the holder's pid; 0 when free or unrecorded */
  int64_t since_unix_us;  /* since when it holds the chip; 0 likewise */
  char name[64];          /* "sim chip 2" */
  char user[64];          /* the holder's user; "" likewise */
  char command_line[512]; /* the holder's arguments joined by spaces */
} TpuShim_ChipInfo;

/* Every chip of the host that TPUSHIM_DEVICE names (then any other chip
 * held in the same run directory, TPUSHIM_RUN_DIR), with its holder or
 * free, resolved from `options` as System_Create resolves them. Takes no
 * chip: a launcher polls it to wait for a chip.
 *
 * The first min(num_chips, capacity) elements of `chips` are filled;
 * `num_chips` says how many chips there are (call again with a larger
 * array when it exceeds `capacity`). `chips` may be NULL when capacity is
 * 0. Errors: INVALID_ARGUMENT as System_Create for options; the failing
 * call's status when a lock file cannot be read. */
typedef struct TpuShim_Chips_List_Args {
  size_t struct_size;
  const TpuShim_Option* options; /* in: may be NULL when num_options is 0 */
  size_t num_options;            /* in */
  TpuShim_ChipInfo* chips;       /* in: array of `capacity` elements */
  size_t capacity;               /* in */
  size_t num_chips;              /* out */
} TpuShim_Chips_List_Args;
#define TPUSHIM_CHIPS_LIST_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_Chips_List_Args, num_chips)
typedef TpuShim_Error* TpuShim_Chips_List_Fn(TpuShim_Chips_List_Args* args);

/* ---- The table */

#define TPUSHIM_API_FN(name) TpuShim_##name##_Fn* name

typedef struct TpuShim_Api {
  size_t struct_size; /* bytes of this table the library provides */
  int api_major;      /* TPUSHIM_API_MAJOR of the library */
  int api_minor;      /* TPUSHIM_API_MINOR of the library */

  TPUSHIM_API_FN(Error_Destroy);
  TPUSHIM_API_FN(Error_Code);
  TPUSHIM_API_FN(Error_Message);

  TPUSHIM_API_FN(System_Create);
  TPUSHIM_API_FN(System_Destroy);
  TPUSHIM_API_FN(System_GetDeviceCount);
  TPUSHIM_API_FN(System_GetDeviceInfo);
  TPUSHIM_API_FN(System_GetStats);

  TPUSHIM_API_FN(HostBuffer_Allocate);
  TPUSHIM_API_FN(HostBuffer_Free);

  TPUSHIM_API_FN(DeviceBuffer_Allocate);
  TPUSHIM_API_FN(DeviceBuffer_Deallocate);

  TPUSHIM_API_FN(Transfer_ToDevice);
  TPUSHIM_API_FN(Transfer_FromDevice);
  TPUSHIM_API_FN(Transfer_DeviceToDevice);

  TPUSHIM_API_FN(Event_IsReady);
  TPUSHIM_API_FN(Event_Await);
  TPUSHIM_API_FN(Event_AwaitWithTimeout);
  TPUSHIM_API_FN(Event_AddCallback);
  TPUSHIM_API_FN(Event_Destroy);

  /* 1.3 */
  TPUSHIM_API_FN(DeviceBuffer_AllocateShaped);
  TPUSHIM_API_FN(Transfer_ArrayToDevice);
  TPUSHIM_API_FN(Transfer_ArrayFromDevice);
  TPUSHIM_API_FN(System_GetDeviceMemoryStats);

  /* 1.4: memory kinds */
  TPUSHIM_API_FN(System_GetMemories);
  TPUSHIM_API_FN(System_GetDefaultMemory);
  TPUSHIM_API_FN(MemoryBuffer_Allocate);
  TPUSHIM_API_FN(MemoryBuffer_FromHost);
  TPUSHIM_API_FN(MemoryBuffer_CopyToMemory);
  TPUSHIM_API_FN(MemoryBuffer_GetInfo);
  TPUSHIM_API_FN(MemoryBuffer_Free);
  TPUSHIM_API_FN(System_GetMemoryStats);
  /* 1.4: events */
  TPUSHIM_API_FN(Event_Create);
  TPUSHIM_API_FN(Event_Set);
  TPUSHIM_API_FN(DeviceBuffer_ReadyEvent);
  TPUSHIM_API_FN(Transfer_BeginChunked);
  TPUSHIM_API_FN(Transfer_Chunk);
  /* 1.4: registered host memory */
  TPUSHIM_API_FN(HostMemory_Register);
  TPUSHIM_API_FN(HostMemory_Unregister);
  /* 1.4: chips */
  TPUSHIM_API_FN(Chips_List);
  /* 1.4: memory-buffer readiness and aborted chunked transfers */
  TPUSHIM_API_FN(MemoryBuffer_ReadyEvent);
  TPUSHIM_API_FN(Transfer_AbortChunked);
} TpuShim_Api;

#undef TPUSHIM_API_FN

/* The 1.0 size of the table; the library's struct_size covers every
 * function it provides (sizeof(TpuShim_Api) of its own header). */
#define TPUSHIM_API_STRUCT_SIZE TPUSHIM_STRUCT_SIZE(TpuShim_Api, Event_Destroy)

/* Whether `api` (a table from TpuShim_GetApi) provides function `name`:
 * TPUSHIM_API_HAS(api, Event_Destroy). */
#define TPUSHIM_API_HAS(api, name)                                      \
  ((api)->struct_size >=                                                \
       offsetof(TpuShim_Api, name) + sizeof(((TpuShim_Api*)0)->name) && \
   (api)->name != NULL)

/* The library's function table: static, never NULL, valid for the life of
 * the process; the one exported symbol. A caller checks api_major equals
 * the TPUSHIM_API_MAJOR it was built with. */
TPUSHIM_EXPORT const TpuShim_Api* TpuShim_GetApi(void);

#ifdef __cplusplus
}
#endif

#endif /* TPUSHIM_C_API_H_ */
