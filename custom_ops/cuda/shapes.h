/* The geometry of a map builder as plain C data: what the C ABI (cuda/abi.h) takes and what the
 * bodies (cuda/bodies/maps.h) compute with, one definition for both. */
#ifndef SPARSE_LOWER_CUDA_SHAPES_H_
#define SPARSE_LOWER_CUDA_SHAPES_H_

#include <stdint.h>

/* One dimension of a conv (p: the begin pad):
 *   convolution             i = o·s − p + k·d
 *   transposed convolution  o = i·s − p + k·d
 * A submanifold conv is the convolution with s = 1 and p = (K − 1)/2·d, its output grid its input grid. */
typedef struct {
  int64_t kernel, stride, pad, dilation, in_extent, out_extent;
} SlAxis;

/* 1 to 3 dimensions; transposed = 1 for a transposed conv's relation. */
typedef struct {
  int32_t dims;
  int32_t transposed;
  SlAxis axis[3];
} SlMapShape;

#endif /* SPARSE_LOWER_CUDA_SHAPES_H_ */
