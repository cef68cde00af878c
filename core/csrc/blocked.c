/* The channel-blocked parallel skeleton, for float32 and float64 (see blocked.h). */
#include "blocked.h"

#define ROICORE_TYPED "blocked_typed.h"
#include "dtypes.h"
