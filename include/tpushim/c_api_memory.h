/* tpushim C ABI 1.4: memory kinds (device, pinned_host, unpinned_host)
 * and registered host memory (PJRT's DmaMap).
 *
 * Part of tpushim's C ABI: include "tpushim/c_api.h", which includes this
 * file where it belongs; the conventions at the top of c_api.h hold here.
 */

#ifndef TPUSHIM_C_API_MEMORY_H_
#define TPUSHIM_C_API_MEMORY_H_

#ifndef TPUSHIM_C_API_H_
#error "include tpushim/c_api.h, which includes tpushim/c_api_memory.h"
#endif

/* ---- 1.4: memory kinds
 *
 * The memories of a system, named as PJRT names their kinds: memory i
 * (0 <= i < device count) is device i's HBM ("device", the device's
 * default memory); then one "pinned_host" (the premapped region, which
 * every device DMAs directly; listed with capacity 0 when the region is
 * off) and one "unpinned_host" (pageable host memory). Ids are stable for
 * the system's life. A TpuShim_MemoryBuffer lives in one memory; a shaped
 * one holds the device's tiled image in every memory, host memories
 * included (docs/api.md, "Memory kinds"). */

/* A buffer in one memory of a system (device HBM, pinned_host or
 * unpinned_host). Valid until MemoryBuffer_Free or System_Destroy. */
typedef struct TpuShim_MemoryBuffer {
  uint64_t id;
} TpuShim_MemoryBuffer;

typedef enum TpuShim_MemoryKind {
  TPUSHIM_MEMORY_DEVICE = 0,
  TPUSHIM_MEMORY_PINNED_HOST = 1,
  TPUSHIM_MEMORY_UNPINNED_HOST = 2
} TpuShim_MemoryKind;

/* One memory. Array element: its layout is fixed for the whole major
 * version. */
typedef struct TpuShim_MemoryInfo {
  int32_t id;
  int32_t kind;          /* a TpuShim_MemoryKind value */
  const char* kind_name; /* "device", "pinned_host", "unpinned_host";
                            static */
  /* The device that addresses it (device memory), or -1: every device
   * (the host memories). */
  int32_t device;
  uint64_t capacity_bytes; /* 0 for unpinned_host (no limit of its own) */
} TpuShim_MemoryInfo;

/* Every memory, by id, into the caller's array: the first
 * min(capacity, num_memories) entries are written; num_memories is the
 * count there is (call with capacity 0 to learn it). INVALID_ARGUMENT when
 * `memories` is NULL and capacity is not 0. */
typedef struct TpuShim_System_GetMemories_Args {
  size_t struct_size;
  TpuShim_System system;        /* in */
  TpuShim_MemoryInfo* memories; /* in: caller-owned array; filled */
  size_t capacity;              /* in: its length */
  size_t num_memories;          /* out */
} TpuShim_System_GetMemories_Args;
#define TPUSHIM_SYSTEM_GETMEMORIES_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_System_GetMemories_Args, num_memories)
typedef TpuShim_Error* TpuShim_System_GetMemories_Fn(
    TpuShim_System_GetMemories_Args* args);

/* A device's default memory: its HBM. INVALID_ARGUMENT for a bad device. */
typedef struct TpuShim_System_GetDefaultMemory_Args {
  size_t struct_size;
  TpuShim_System system; /* in */
  int device;            /* in */
  int memory;            /* out */
} TpuShim_System_GetDefaultMemory_Args;
#define TPUSHIM_SYSTEM_GETDEFAULTMEMORY_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_System_GetDefaultMemory_Args, memory)
typedef TpuShim_Error* TpuShim_System_GetDefaultMemory_Fn(
    TpuShim_System_GetDefaultMemory_Args* args);

/* A buffer of `size` bytes (shape NULL) or of one XLA array (`shape`, with
 * `label` and `op_metadata`, both may be NULL; `size` is not read) in
 * `memory`, zero-filled in a host memory. pinned_host is served by the
 * premapped region: RESOURCE_EXHAUSTED with libtpu's text ("Attempting to
 * allocate 8.00M. That was not possible. There are 6.43M free. ...") and
 * the report of what holds pinned_host; FAILED_PRECONDITION when the
 * region is off. INVALID_ARGUMENT for a bad memory, size or shape. */
typedef struct TpuShim_MemoryBuffer_Allocate_Args {
  size_t struct_size;
  TpuShim_System system;       /* in */
  int memory;                  /* in */
  uint64_t size;               /* in (shape NULL) */
  const char* shape;           /* in, may be NULL */
  const char* label;           /* in, may be NULL */
  const char* op_metadata;     /* in, may be NULL */
  TpuShim_MemoryBuffer buffer; /* out */
} TpuShim_MemoryBuffer_Allocate_Args;
#define TPUSHIM_MEMORYBUFFER_ALLOCATE_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_MemoryBuffer_Allocate_Args, buffer)
typedef TpuShim_Error* TpuShim_MemoryBuffer_Allocate_Fn(
    TpuShim_MemoryBuffer_Allocate_Args* args);

/* A buffer in `memory` holding the `size` bytes at `data` (PJRT's
 * BufferFromHostBuffer). Device memory: a transfer, as Transfer_ToDevice
 * with `semantics`. Host memories: with a zero-copy semantics the buffer
 * aliases `data` (unpinned_host always; pinned_host when the range lies
 * in the premapped region or in registered host memory (HostMemory_-
 * Register); outside them IMMUTABLE_ZERO_COPY copies and
 * MUTABLE_ZERO_COPY is INVALID_ARGUMENT); other semantics copy. `event`
 * is ready once the bytes are in place; `aliased` says whether the buffer
 * is the caller's bytes.
 *
 * 1.4, when struct_size covers them: `shape` (with `label`) makes a buffer
 * of one XLA array from its dense row-major bytes at `data`; `size` must
 * be their length (INVALID_ARGUMENT naming both otherwise). Device
 * memory: as Transfer_ArrayToDevice; host memories hold the tiled image
 * and alias `data` only when the layout keeps the dense bytes as they
 * are. `host_released` (PJRT's done_with_host_buffer) is ready when
 * `data` may be reused or freed: into device memory as Transfer_ToDevice's
 * (before `event` on the staged path); a buffer aliasing `data`, once it
 * is freed and the copies using it are done (CANCELLED when the system is
 * destroyed first); copied into a host memory, at once. */
typedef struct TpuShim_MemoryBuffer_FromHost_Args {
  size_t struct_size;
  TpuShim_System system;       /* in */
  const void* data;            /* in */
  uint64_t size;               /* in, >= 1 */
  int memory;                  /* in */
  int32_t semantics;           /* in: a TpuShim_HostBufferSemantics value */
  TpuShim_MemoryBuffer buffer; /* out */
  TpuShim_Event event;         /* out: the caller destroys it */
  int32_t aliased;             /* out: 1 when the buffer is `data` */
  /* 1.4, when struct_size covers it: out; the caller destroys it. */
  TpuShim_Event host_released;
  /* 1.4, when struct_size covers them: in, may be NULL (a byte buffer). */
  const char* shape;
  const char* label;
} TpuShim_MemoryBuffer_FromHost_Args;
#define TPUSHIM_MEMORYBUFFER_FROMHOST_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_MemoryBuffer_FromHost_Args, aliased)
typedef TpuShim_Error* TpuShim_MemoryBuffer_FromHost_Fn(
    TpuShim_MemoryBuffer_FromHost_Args* args);

/* A new buffer in `memory` with `src`'s bytes (and shape), copied once
 * the wait_for events are done: device <-> pinned_host by one DMA from/to
 * the region (no staging), device <-> unpinned_host through the ordinary
 * paths, device -> device by a device copy, host -> host by memcpy.
 * Errors as MemoryBuffer_Allocate. */
typedef struct TpuShim_MemoryBuffer_CopyToMemory_Args {
  size_t struct_size;
  TpuShim_System system;         /* in */
  TpuShim_MemoryBuffer src;      /* in */
  int memory;                    /* in */
  const TpuShim_Event* wait_for; /* in, may be NULL when num_wait_for is 0 */
  size_t num_wait_for;           /* in */
  TpuShim_MemoryBuffer buffer;   /* out */
  TpuShim_Event event;           /* out: the caller destroys it */
} TpuShim_MemoryBuffer_CopyToMemory_Args;
#define TPUSHIM_MEMORYBUFFER_COPYTOMEMORY_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_MemoryBuffer_CopyToMemory_Args, event)
typedef TpuShim_Error* TpuShim_MemoryBuffer_CopyToMemory_Fn(
    TpuShim_MemoryBuffer_CopyToMemory_Args* args);

/* A buffer's memory (PJRT's Buffer_Memory) and what it is.
 *
 * Host memories: `data` is the buffer's bytes (pinned_host: in the
 * premapped region, so Transfer_ToDevice / Transfer_FromDevice from or to
 * them take the zero-copy path), valid until MemoryBuffer_Free.
 *
 * 1.4, when struct_size covers it: `device_buffer`, in device memory a
 * TpuShim_DeviceBuffer for the same buffer, borrowed: every call taking a
 * TpuShim_DeviceBuffer accepts it (Transfer_*, DeviceBuffer_ReadyEvent,
 * the chunked transfers) until MemoryBuffer_Free or System_Destroy, after
 * which it is stale (INVALID_ARGUMENT); DeviceBuffer_Deallocate refuses it
 * (INVALID_ARGUMENT: free the memory buffer). Every call returns the same
 * handle. {0} in a host memory. */
typedef struct TpuShim_MemoryBuffer_GetInfo_Args {
  size_t struct_size;
  TpuShim_System system;       /* in */
  TpuShim_MemoryBuffer buffer; /* in */
  int memory;                  /* out */
  int32_t kind;                /* out: a TpuShim_MemoryKind value */
  uint64_t size;               /* out: bytes in its memory (the tiled image) */
  void* data;                  /* out: host memories' bytes; NULL on device */
  int32_t aliased;             /* out: 1 when its bytes are the caller's */
  /* 1.4, when struct_size covers it: out, borrowed (see above). */
  TpuShim_DeviceBuffer device_buffer;
} TpuShim_MemoryBuffer_GetInfo_Args;
#define TPUSHIM_MEMORYBUFFER_GETINFO_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_MemoryBuffer_GetInfo_Args, aliased)
typedef TpuShim_Error* TpuShim_MemoryBuffer_GetInfo_Fn(
    TpuShim_MemoryBuffer_GetInfo_Args* args);

/* Frees `buffer` once the wait_for events and its copies in flight are
 * done (aliased caller bytes are only forgotten); the handle is stale at
 * once. `event` is ready once the wait_for events are (with the first
 * failed one's status); copies still using the bytes hold them until they
 * are done. */
typedef struct TpuShim_MemoryBuffer_Free_Args {
  size_t struct_size;
  TpuShim_System system;         /* in */
  TpuShim_MemoryBuffer buffer;   /* in */
  const TpuShim_Event* wait_for; /* in, may be NULL when num_wait_for is 0 */
  size_t num_wait_for;           /* in */
  TpuShim_Event event;           /* out: the caller destroys it */
} TpuShim_MemoryBuffer_Free_Args;
#define TPUSHIM_MEMORYBUFFER_FREE_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_MemoryBuffer_Free_Args, event)
typedef TpuShim_Error* TpuShim_MemoryBuffer_Free_Fn(
    TpuShim_MemoryBuffer_Free_Args* args);

/* One memory's statistics, PJRT's Device_MemoryStats fields. Device
 * memory: its buffers' sizes in their layouts; pinned_host: the region
 * (its buffers and staging); unpinned_host: its buffers, no limit
 * (has_bytes_limit 0). num_allocs and largest_alloc_size since the system
 * was created. INVALID_ARGUMENT for a bad memory. */
typedef struct TpuShim_System_GetMemoryStats_Args {
  size_t struct_size;
  TpuShim_System system; /* in */
  int memory;            /* in */
  int32_t kind;          /* out: a TpuShim_MemoryKind value */
  uint64_t bytes_in_use;
  uint64_t peak_bytes_in_use;
  uint64_t num_allocs;
  uint64_t largest_alloc_size;
  int32_t has_bytes_limit;
  uint64_t bytes_limit;
  uint64_t largest_free_block_bytes;
  uint64_t buffers_live;
} TpuShim_System_GetMemoryStats_Args;
#define TPUSHIM_SYSTEM_GETMEMORYSTATS_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_System_GetMemoryStats_Args, buffers_live)
typedef TpuShim_Error* TpuShim_System_GetMemoryStats_Fn(
    TpuShim_System_GetMemoryStats_Args* args);
/* A buffer's ready event, in any memory (PJRT's Buffer_ReadyEvent):
 * device memory as DeviceBuffer_ReadyEvent; a host memory, the copy that
 * filled it (MemoryBuffer_CopyToMemory's event), ready at once for a
 * buffer allocated or made from host bytes. Writes the caller makes
 * through `data` itself are its own to track. INVALID_ARGUMENT for a
 * stale, freed or foreign handle. */
typedef struct TpuShim_MemoryBuffer_ReadyEvent_Args {
  size_t struct_size;
  TpuShim_System system;       /* in */
  TpuShim_MemoryBuffer buffer; /* in */
  TpuShim_Event event;         /* out: destroy with Event_Destroy */
} TpuShim_MemoryBuffer_ReadyEvent_Args;
#define TPUSHIM_MEMORYBUFFER_READYEVENT_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_MemoryBuffer_ReadyEvent_Args, event)
typedef TpuShim_Error* TpuShim_MemoryBuffer_ReadyEvent_Fn(
    TpuShim_MemoryBuffer_ReadyEvent_Args* args);

/* ---- Registered host memory (1.4; TPUSHIM_API_HAS before calling) */

/* Registers the caller's host memory [data, data + size) for DMA by every
 * device of the system (PJRT's DmaMap), with or without the premapped
 * region: pinned once, not inherited by fork() children, mapped for each
 * device (an IOMMU mapping for vfio://). Until HostMemory_Unregister,
 * transfers whose host range lies wholly inside it take the zero-copy path
 * whatever their size. The caller keeps the memory mapped until then.
 * System_Destroy releases the registrations left (a WARNING says how many);
 * their handles are stale afterwards.
 *
 * Errors, with nothing registered: INVALID_ARGUMENT for NULL data, size 0,
 * a range overlapping another registration (naming both ranges), the
 * premapped region or the engine's bounce pool, or a range a device cannot
 * DMA (vfio://: start and size must be multiples of 4096; the message
 * names the alignment); the pin's failure (RESOURCE_EXHAUSTED, ...) with
 * the RLIMIT_MEMLOCK limit and how to raise it; FAILED_PRECONDITION in a
 * fork() child. */
typedef struct TpuShim_HostMemory_Register_Args {
  size_t struct_size;
  TpuShim_System system;                 /* in */
  const void* data;                      /* in */
  uint64_t size;                         /* in: bytes, >= 1 */
  TpuShim_HostRegistration registration; /* out: HostMemory_Unregister */
} TpuShim_HostMemory_Register_Args;
#define TPUSHIM_HOSTMEMORY_REGISTER_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_HostMemory_Register_Args, registration)
typedef TpuShim_Error* TpuShim_HostMemory_Register_Fn(
    TpuShim_HostMemory_Register_Args* args);

/* Ends a registration: new transfers no longer use it; BLOCKS until the
 * transfers submitted inside it have finished, then unmaps and unpins it.
 * The handle is stale afterwards. INVALID_ARGUMENT for a stale, freed or
 * foreign handle. */
typedef struct TpuShim_HostMemory_Unregister_Args {
  size_t struct_size;
  TpuShim_System system;                 /* in: the registration's system */
  TpuShim_HostRegistration registration; /* in */
} TpuShim_HostMemory_Unregister_Args;
#define TPUSHIM_HOSTMEMORY_UNREGISTER_ARGS_STRUCT_SIZE \
  TPUSHIM_STRUCT_SIZE(TpuShim_HostMemory_Unregister_Args, registration)
typedef TpuShim_Error* TpuShim_HostMemory_Unregister_Fn(
    TpuShim_HostMemory_Unregister_Args* args);

#endif /* TPUSHIM_C_API_MEMORY_H_ */
