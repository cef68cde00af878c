/* The one place roicore talks to OpenMP.  The same .pyx compiles with and without it:
 * without _OPENMP the omp_* calls become sequential no-ops (scikit-learn/scikit-image shim). */
#ifndef ROICORE_OMP_H
#define ROICORE_OMP_H
#ifdef _OPENMP
#include <omp.h>
#define ROICORE_HAVE_OPENMP 1
#else
#define ROICORE_HAVE_OPENMP 0
static inline int omp_get_max_threads(void) { return 1; }
static inline int omp_get_thread_num(void) { return 0; }
#endif
#endif
