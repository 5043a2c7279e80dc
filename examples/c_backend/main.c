/* c_backend: a framework backend in plain C that loads tpushim at run time,
 * as PJRT plugins are loaded: dlopen() the shared library, take the
 * function table from its one exported symbol, TpuShim_GetApi, and use
 * nothing but the table (tpushim/c_api.h).
 *
 * It brings a system up (a 16 MiB premapped region; two simulated devices
 * with 64 MiB of HBM each unless TPUSHIM_DEVICE is set; log files in
 * TPU_LOG_DIR, default /tmp/tpu_logs), moves a 1 MiB float tensor from a
 * premapped host buffer to every device and back into ordinary malloc()
 * memory, checks every element, frees everything and prints one line
 * starting "c_backend: OK". Exit status 0 on success, 1 (with the error on
 * stderr) otherwise.
 *
 *   c_backend [path to libtpushim.so]   (default: TPUSHIM_SONAME, found
 *                                        the way the dynamic loader finds
 *                                        libraries, LD_LIBRARY_PATH first)
 */

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tpushim/c_api.h"
#include "tpushim/version.h"

#define TENSOR_ELEMENTS (256 * 1024) /* floats: 1 MiB */

static const TpuShim_Api* api;

/* Reports and frees `error`; returns 1 if there was one, 0 for OK. */
static int Failed(TpuShim_Error* error, const char* what) {
  if (error == NULL) return 0;
  fprintf(stderr, "c_backend: FAILED: %s: code %d: %s\n", what,
          api->Error_Code(error), api->Error_Message(error));
  api->Error_Destroy(error);
  return 1;
}

static void DestroyEvent(TpuShim_Event event) {
  TpuShim_Event_Destroy_Args args = {0};
  args.struct_size = TPUSHIM_EVENT_DESTROY_ARGS_STRUCT_SIZE;
  args.event = event;
  Failed(api->Event_Destroy(&args), "Event_Destroy");
}

/* Awaits `event`, then destroys its handle. Returns 1 on failure. */
static int AwaitAndDestroy(TpuShim_Event event, const char* what) {
  TpuShim_Event_Await_Args args = {0};
  args.struct_size = TPUSHIM_EVENT_AWAIT_ARGS_STRUCT_SIZE;
  args.event = event;
  int failed = Failed(api->Event_Await(&args), what);
  DestroyEvent(event);
  return failed;
}

/* Copies `tensor` (`bytes` long) to `device` and back into `result`, then
 * frees the device memory. Returns 1 on failure. */
static int RoundTrip(TpuShim_System system, int device, const float* tensor,
                     float* result, uint64_t bytes) {
  TpuShim_DeviceBuffer_Allocate_Args alloc = {0};
  alloc.struct_size = TPUSHIM_DEVICEBUFFER_ALLOCATE_ARGS_STRUCT_SIZE;
  alloc.system = system;
  alloc.device = device;
  alloc.size = bytes;
  if (Failed(api->DeviceBuffer_Allocate(&alloc), "DeviceBuffer_Allocate")) {
    return 1;
  }

  /* Up, then down: the copy down waits for the copy up by event, so both
   * are queued at once and only the last step blocks. */
  int failed = 1;
  TpuShim_Transfer_ToDevice_Args up = {0};
  up.struct_size = TPUSHIM_TRANSFER_TODEVICE_ARGS_STRUCT_SIZE;
  up.system = system;
  up.src = tensor;
  up.dst = alloc.buffer;
  up.size = bytes;
  up.semantics = TPUSHIM_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES;
  TpuShim_Transfer_FromDevice_Args down = {0};
  down.struct_size = TPUSHIM_TRANSFER_FROMDEVICE_ARGS_STRUCT_SIZE;
  down.system = system;
  down.src = alloc.buffer;
  down.dst = result;
  down.size = bytes;
  down.semantics = TPUSHIM_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES;
  if (!Failed(api->Transfer_ToDevice(&up), "Transfer_ToDevice")) {
    down.wait_for = &up.event;
    down.num_wait_for = 1;
    if (!Failed(api->Transfer_FromDevice(&down), "Transfer_FromDevice")) {
      failed = AwaitAndDestroy(down.event, "device->host transfer");
    }
    failed |= AwaitAndDestroy(up.event, "host->device transfer");
  }

  /* Frees the device memory once every operation on it is done. */
  TpuShim_DeviceBuffer_Deallocate_Args dealloc = {0};
  dealloc.struct_size = TPUSHIM_DEVICEBUFFER_DEALLOCATE_ARGS_STRUCT_SIZE;
  dealloc.system = system;
  dealloc.buffer = alloc.buffer;
  if (Failed(api->DeviceBuffer_Deallocate(&dealloc),
             "DeviceBuffer_Deallocate")) {
    return 1;
  }
  failed |= AwaitAndDestroy(dealloc.event, "deallocation");
  return failed;
}

int main(int argc, char** argv) {
  const char* library = argc > 1 ? argv[1] : TPUSHIM_SONAME;
  void* handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (handle == NULL) {
    fprintf(stderr, "c_backend: FAILED: dlopen: %s\n", dlerror());
    return 1;
  }
  /* ISO C has no conversion from void* to a function pointer: copy it. */
  const TpuShim_Api* (*get_api)(void) = NULL;
  void* symbol = dlsym(handle, "TpuShim_GetApi");
  if (symbol == NULL) {
    fprintf(stderr, "c_backend: FAILED: dlsym: %s\n", dlerror());
    dlclose(handle);
    return 1;
  }
  memcpy(&get_api, &symbol, sizeof(symbol));
  api = get_api();
  if (api->api_major != TPUSHIM_API_MAJOR ||
      api->struct_size < TPUSHIM_API_STRUCT_SIZE) {
    fprintf(stderr,
            "c_backend: FAILED: %s has C API %d.%d (table of %zu bytes); "
            "built for %d.%d (%zu bytes)\n",
            library, api->api_major, api->api_minor, api->struct_size,
            TPUSHIM_API_MAJOR, TPUSHIM_API_MINOR,
            (size_t)TPUSHIM_API_STRUCT_SIZE);
    dlclose(handle);
    return 1;
  }

  /* Settings by their environment variables' names; they win over the
   * environment. */
  const char* device = getenv("TPUSHIM_DEVICE");
  const char* log_dir = getenv("TPU_LOG_DIR");
  TpuShim_Option options[] = {
      {"TPU_PREMAPPED_BUFFER_SIZE", "16777216"}, /* 16 MiB */
      {"TPUSHIM_DEVICE", device ? device : "sim://?devices=2&hbm=64M"},
      {"TPU_LOG_DIR", log_dir ? log_dir : "/tmp/tpu_logs"},
  };
  TpuShim_System_Create_Args create = {0};
  create.struct_size = TPUSHIM_SYSTEM_CREATE_ARGS_STRUCT_SIZE;
  create.options = options;
  create.num_options = sizeof(options) / sizeof(options[0]);
  if (Failed(api->System_Create(&create), "System_Create")) {
    dlclose(handle);
    return 1;
  }
  const TpuShim_System system = create.system;

  int failed = 1;
  float* result = NULL;
  const uint64_t bytes = TENSOR_ELEMENTS * sizeof(float);

  /* The tensor lives in the premapped region (zero-copy to the device);
   * the result comes back into malloc() memory (staged). */
  TpuShim_HostBuffer_Allocate_Args host = {0};
  host.struct_size = TPUSHIM_HOSTBUFFER_ALLOCATE_ARGS_STRUCT_SIZE;
  host.system = system;
  host.size = bytes;
  host.alignment = 64;
  if (Failed(api->HostBuffer_Allocate(&host), "HostBuffer_Allocate")) {
    goto destroy_system;
  }
  float* tensor = host.data;
  for (int i = 0; i < TENSOR_ELEMENTS; ++i) tensor[i] = (float)i * 0.25f;
  result = malloc(bytes);
  if (result == NULL) {
    fprintf(stderr, "c_backend: FAILED: malloc(%llu)\n",
            (unsigned long long)bytes);
    goto free_host;
  }

  TpuShim_System_GetDeviceCount_Args count = {0};
  count.struct_size = TPUSHIM_SYSTEM_GETDEVICECOUNT_ARGS_STRUCT_SIZE;
  count.system = system;
  if (Failed(api->System_GetDeviceCount(&count), "System_GetDeviceCount")) {
    goto free_host;
  }
  for (int d = 0; d < count.device_count; ++d) {
    memset(result, 0, bytes);
    if (RoundTrip(system, d, tensor, result, bytes)) goto free_host;
    if (memcmp(result, tensor, bytes) != 0) {
      fprintf(stderr, "c_backend: FAILED: the tensor came back from device "
                      "%d changed\n", d);
      goto free_host;
    }
  }

  TpuShim_Stats stats = {0};
  stats.struct_size = sizeof(stats);
  TpuShim_System_GetStats_Args get_stats = {0};
  get_stats.struct_size = TPUSHIM_SYSTEM_GETSTATS_ARGS_STRUCT_SIZE;
  get_stats.system = system;
  get_stats.stats = &stats;
  if (Failed(api->System_GetStats(&get_stats), "System_GetStats")) {
    goto free_host;
  }
  printf("c_backend: OK: a %llu KiB tensor to %d devices and back through "
         "%s (C API %d.%d); host->device %llu zero-copy, device->host %llu "
         "staged\n",
         (unsigned long long)(bytes >> 10), count.device_count, library,
         api->api_major, api->api_minor,
         (unsigned long long)stats.transfers[TPUSHIM_DIRECTION_HOST_TO_DEVICE]
                                            [TPUSHIM_PATH_ZERO_COPY],
         (unsigned long long)stats.transfers[TPUSHIM_DIRECTION_DEVICE_TO_HOST]
                                            [TPUSHIM_PATH_STAGED]);
  failed = 0;

free_host:
  free(result);
  if (host.buffer.id != 0) {
    TpuShim_HostBuffer_Free_Args free_args = {0};
    free_args.struct_size = TPUSHIM_HOSTBUFFER_FREE_ARGS_STRUCT_SIZE;
    free_args.system = system;
    free_args.buffer = host.buffer;
    failed |= Failed(api->HostBuffer_Free(&free_args), "HostBuffer_Free");
  }
destroy_system:;
  TpuShim_System_Destroy_Args destroy = {0};
  destroy.struct_size = TPUSHIM_SYSTEM_DESTROY_ARGS_STRUCT_SIZE;
  destroy.system = system;
  failed |= Failed(api->System_Destroy(&destroy), "System_Destroy");
  dlclose(handle);
  return failed;
}
