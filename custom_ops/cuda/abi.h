/* The C ABI of the gpu target's kernels, to call them without onnxruntime (ctypes, with buffers from
 * CuPy or PyTorch: sparse_lower/cuda_kernels.py). Two libraries export it: libsparse_lower_cuda.so, where
 * the pointers are device memory and `stream` a cudaStream_t (0: the default stream), and
 * libsparse_lower_emulated.so, where they are host memory and the same bodies run on the host (`stream`
 * is ignored).
 *
 * Every function returns 0 when it succeeded, 1 when the inputs were refused or CUDA failed (the
 * message, as the CPU library words it, in `error`: `error_size` bytes, NUL-terminated), or, for the
 * three whose output row count depends on the data, 2 when that count (written to *count) exceeds
 * `capacity`, the rows the caller allocated: nothing is written then, and a second call with room
 * for *count rows writes them. Semantics: docs/custom_ops.md, op by op; the shapes are the
 * arguments'. */
#ifndef SPARSE_LOWER_CUDA_ABI_H_
#define SPARSE_LOWER_CUDA_ABI_H_

#include <stdint.h>

#include "cuda/shapes.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SL_EXPORT __attribute__((visibility("default")))

/* "cuda" or "emulated". */
SL_EXPORT const char* sl_backend(void);

/* Input checks: by default each function reports its own (status 1, the message in `error`). After
 * sl_defer_checks(stream, 1) the functions on `stream` leave their verdicts on the device, read back
 * nothing but their output sizes, and return 0; sl_report(stream, ...) then waits for the stream and
 * returns 1 with the message of the first refused input since the last report (0 when there was none).
 * What a function computes after a refused input is not to be used. */
SL_EXPORT int sl_defer_checks(void* stream, int32_t on);
/* A new stream on GPU `device` for the functions and onnxruntime's CUDA provider to share (its
 * user_compute_stream); the emulated library gives a null stream. */
SL_EXPORT int sl_new_stream(int32_t device, void** stream, char* error, int64_t error_size);
SL_EXPORT int sl_report(void* stream, char* error, int64_t error_size);

/* SubmanifoldMap: nbr [rows, K] of coords [rows, 1 + D]. */
SL_EXPORT int sl_submanifold_map(void* stream, const SlMapShape* map, const int64_t* coords, int64_t rows,
                                 int32_t dense, int64_t* nbr, char* error, int64_t error_size);

/* StridedMap / TransposedMap: out_coords [*count, 1 + D] and nbr [*count, K] of coords [rows, 1 + D]. */
SL_EXPORT int sl_reached_map(void* stream, const SlMapShape* map, const int64_t* coords, int64_t rows, int32_t dense,
                             int64_t capacity, int64_t* count, int64_t* out_coords, int64_t* nbr, char* error,
                             int64_t error_size);

/* TargetMap: nbr [target_rows, K] of target_coords [target_rows, 1 + D] reading coords [rows, 1 + D]. */
SL_EXPORT int sl_target_map(void* stream, const SlMapShape* map, const int64_t* coords, int64_t rows,
                            const int64_t* targets, int64_t target_rows, int32_t dense, int64_t* nbr, char* error,
                            int64_t error_size);

/* SiteIndex: sites [rows] of coords [rows, 1 + dims] in a dense [batch_size, C, *extent] tensor. */
SL_EXPORT int sl_site_index(void* stream, int32_t dims, const int64_t* extent, int64_t batch_size,
                            const int64_t* coords, int64_t rows, int64_t* sites, char* error, int64_t error_size);

/* SiteOrder: out_coords [rows, 1 + dims], order [rows] and rank [rows] of coords [rows, 1 + dims] in a grid of
   `extent`. */
SL_EXPORT int sl_site_order(void* stream, int32_t dims, const int64_t* extent, const int64_t* coords, int64_t rows,
                            int64_t* out_coords, int64_t* order, int64_t* rank, char* error, int64_t error_size);

/* ActiveSites: coords [*count, 1 + dims] and sites [*count] of x [batch, channels, *extent]. */
SL_EXPORT int sl_active_sites(void* stream, const float* x, int64_t batch, int64_t channels, int32_t dims,
                              const int64_t* extent, int64_t capacity, int64_t* count, int64_t* coords, int64_t* sites,
                              char* error, int64_t error_size);

/* CoalesceMap: out_coords [*count, 1 + dims] and members [*count, *width] of coords [rows, 1 + dims], whose
 * rows may repeat a site; `members` > 0 fixes the table's width (a site with more rows is refused). *width
 * holds the columns the caller allocated and returns the columns needed: 2 also when they differ. */
SL_EXPORT int sl_coalesce_map(void* stream, int32_t dims, const int64_t* extent, const int64_t* coords, int64_t rows,
                              int64_t members, int64_t capacity, int64_t* count, int64_t* width, int64_t* out_coords,
                              int64_t* table, char* error, int64_t error_size);

/* IndexedUnfold: y [rows, taps, channels] from x: rows [limit, channels], or with dense = 1 a
 * [B, channels, *S] tensor of `volume` sites per batch (limit = B·volume). */
SL_EXPORT int sl_unfold(void* stream, const float* x, int64_t limit, int64_t channels, int32_t dense, int64_t volume,
                        const int64_t* idx, int64_t rows, int64_t taps, float* y, char* error, int64_t error_size);

/* IndexedFold: y = rows [targets, channels] (dense = 0; from init when given: [targets, channels] with
 * init_rows = 1, else [channels] on every row) or dense [B, channels, *S] (targets = B·volume), plus
 * rows[p] at idx[p] for p < count in ascending p. */
SL_EXPORT int sl_fold(void* stream, const float* rows, const int64_t* idx, int64_t count, int64_t channels,
                      int64_t targets, int32_t dense, int64_t volume, const float* init, int32_t init_rows, float* y,
                      char* error, int64_t error_size);

/* IndexedConv: y [rows, cout] = act(bias + Σ_k x[idx[m, k]] · w[k] + residual); bias and residual may be
 * null; half = 1 multiplies in float16 on tensor cores, 2 in bfloat16, summing in float32 (0: float32);
 * `splits` blocks share each output tile's taps (0: as many as fill the GPU, the library's choice; 1: none). */
SL_EXPORT int sl_indexed_conv(void* stream, const float* x, int64_t inputs, int64_t cin, const int64_t* idx,
                              int64_t rows, int64_t taps, const float* w, int64_t cout, const float* bias,
                              const float* residual, int32_t relu, int32_t half, int32_t splits, float* y,
                              char* error, int64_t error_size);

/* IndexedConvInt8: y [rows, cout] = act(bias + Σ_k w_scale[k] · Σ_c q(x[idx[m, k]], x_scale) · w[k] + residual),
 * w int8 [taps, cin, cout] within ±127 (cin ≤ 512) or ±63 (cin ≤ 1024), x_scale [cin], w_scale [taps, cout];
 * the CPU library's bits. */
SL_EXPORT int sl_indexed_conv_int8(void* stream, const float* x, int64_t inputs, int64_t cin, const int64_t* idx,
                                   int64_t rows, int64_t taps, const int8_t* w, int64_t cout, const float* x_scale,
                                   const float* w_scale, const float* bias, const float* residual, int32_t relu,
                                   float* y, char* error, int64_t error_size);

#ifdef __cplusplus
}
#endif

#endif /* SPARSE_LOWER_CUDA_ABI_H_ */
