/* Includes the header named by ROICORE_TYPED once per dtype, float32 then float64, with
 * these defined for it:
 *   T      the element type          SFX    the name suffix, f32 or f64
 *   VT     a 32-byte vector of T     LANES  values per vector
 *   MT     a vector of lane masks    IT     a mask's element type
 *   UMT    MT, unsigned             UIT    UMT's element type
 *   AVX2_MAX(v, m)         v > m ? v : m per lane as one instruction (AVX2 code only)
 *   STORE_INDICES(p, idx)  an MT of indices stored as LANES int32 at p
 * Usage, in an operator family's .c file:
 *     #define ROICORE_TYPED "roi_align_typed.h"
 *     #include "dtypes.h"
 * No include guard: each inclusion instantiates another header. */
#ifdef ROICORE_X86_DISPATCH
#include <immintrin.h>
#endif

#define T float
#define SFX f32
#define VT roicore_vf32
#define MT roicore_vm32
#define IT int32_t
#define UMT roicore_vu32
#define UIT uint32_t
#define LANES 8
#define AVX2_MAX(v, m) _mm256_max_ps((__m256)(v), (__m256)(m))
#define STORE_INDICES(p, idx) memcpy((p), &(idx), sizeof(idx))
#include ROICORE_TYPED
#undef T
#undef SFX
#undef VT
#undef MT
#undef IT
#undef UMT
#undef UIT
#undef LANES
#undef AVX2_MAX
#undef STORE_INDICES

#define T double
#define SFX f64
#define VT roicore_vf64
#define MT roicore_vm64
#define IT int64_t
#define UMT roicore_vu64
#define UIT uint64_t
#define LANES 4
#define AVX2_MAX(v, m) _mm256_max_pd((__m256d)(v), (__m256d)(m))
#define STORE_INDICES(p, idx)                                                          \
    do {                                                                               \
        const roicore_vi32x4 narrow_ = __builtin_convertvector((idx), roicore_vi32x4); \
        memcpy((p), &narrow_, sizeof narrow_);                                         \
    } while (0)
#include ROICORE_TYPED
#undef T
#undef SFX
#undef VT
#undef MT
#undef IT
#undef UMT
#undef UIT
#undef LANES
#undef AVX2_MAX
#undef STORE_INDICES

#undef ROICORE_TYPED
