/* A stand-in for the CUDA driver (libcuda.so.1) that the sanitizer's child loads through ctypes:
   "device" memory is host memory, and each call is written to the file $FAKE_CUDA_LOG, so a CPU
   test can check what the child asked of the driver. A launch of a kernel named relu_f32 runs
   relu on the host over (const float* x, float* y, long long n). */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static FILE *log_file(void) {
    static FILE *f;
    if (!f) f = fopen(getenv("FAKE_CUDA_LOG"), "w");
    return f;
}

static void say(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vfprintf(log_file(), fmt, args);
    va_end(args);
    fputc('\n', log_file());
    fflush(log_file());
}

int cuInit(unsigned flags) { say("init"); return 0; }
int cuDeviceGet(int *device, int index) { *device = index; return 0; }
int cuDevicePrimaryCtxRetain(void **context, int device) { *context = (void *)0x1; return 0; }
int cuCtxSetCurrent(void *context) { return 0; }
int cuDeviceGetUuid_v2(unsigned char *uuid, int device) { memset(uuid, 0xab, 16); return 0; }
int cuCtxSynchronize(void) { say("sync"); return 0; }
int cuGetErrorName(int error, const char **name) { *name = "CUDA_ERROR_FAKE"; return 0; }

int cuModuleLoadData(void **module, const void *image) {
    *module = (void *)0x2;
    say("module %.16s", (const char *)image);
    return 0;
}

int cuModuleGetFunction(void **function, void *module, const char *name) {
    *function = strdup(name);
    return 0;
}

int cuMemAlloc_v2(uint64_t *pointer, size_t bytes) {
    *pointer = (uint64_t)aligned_alloc(512, bytes);
    say("alloc %zu", bytes);
    return 0;
}

int cuMemFree_v2(uint64_t pointer) { free((void *)pointer); say("free"); return 0; }

int cuMemsetD8_v2(uint64_t pointer, unsigned char value, size_t bytes) {
    memset((void *)pointer, value, bytes);
    say("memset %u %zu end %llu", value, bytes, (unsigned long long)((pointer + bytes) % 512));
    return 0;
}

int cuMemcpyHtoD_v2(uint64_t pointer, const void *source, size_t bytes) {
    memcpy((void *)pointer, source, bytes);
    say("copy %zu end %llu", bytes, (unsigned long long)((pointer + bytes) % 512));
    return 0;
}

int cuFuncSetAttribute(void *function, int attribute, int value) {
    say("attribute %s %d %d", (const char *)function, attribute, value);
    return 0;
}

int cuLaunchKernel(void *function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                   unsigned by, unsigned bz, unsigned shared, void *stream, void **params,
                   void **extra) {
    const char *name = function;
    say("launch %s grid %u %u %u block %u %u %u shared %u", name, gx, gy, gz, bx, by, bz, shared);
    if (strcmp(name, "relu_f32") == 0) {
        const float *x = *(const float **)params[0];
        float *y = *(float **)params[1];
        long long n = *(long long *)params[2];
        double sum = 0;
        for (long long i = 0; i < n; i++) {
            y[i] = x[i] > 0 ? x[i] : 0;
            sum += y[i];
        }
        say("relu %lld sum %.3f", n, sum);
    }
    return 0;
}
