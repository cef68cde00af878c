/* The channel-blocked parallel skeleton, for float32 and float64 (see blocked.h). */
#include "blocked.h"

#define T float
#define SFX f32
#define LANES 8
#include "blocked_typed.h"
#undef T
#undef SFX
#undef LANES

#define T double
#define SFX f64
#define LANES 4
#include "blocked_typed.h"
#undef T
#undef SFX
#undef LANES
