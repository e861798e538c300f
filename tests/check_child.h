/* check_child.h — peak-RSS measurement for tests (test_memory, test_plan):
 * each configuration runs in a forked child, whose peak RSS is its own, and
 * its baseline is the RSS at its start. Include after check.h. */
#ifndef FT_CHECK_CHILD_H
#define FT_CHECK_CHILD_H

#include "core/mem.h"

#include <stddef.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

/* AddressSanitizer's shadow memory, redzones and quarantine are resident
 * too: there an RSS comparison means nothing (the fault injection all the
 * more: leaks on the error paths). */
#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

/* Runs fn in a child and passes on its verdict. */
static inline void in_child(void (*fn)(void *), void *arg) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); CHECK(0); return; }
    if (pid == 0) {
        check_failed_ = 0;
        /* the parent's peaks are not this configuration's */
        ft_mem_reset_peaks();
        fn(arg);
        fflush(stdout);
        fflush(stderr);
        _exit(check_failed_ ? 1 : 0);
    }
    int ws = 0;
    CHECK(waitpid(pid, &ws, 0) == pid);
    CHECKF(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "child status 0x%x", ws);
}

/* The kernel's peak RSS reset to now, and now's RSS: what the process holds
 * before a configuration loads anything. */
static inline size_t rss_baseline(void) {
    size_t baseline = 0;
    CHECK(ft_mem_rss_reset_peak());
    CHECK(ft_mem_rss(&baseline, NULL));
    return baseline;
}

#endif
