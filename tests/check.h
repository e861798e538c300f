/* check.h — the tiny test harness every tests/test_*.c uses. Each test
 * binary prints "PASS name" or "FAIL name: why" per test, "SKIP name: why"
 * for what cannot run here (check_skip), and exits non-zero if any failed;
 * tests/run.sh adds the lines up. */
#ifndef FT_CHECK_H
#define FT_CHECK_H

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_failed_ = 0;   /* failures inside the current test */
static int check_n_fail_ = 0;   /* tests that failed in this binary */
static const char *check_test_ = NULL; /* the test RUN is running */
static bool check_skipped_ = false;    /* the current test skipped itself whole */

#define CHECK(cond) do { if (!(cond)) { \
    fprintf(stderr, "  %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); check_failed_ = 1; } } while (0)
#define CHECKF(cond, ...) do { if (!(cond)) { \
    fprintf(stderr, "  %s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); check_failed_ = 1; } } while (0)
/* Checks that a library call returns FTUNE_OK, printing the error if not. */
#define CHECK_OK(call) do { ftune_status st_ = (call); if (st_ != FTUNE_OK) { \
    fprintf(stderr, "  %s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, ftune_status_name(st_), ftune_last_error()); \
    check_failed_ = 1; } } while (0)

#define RUN(fn) do { check_failed_ = 0; check_skipped_ = false; check_test_ = #fn; fn(); \
    if (check_failed_) { printf("FAIL %s\n", #fn); check_n_fail_++; } \
    else if (!check_skipped_) printf("PASS %s\n", #fn); \
    check_test_ = NULL; fflush(stdout); } while (0)
#define CHECK_EXIT() return check_n_fail_ ? 1 : 0

/* What cannot run here (tests/lib.sh's skip_or_fail for the scripts):
 * CHECK_HARDWARE, the CPU lacks an instruction set -- a skip wherever it
 * runs, FTUNE_REQUIRE=all included; CHECK_TOOL, the environment lacks a
 * program, package or file that scripts/setup.sh provides -- a skip, but a
 * failure under FTUNE_REQUIRE=all (CI), so that nothing passes there by
 * not running. */
typedef enum { CHECK_HARDWARE, CHECK_TOOL } check_skip_kind;

/* Prints "SKIP name: why". name NULL: the whole current test is skipped
 * (RUN then prints no PASS line for it; return after the call); otherwise a
 * part of it, or of the binary, named name. A CHECK_TOOL skip under
 * FTUNE_REQUIRE=all is a failure instead: of the current test inside RUN,
 * else a FAIL line of its own. */
static inline void check_skip(check_skip_kind kind, const char *name, const char *fmt, ...) {
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    const char *req = getenv("FTUNE_REQUIRE");
    const char *who = name ? name : check_test_ ? check_test_ : "?";
    if (kind == CHECK_TOOL && req && !strcmp(req, "all")) {
        if (check_test_) {
            fprintf(stderr, "  %s: %s (FTUNE_REQUIRE=all: a missing tool is a failure)\n", who, why);
            check_failed_ = 1;
        } else {
            printf("FAIL %s: %s (FTUNE_REQUIRE=all: a missing tool is a failure)\n", who, why);
            check_n_fail_++;
        }
    } else {
        printf("SKIP %s: %s%s\n", who, why,
               kind == CHECK_HARDWARE ? " (hardware, not a missing tool: a skip under FTUNE_REQUIRE=all too)" : "");
        if (!name) check_skipped_ = true;
    }
    fflush(stdout);
}

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
