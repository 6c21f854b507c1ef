// Element-wise vector addition: out[i] = a[i] + b[i] for i < n.
__kernel void vadd(__global const float* a, __global const float* b, __global float* out, const uint n) {
  const size_t i = get_global_id(0);
  if (i < n) out[i] = a[i] + b[i];
}
