/* nfc.c — Unicode Normalization Form C, for the tokenizers whose files ask
 * for it (tokenizer.json's NFC normalizer, Qwen2's): canonical
 * decomposition, canonical ordering, canonical composition (UAX #15), on
 * the tables scripts/gen_unicode_nfc.py generates (unicode_nfc.h) and
 * Hangul by arithmetic. Text made only of code points below U+0300 (no
 * UTF-8 byte from 0xCC up) is already NFC and is returned as it is. */
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_nfc.h"

#include <stdlib.h>
#include <string.h>

#define N_OF(a) (sizeof (a) / sizeof (a)[0])

enum { S_BASE = 0xAC00, L_BASE = 0x1100, V_BASE = 0x1161, T_BASE = 0x11A7, L_N = 19, V_N = 21, T_N = 28,
       N_N = V_N * T_N, S_N = L_N * N_N };

static int ccc(uint32_t cp) {
    size_t lo = 0, hi = N_OF(ft_nfc_ccc);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (ft_nfc_ccc[mid][0] < cp) lo = mid + 1;
        else hi = mid;
    }
    return lo < N_OF(ft_nfc_ccc) && ft_nfc_ccc[lo][0] == cp ? (int)ft_nfc_ccc[lo][1] : 0;
}

/* The full canonical decomposition of cp: *len code points at the returned
 * pointer, or NULL when cp decomposes to itself (Hangul is the caller's). */
static const uint32_t *decomp(uint32_t cp, uint32_t *len) {
    size_t lo = 0, hi = N_OF(ft_nfc_decomp);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (ft_nfc_decomp[mid][0] < cp) lo = mid + 1;
        else hi = mid;
    }
    if (lo == N_OF(ft_nfc_decomp) || ft_nfc_decomp[lo][0] != cp) return NULL;
    *len = ft_nfc_decomp[lo][2];
    return ft_nfc_decomp_cps + ft_nfc_decomp[lo][1];
}

/* The primary composite of a + b, or 0. */
static uint32_t compose(uint32_t a, uint32_t b) {
    if (a - L_BASE < L_N && b - V_BASE < V_N) return S_BASE + ((a - L_BASE) * V_N + (b - V_BASE)) * T_N;
    if (a - S_BASE < S_N && (a - S_BASE) % T_N == 0 && b - T_BASE - 1 < T_N - 1) return a + (b - T_BASE);
    uint64_t key = ((uint64_t)a << 21) | b;
    size_t lo = 0, hi = N_OF(ft_nfc_comp);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (ft_nfc_comp[mid][0] < key) lo = mid + 1;
        else hi = mid;
    }
    return lo < N_OF(ft_nfc_comp) && ft_nfc_comp[lo][0] == key ? (uint32_t)ft_nfc_comp[lo][1] : 0;
}

/* One code point from valid UTF-8 at s (the tokenizer checked it). */
static uint32_t utf8_next(const unsigned char *s, size_t n, size_t *i) {
    unsigned char c = s[*i];
    int k = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (*i + (size_t)k > n) k = 1;
    uint32_t cp = k == 1 ? c : k == 2 ? c & 0x1F : k == 3 ? c & 0x0F : c & 0x07;
    for (int j = 1; j < k; j++) cp = (cp << 6) | (s[*i + (size_t)j] & 0x3F);
    *i += (size_t)k;
    return cp;
}

static size_t utf8_put(char *o, uint32_t cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

ftune_status ft_nfc(const char *text, size_t n, char **out, size_t *out_n) {
    *out = NULL;
    *out_n = 0;
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < n && s[i] < 0xCC) i++;
    if (i == n) return FTUNE_OK; /* below U+0300 only: already NFC */
    /* decomposed code points: at most 4 per input byte (the longest full
     * decomposition, 4 code points, of a 2-byte character is under 4 per byte) */
    size_t cap = 4 * n + 4, m = 0;
    uint32_t *cp = malloc(cap * sizeof *cp);
    if (!cp) return ft_err(FTUNE_ERR_NOMEM, "tokenizer: out of memory normalizing %zu bytes", n);
    for (i = 0; i < n;) {
        uint32_t c = utf8_next(s, n, &i), len = 0;
        const uint32_t *d;
        if (c - S_BASE < S_N) {
            uint32_t k = c - S_BASE;
            cp[m++] = L_BASE + k / N_N;
            cp[m++] = V_BASE + (k % N_N) / T_N;
            if (k % T_N) cp[m++] = T_BASE + k % T_N;
        } else if ((d = decomp(c, &len))) {
            for (uint32_t j = 0; j < len; j++) cp[m++] = d[j];
        } else {
            cp[m++] = c;
        }
    }
    /* canonical order: a stable sort of each run of non-starters by class */
    for (size_t a = 0; a < m;) {
        if (!ccc(cp[a])) { a++; continue; }
        size_t b = a;
        while (b < m && ccc(cp[b])) b++;
        for (size_t x = a + 1; x < b; x++)
            for (size_t y = x; y > a && ccc(cp[y - 1]) > ccc(cp[y]); y--) {
                uint32_t t = cp[y]; cp[y] = cp[y - 1]; cp[y - 1] = t;
            }
        a = b;
    }
    /* composition: each character with the last starter, unless blocked */
    size_t w = 0, starter = SIZE_MAX;
    int last = 0;
    for (size_t r = 0; r < m; r++) {
        uint32_t c = cp[r];
        int k = ccc(c);
        if (starter != SIZE_MAX && (w - 1 == starter || (last != 0 && last < k))) {
            uint32_t x = compose(cp[starter], c);
            if (x) { cp[starter] = x; continue; }
        }
        if (k == 0) starter = w;
        cp[w++] = c;
        last = k;
    }
    char *o = malloc(4 * w + 1);
    if (!o) { free(cp); return ft_err(FTUNE_ERR_NOMEM, "tokenizer: out of memory normalizing %zu bytes", n); }
    size_t on = 0;
    for (size_t r = 0; r < w; r++) on += utf8_put(o + on, cp[r]);
    o[on] = 0;
    free(cp);
    *out = o;
    *out_n = on;
    return FTUNE_OK;
}
