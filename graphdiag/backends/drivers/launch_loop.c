/* graphdiag's eager launch loop: a run of prepared kernel launches issued in one call from Python.
 *
 * Each row is three 64-bit words: the address of a CUlaunchConfig (cuda.bindings' own struct, built once per
 * geometry and stream), the CUfunction, and the kernelParams array (void *[1] pointing at the KPARAMS
 * record). `launch` is libcuda's cuLaunchKernelEx. The rows are launched in order; the first launch that
 * fails stops the run. Returns how many launched; *err holds the failing CUresult (0 when all did).
 *
 * Written in C because a launch made from Python through cuda.bindings costs ~2 us of host time more than
 * the driver call itself (lent H200, python -m graphdiag.bench.driver: 6.2 us a launch one by one, 4.1 us
 * through this loop, on a slow host), and an eager decode step of a quantised 1b model is ~300 launches
 * whose GPU work is often shorter than that: ggml issues the same launches from C++.
 */
#include <stdint.h>

typedef int (*launch_ex_fn)(const void *config, void *f, void **kernel_params, void **extra);

int64_t graphdiag_launch_rows(void *launch, const uint64_t *rows, int64_t n, int32_t *err)
{
    launch_ex_fn fn = (launch_ex_fn)launch;
    *err = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint64_t *r = rows + 3 * i;
        int e = fn((const void *)(uintptr_t)r[0], (void *)(uintptr_t)r[1], (void **)(uintptr_t)r[2], 0);
        if (e) {
            *err = e;
            return i;
        }
    }
    return n;
}
