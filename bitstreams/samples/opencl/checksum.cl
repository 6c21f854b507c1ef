// Order-independent 32-bit checksum: *sum = sum over i < n of (data[i] ^ (i * 2654435761)) modulo 2^32.
// *sum must be zero before the run. Atomic additions make the result independent of work-item order.
__kernel void checksum(__global const uint* data, const uint n, volatile __global uint* sum) {
  const uint i = (uint)get_global_id(0);
  if (i < n) atomic_add(sum, data[i] ^ (i * 2654435761u));
}
