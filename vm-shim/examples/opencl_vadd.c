/* Acquire an OpenCL device through the C ABI, run the sample vadd kernel on it with real data, verify the result.
 *
 *   accelpool-example-opencl-vadd-c URI TOKEN GUEST [KIND] [KERNEL.cl] [N]
 *
 * KIND defaults to "cpu" (PoCL's CPU device), KERNEL.cl to the sample bitstreams/samples/opencl/vadd.cl. */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

#include <accelpool/accelpool.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef ACCELPOOL_SAMPLE_VADD
#define ACCELPOOL_SAMPLE_VADD "vadd.cl"
#endif

static char* read_all(const char* path) {
  FILE* f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char* buf = malloc((size_t)n + 1);
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  if (buf) buf[n] = '\0';
  fclose(f);
  return buf;
}

/* Returns 0 when every element was right. */
static int run_vadd(int platform, int device, const char* source, cl_uint n) {
  cl_platform_id platforms[16];
  cl_uint np = 0;
  if (clGetPlatformIDs(16, platforms, &np) != CL_SUCCESS || platform < 0 || (cl_uint)platform >= np) {
    fprintf(stderr, "no OpenCL platform %d\n", platform);
    return 1;
  }
  cl_device_id devices[64];
  cl_uint nd = 0;
  if (clGetDeviceIDs(platforms[platform], CL_DEVICE_TYPE_ALL, 64, devices, &nd) != CL_SUCCESS || device < 0 ||
      (cl_uint)device >= nd) {
    fprintf(stderr, "no OpenCL device %d on platform %d\n", device, platform);
    return 1;
  }
  cl_device_id dev = devices[device];
  cl_int err = CL_SUCCESS;
  cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
  cl_command_queue q = clCreateCommandQueue(ctx, dev, 0, &err);
  cl_program prog = clCreateProgramWithSource(ctx, 1, &source, NULL, &err);
  if (clBuildProgram(prog, 1, &dev, "", NULL, NULL) != CL_SUCCESS) {
    fprintf(stderr, "vadd: build failed\n");
    return 1;
  }
  float* a = malloc(n * sizeof(float));
  float* b = malloc(n * sizeof(float));
  float* out = malloc(n * sizeof(float));
  for (cl_uint i = 0; i < n; ++i) {
    a[i] = (float)i;
    b[i] = 2.0f * (float)i + 1.0f;
    out[i] = -1.0f;
  }
  cl_kernel k = clCreateKernel(prog, "vadd", &err);
  cl_mem ba = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, n * sizeof(float), a, &err);
  cl_mem bb = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, n * sizeof(float), b, &err);
  cl_mem bo = clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, n * sizeof(float), NULL, &err);
  clSetKernelArg(k, 0, sizeof ba, &ba);
  clSetKernelArg(k, 1, sizeof bb, &bb);
  clSetKernelArg(k, 2, sizeof bo, &bo);
  clSetKernelArg(k, 3, sizeof n, &n);
  size_t global = n;
  err = clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, NULL);
  if (err == CL_SUCCESS) err = clEnqueueReadBuffer(q, bo, CL_TRUE, 0, n * sizeof(float), out, 0, NULL, NULL);
  cl_uint bad = 0;
  for (cl_uint i = 0; i < n; ++i) {
    if (fabsf(out[i] - (a[i] + b[i])) > 1e-3f) ++bad;
  }
  if (err != CL_SUCCESS)
    fprintf(stderr, "vadd: run failed (%d)\n", err);
  else if (bad)
    fprintf(stderr, "vadd: %u of %u results wrong\n", bad, n);
  else
    printf("vadd: %u elements verified\n", n);
  clReleaseMemObject(ba);
  clReleaseMemObject(bb);
  clReleaseMemObject(bo);
  clReleaseKernel(k);
  clReleaseProgram(prog);
  clReleaseCommandQueue(q);
  clReleaseContext(ctx);
  free(a);
  free(b);
  free(out);
  return err != CL_SUCCESS || bad != 0;
}

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s URI TOKEN GUEST [KIND] [KERNEL.cl] [N]\n", argv[0]);
    return 2;
  }
  const char* kind = argc > 4 ? argv[4] : "cpu";
  const char* kernel = argc > 5 ? argv[5] : ACCELPOOL_SAMPLE_VADD;
  cl_uint n = argc > 6 ? (cl_uint)strtoul(argv[6], NULL, 10) : (1u << 20);
  char* source = read_all(kernel);
  if (!source) {
    fprintf(stderr, "cannot read %s\n", kernel);
    return 1;
  }
  accelpool_client* client = NULL;
  accelpool_status st = accelpool_connect(argv[1], argv[2], argv[3], &client);
  if (st != ACCELPOOL_OK) {
    fprintf(stderr, "connect: [%s] %s\n", accelpool_status_name(st), accelpool_last_error());
    return 1;
  }
  accelpool_acquire_options o = accelpool_acquire_options_default();
  o.kind = kind;
  o.timeout_s = 60;
  accelpool_lease* lease = NULL;
  st = accelpool_acquire(client, &o, &lease);
  if (st != ACCELPOOL_OK) {
    fprintf(stderr, "acquire: [%s] %s\n", accelpool_status_name(st), accelpool_last_error());
    accelpool_client_free(client);
    return 1;
  }
  int platform = -1, device = -1, sub = -1, rc = 1;
  if (!accelpool_lease_device_opencl(lease, 0, &platform, &device, &sub)) {
    fprintf(stderr, "the granted device %s is not an OpenCL device\n", accelpool_lease_device(lease, 0));
  } else {
    printf("lease %llu: %s (OpenCL %d:%d)\n", (unsigned long long)accelpool_lease_id(lease),
           accelpool_lease_device(lease, 0), platform, device);
    rc = run_vadd(platform, device, source, n);
  }
  accelpool_lease_free(lease); /* releases */
  accelpool_client_free(client);
  free(source);
  return rc;
}
