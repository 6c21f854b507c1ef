// Square matrix multiply, row-major: c = a * b for n x n matrices. Global size: n x n (dimension 0 = column).
__kernel void matmul(__global const float* a, __global const float* b, __global float* c, const uint n) {
  const size_t col = get_global_id(0);
  const size_t row = get_global_id(1);
  if (row >= n || col >= n) return;
  float acc = 0.0f;
  for (uint k = 0; k < n; ++k) acc += a[row * n + k] * b[k * n + col];
  c[row * n + col] = acc;
}
