/* check.h — the tiny test harness every tests/test_*.c uses. Each test
 * binary prints "PASS name" or "FAIL name: why" per test and exits non-zero
 * if any failed; tests/run.sh adds the lines up. */
#ifndef FT_CHECK_H
#define FT_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_failed_ = 0;   /* failures inside the current test */
static int check_n_fail_ = 0;   /* tests that failed in this binary */

#define CHECK(cond) do { if (!(cond)) { \
    fprintf(stderr, "  %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); check_failed_ = 1; } } while (0)
#define CHECKF(cond, ...) do { if (!(cond)) { \
    fprintf(stderr, "  %s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); check_failed_ = 1; } } while (0)
/* Checks that a library call returns FTUNE_OK, printing the error if not. */
#define CHECK_OK(call) do { ftune_status st_ = (call); if (st_ != FTUNE_OK) { \
    fprintf(stderr, "  %s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, ftune_status_name(st_), ftune_last_error()); \
    check_failed_ = 1; } } while (0)

#define RUN(fn) do { check_failed_ = 0; fn(); \
    if (check_failed_) { printf("FAIL %s\n", #fn); check_n_fail_++; } else printf("PASS %s\n", #fn); \
    fflush(stdout); } while (0)
#define CHECK_EXIT() return check_n_fail_ ? 1 : 0

/* Path of the shared test data: $FTUNE_DATA or ../shared/data. */
static inline const char *check_data_dir(void) {
    const char *d = getenv("FTUNE_DATA");
    return d && *d ? d : "../shared/data";
}
static inline char *check_data_path(char *buf, size_t cap, const char *rel) {
    snprintf(buf, cap, "%s/%s", check_data_dir(), rel);
    return buf;
}

/* Max over i of |a-b| / max(|b|, floor): relative error with a floor so that
 * near-zero references do not blow it up. */
static inline double check_max_rel_err(const float *a, const float *b, long n, double floor_) {
    double m = 0;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        double r = d / fmax(fabs((double)b[i]), floor_);
        if (r > m || isnan(r)) m = isnan(r) ? INFINITY : r;
    }
    return m;
}

#endif
