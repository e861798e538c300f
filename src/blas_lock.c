/* blas_lock.c — every cblas_sgemm / cblas_sgemv call in the program runs under
 * one process-wide mutex. The single-threaded OpenBLAS that ftune links (see
 * the Makefile) is not safe to call from two threads at once: Debian builds it
 * without USE_LOCKING, and concurrent sgemm calls share its work buffers
 * (test_parallel's test_blas_in_tasks saw wrong products; a stress loop of
 * 8 threads x 200 sgemm of 97x97 got one of 1600 wrong). The Makefile links
 * with --wrap for these symbols, so the calls in every file, including those
 * that include <cblas.h> directly, come here first; a BLAS function the
 * library starts to use must be added to BLAS_WRAP there and here. */
#include <cblas.h>
#include <pthread.h>

static pthread_mutex_t blas_mutex = PTHREAD_MUTEX_INITIALIZER;

void __real_cblas_sgemm(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE ta, const enum CBLAS_TRANSPOSE tb,
                        const blasint M, const blasint N, const blasint K, const float alpha, const float *A,
                        const blasint lda, const float *B, const blasint ldb, const float beta, float *C,
                        const blasint ldc);
void __real_cblas_sgemv(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE trans, const blasint m,
                        const blasint n, const float alpha, const float *a, const blasint lda, const float *x,
                        const blasint incx, const float beta, float *y, const blasint incy);
void __wrap_cblas_sgemm(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE ta, const enum CBLAS_TRANSPOSE tb,
                        const blasint M, const blasint N, const blasint K, const float alpha, const float *A,
                        const blasint lda, const float *B, const blasint ldb, const float beta, float *C,
                        const blasint ldc);
void __wrap_cblas_sgemv(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE trans, const blasint m,
                        const blasint n, const float alpha, const float *a, const blasint lda, const float *x,
                        const blasint incx, const float beta, float *y, const blasint incy);

void __wrap_cblas_sgemm(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE ta, const enum CBLAS_TRANSPOSE tb,
                        const blasint M, const blasint N, const blasint K, const float alpha, const float *A,
                        const blasint lda, const float *B, const blasint ldb, const float beta, float *C,
                        const blasint ldc) {
    pthread_mutex_lock(&blas_mutex);
    __real_cblas_sgemm(order, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    pthread_mutex_unlock(&blas_mutex);
}

void __wrap_cblas_sgemv(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE trans, const blasint m,
                        const blasint n, const float alpha, const float *a, const blasint lda, const float *x,
                        const blasint incx, const float beta, float *y, const blasint incy) {
    pthread_mutex_lock(&blas_mutex);
    __real_cblas_sgemv(order, trans, m, n, alpha, a, lda, x, incx, beta, y, incy);
    pthread_mutex_unlock(&blas_mutex);
}
