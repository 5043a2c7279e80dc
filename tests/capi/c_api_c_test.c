/* The C ABI from plain C99: compiles against tpushim/c_api.h alone and runs
 * a full round trip (leveldb's db/c_test.c in spirit): a pinned host buffer
 * and a malloc'd buffer -> device -> device-to-device -> host, chained with
 * wait_for lists, with an event callback and an await with timeout; then
 * every handle is freed, a stale handle is INVALID_ARGUMENT, and the system
 * goes. Exits 0 on success; prints what failed otherwise. */

#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tpushim/c_api.h"

static const TpuShim_Api* api;
static int failures = 0;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

/* Expects `error` to be NULL (destroying it otherwise). */
#define CHECK_OK(call)                                                       \
  do {                                                                       \
    TpuShim_Error* check_ok_error_ = (call);                                 \
    if (check_ok_error_ != NULL) {                                           \
      fprintf(stderr, "%s:%d: %s failed: code %d: %s\n", __FILE__, __LINE__, \
              #call, api->Error_Code(check_ok_error_),                       \
              api->Error_Message(check_ok_error_));                          \
      api->Error_Destroy(check_ok_error_);                                   \
      ++failures;                                                            \
    }                                                                        \
  } while (0)

/* The error's code (0 for NULL); destroys it. */
static int CodeOf(TpuShim_Error* error) {
  const int code = api->Error_Code(error);
  api->Error_Destroy(error);
  return code;
}

/* ---- A callback that reports to the main thread ---- */

struct CallbackState {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int runs;
  int code;
};

static void OnCopied(TpuShim_Error* status, void* user_arg) {
  struct CallbackState* state = (struct CallbackState*)user_arg;
  const int code = api->Error_Code(status);
  api->Error_Destroy(status); /* the callee owns it */
  pthread_mutex_lock(&state->mu);
  state->runs++;
  state->code = code;
  pthread_cond_signal(&state->cv);
  pthread_mutex_unlock(&state->mu);
}

/* ---- Small wrappers ---- */

static TpuShim_Event ToDevice(TpuShim_System system, const void* src,
                              TpuShim_DeviceBuffer dst, uint64_t offset,
                              uint64_t size) {
  TpuShim_Transfer_ToDevice_Args args;
  memset(&args, 0, sizeof args);
  args.struct_size = TPUSHIM_TRANSFER_TODEVICE_ARGS_STRUCT_SIZE;
  args.system = system;
  args.src = src;
  args.dst = dst;
  args.dst_offset = offset;
  args.size = size;
  args.semantics = TPUSHIM_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES;
  CHECK_OK(api->Transfer_ToDevice(&args));
  return args.event;
}

static void DestroyEvent(TpuShim_Event event) {
  TpuShim_Event_Destroy_Args args;
  memset(&args, 0, sizeof args);
  args.struct_size = TPUSHIM_EVENT_DESTROY_ARGS_STRUCT_SIZE;
  args.event = event;
  CHECK_OK(api->Event_Destroy(&args));
}

static TpuShim_DeviceBuffer AllocateDevice(TpuShim_System system,
                                           uint64_t size) {
  TpuShim_DeviceBuffer_Allocate_Args args;
  memset(&args, 0, sizeof args);
  args.struct_size = TPUSHIM_DEVICEBUFFER_ALLOCATE_ARGS_STRUCT_SIZE;
  args.system = system;
  args.device = 0;
  args.size = size;
  CHECK_OK(api->DeviceBuffer_Allocate(&args));
  return args.buffer;
}

static void DeallocateAndAwait(TpuShim_System system,
                               TpuShim_DeviceBuffer buffer,
                               TpuShim_Event after) {
  TpuShim_DeviceBuffer_Deallocate_Args args;
  TpuShim_Event_Await_Args await_args;
  memset(&args, 0, sizeof args);
  args.struct_size = TPUSHIM_DEVICEBUFFER_DEALLOCATE_ARGS_STRUCT_SIZE;
  args.system = system;
  args.buffer = buffer;
  args.wait_for = &after;
  args.num_wait_for = 1;
  CHECK_OK(api->DeviceBuffer_Deallocate(&args));
  memset(&await_args, 0, sizeof await_args);
  await_args.struct_size = TPUSHIM_EVENT_AWAIT_ARGS_STRUCT_SIZE;
  await_args.event = args.event;
  CHECK_OK(api->Event_Await(&await_args));
  DestroyEvent(args.event);
}

int main(void) {
  const uint64_t kPinnedBytes = (uint64_t)1 << 20;          /* zero-copy */
  const uint64_t kPageableBytes = ((uint64_t)3 << 19) + 17; /* staged */
  const uint64_t kTotal = kPinnedBytes + kPageableBytes;
  TpuShim_Option options[4];
  TpuShim_System_Create_Args create;
  TpuShim_System system;
  TpuShim_System_GetDeviceCount_Args count;
  TpuShim_System_GetDeviceInfo_Args info;
  TpuShim_HostBuffer_Allocate_Args host;
  TpuShim_HostBuffer_Free_Args free_host;
  TpuShim_DeviceBuffer a;
  TpuShim_DeviceBuffer b;
  TpuShim_Event up[2];
  TpuShim_Transfer_DeviceToDevice_Args copy;
  TpuShim_Event_AddCallback_Args callback;
  TpuShim_Transfer_FromDevice_Args down;
  TpuShim_Event_AwaitWithTimeout_Args await_down;
  TpuShim_Event_IsReady_Args is_ready;
  TpuShim_Stats stats;
  TpuShim_System_GetStats_Args get_stats;
  TpuShim_System_Destroy_Args destroy;
  struct CallbackState state;
  unsigned char* pageable;
  unsigned char* result;
  uint64_t i;

  api = TpuShim_GetApi();
  CHECK(api != NULL);
  if (api == NULL) return 1;
  CHECK(api->api_major == TPUSHIM_API_MAJOR);
  CHECK(api->struct_size >= TPUSHIM_API_STRUCT_SIZE);
  CHECK(TPUSHIM_API_HAS(api, Event_Destroy));

  /* ---- Bring the system up ---- */
  options[0].name = "TPU_PREMAPPED_BUFFER_SIZE";
  options[0].value = "16777216";
  options[1].name = "TPUSHIM_DEVICE";
  options[1].value = "sim://?hbm=64M";
  options[2].name = "TPU_LOG_DIR";
  options[2].value = "disabled";
  options[3].name = "TPUSHIM_PREFAULT_THREADS";
  options[3].value = "1";
  memset(&create, 0, sizeof create);
  create.struct_size = TPUSHIM_SYSTEM_CREATE_ARGS_STRUCT_SIZE;
  create.options = options;
  create.num_options = 4;
  CHECK_OK(api->System_Create(&create));
  system = create.system;
  CHECK(system.id != 0);
  if (system.id == 0) return 1;

  memset(&count, 0, sizeof count);
  count.struct_size = TPUSHIM_SYSTEM_GETDEVICECOUNT_ARGS_STRUCT_SIZE;
  count.system = system;
  CHECK_OK(api->System_GetDeviceCount(&count));
  CHECK(count.device_count == 1);

  memset(&info, 0, sizeof info);
  info.struct_size = TPUSHIM_SYSTEM_GETDEVICEINFO_ARGS_STRUCT_SIZE;
  info.system = system;
  info.device = 0;
  CHECK_OK(api->System_GetDeviceInfo(&info));
  CHECK(info.name != NULL && strcmp(info.name, "sim:0") == 0);
  CHECK(info.hbm_bytes == (uint64_t)64 << 20);
  CHECK(info.dma_engines >= 1);
  CHECK(info.numa_node >= -1);

  /* ---- Host memory: a pinned (premapped) buffer and a malloc'd one ---- */
  memset(&host, 0, sizeof host);
  host.struct_size = TPUSHIM_HOSTBUFFER_ALLOCATE_ARGS_STRUCT_SIZE;
  host.system = system;
  host.size = kPinnedBytes;
  host.alignment = 0; /* the default, 64 */
  CHECK_OK(api->HostBuffer_Allocate(&host));
  CHECK(host.data != NULL);
  if (host.data == NULL) return 1;
  for (i = 0; i < kPinnedBytes; ++i) {
    ((unsigned char*)host.data)[i] = (unsigned char)(i * 7 + 1);
  }
  pageable = (unsigned char*)malloc(kPageableBytes);
  result = (unsigned char*)malloc(kTotal);
  if (pageable == NULL || result == NULL) return 1;
  for (i = 0; i < kPageableBytes; ++i) pageable[i] = (unsigned char)(i * 13);
  memset(result, 0, kTotal);

  /* ---- Up, across, down: each step waits for the one before ---- */
  a = AllocateDevice(system, kTotal);
  b = AllocateDevice(system, kTotal);
  up[0] = ToDevice(system, host.data, a, 0, kPinnedBytes);
  up[1] = ToDevice(system, pageable, a, kPinnedBytes, kPageableBytes);

  memset(&copy, 0, sizeof copy);
  copy.struct_size = TPUSHIM_TRANSFER_DEVICETODEVICE_ARGS_STRUCT_SIZE;
  copy.system = system;
  copy.src = a;
  copy.dst = b;
  copy.size = kTotal;
  copy.wait_for = up;
  copy.num_wait_for = 2;
  CHECK_OK(api->Transfer_DeviceToDevice(&copy));

  pthread_mutex_init(&state.mu, NULL);
  pthread_cond_init(&state.cv, NULL);
  state.runs = 0;
  state.code = -1;
  memset(&callback, 0, sizeof callback);
  callback.struct_size = TPUSHIM_EVENT_ADDCALLBACK_ARGS_STRUCT_SIZE;
  callback.event = copy.event;
  callback.callback = OnCopied;
  callback.user_arg = &state;
  CHECK_OK(api->Event_AddCallback(&callback));

  memset(&down, 0, sizeof down);
  down.struct_size = TPUSHIM_TRANSFER_FROMDEVICE_ARGS_STRUCT_SIZE;
  down.system = system;
  down.src = b;
  down.dst = result;
  down.size = kTotal;
  down.wait_for = &copy.event;
  down.num_wait_for = 1;
  down.semantics = TPUSHIM_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES;
  CHECK_OK(api->Transfer_FromDevice(&down));

  memset(&await_down, 0, sizeof await_down);
  await_down.struct_size = TPUSHIM_EVENT_AWAITWITHTIMEOUT_ARGS_STRUCT_SIZE;
  await_down.event = down.event;
  await_down.timeout_ns = (int64_t)30 * 1000 * 1000 * 1000;
  CHECK_OK(api->Event_AwaitWithTimeout(&await_down));
  CHECK(await_down.ready);

  memset(&is_ready, 0, sizeof is_ready);
  is_ready.struct_size = TPUSHIM_EVENT_ISREADY_ARGS_STRUCT_SIZE;
  is_ready.event = copy.event;
  CHECK_OK(api->Event_IsReady(&is_ready));
  CHECK(is_ready.is_ready);

  CHECK(memcmp(result, host.data, kPinnedBytes) == 0);
  CHECK(memcmp(result + kPinnedBytes, pageable, kPageableBytes) == 0);

  /* The callback runs on the callback thread once the copy is done. */
  pthread_mutex_lock(&state.mu);
  while (state.runs == 0) pthread_cond_wait(&state.cv, &state.mu);
  pthread_mutex_unlock(&state.mu);
  CHECK(state.runs == 1);
  CHECK(state.code == TPUSHIM_CODE_OK);

  /* ---- Stats: the paths each transfer took ---- */
  memset(&stats, 0, sizeof stats);
  stats.struct_size = sizeof stats;
  memset(&get_stats, 0, sizeof get_stats);
  get_stats.struct_size = TPUSHIM_SYSTEM_GETSTATS_ARGS_STRUCT_SIZE;
  get_stats.system = system;
  get_stats.stats = &stats;
  CHECK_OK(api->System_GetStats(&get_stats));
  CHECK(stats.region_enabled == 1);
  CHECK(stats.region_capacity_bytes == (uint64_t)16 << 20);
  CHECK(stats.region_live_allocations == 1);
  CHECK(stats.transfers[TPUSHIM_DIRECTION_HOST_TO_DEVICE]
                       [TPUSHIM_PATH_ZERO_COPY] == 1);
  CHECK(
      stats.transfers[TPUSHIM_DIRECTION_HOST_TO_DEVICE][TPUSHIM_PATH_STAGED] ==
      1);
  CHECK(
      stats.transfers[TPUSHIM_DIRECTION_DEVICE_TO_HOST][TPUSHIM_PATH_STAGED] ==
      1);
  CHECK(stats.device_to_device_transfers == 1);
  CHECK(stats.device_to_device_bytes == kTotal);
  CHECK(stats.device_buffers_live == 2);

  /* ---- Free everything ---- */
  DeallocateAndAwait(system, a, down.event);
  DeallocateAndAwait(system, b, down.event);
  DestroyEvent(up[0]);
  DestroyEvent(up[1]);
  DestroyEvent(copy.event);
  DestroyEvent(down.event);

  memset(&free_host, 0, sizeof free_host);
  free_host.struct_size = TPUSHIM_HOSTBUFFER_FREE_ARGS_STRUCT_SIZE;
  free_host.system = system;
  free_host.buffer = host.buffer;
  CHECK_OK(api->HostBuffer_Free(&free_host));

  /* Stale handles: a second free, a destroyed event, a freed buffer. */
  CHECK(CodeOf(api->HostBuffer_Free(&free_host)) ==
        TPUSHIM_CODE_INVALID_ARGUMENT);
  is_ready.event = down.event;
  CHECK(CodeOf(api->Event_IsReady(&is_ready)) == TPUSHIM_CODE_INVALID_ARGUMENT);
  {
    TpuShim_Transfer_ToDevice_Args stale;
    memset(&stale, 0, sizeof stale);
    stale.struct_size = TPUSHIM_TRANSFER_TODEVICE_ARGS_STRUCT_SIZE;
    stale.system = system;
    stale.src = pageable;
    stale.dst = a; /* deallocated above */
    stale.size = 1;
    CHECK(CodeOf(api->Transfer_ToDevice(&stale)) ==
          TPUSHIM_CODE_INVALID_ARGUMENT);
  }

  memset(&destroy, 0, sizeof destroy);
  destroy.struct_size = TPUSHIM_SYSTEM_DESTROY_ARGS_STRUCT_SIZE;
  destroy.system = system;
  CHECK_OK(api->System_Destroy(&destroy));
  CHECK(CodeOf(api->System_Destroy(&destroy)) == TPUSHIM_CODE_INVALID_ARGUMENT);
  CHECK(CodeOf(api->System_GetDeviceCount(&count)) ==
        TPUSHIM_CODE_INVALID_ARGUMENT);

  pthread_cond_destroy(&state.cv);
  pthread_mutex_destroy(&state.mu);
  free(pageable);
  free(result);
  if (failures != 0) {
    fprintf(stderr, "c_api_c_test: %d check(s) failed\n", failures);
    return 1;
  }
  printf("c_api_c_test: OK\n");
  return 0;
}
