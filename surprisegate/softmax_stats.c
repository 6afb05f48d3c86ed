/* What each decoded token needs of its logits (gate/surprise.py: the greedy choice, surprise, entropy), in
 * one pass that writes nothing: numpy takes six passes and two 200 KB temporaries for the same.
 * native.py compiles it once per machine. */
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <string.h>

/* x86-64 with GCC: clones for AVX-512 and AVX2, the one this CPU runs picked at load time. Elsewhere the
 * vector code below compiles for the machine's own vector unit (or none). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define VECTOR_CLONES
#endif

typedef float f8 __attribute__((vector_size(32)));
typedef int32_t i8 __attribute__((vector_size(32)));

/* exp(d) for -87 <= d <= 0, eight at a time in float32 (Cephes expf: d = k ln2 + r, a degree-6 polynomial
 * in r, times 2^k), with GCC's vector extensions: no intrinsics, so one source serves every x86 clone
 * below (and other CPUs). Relative error ~2e-7. */
static inline __attribute__((always_inline)) f8 exp8_nonpositive(f8 d) {
    const f8 magic = (f8){0} + 12582912.0f; /* 1.5 * 2^23: adding it rounds d / ln2 to an integer k */
    f8 t = d * 1.44269504088896341f + magic;
    i8 k_bits = (i8)t;
    f8 k = t - magic;
    f8 r = d - k * 0.693359375f + k * 2.12194440e-4f; /* ln2 in two parts: r exact to float precision */
    f8 p = (f8){0} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    i8 scale = (k_bits - 0x4B400000 + 127) << 23; /* 2^k as float bits */
    return p * (f8)scale;
}

/* The floor below which a term counts as exp(-87) (~1.6e-38: nothing next to the largest term, which is
 * 1); a -inf logit (a masked token) so adds a tiny number, not a NaN. */
static inline __attribute__((always_inline)) f8 floor87(f8 d) {
    const f8 lo = (f8){0} - 87.0f;
    i8 below = d < lo;
    return (f8)(((i8)d & ~below) | ((i8)lo & below));
}

/* One pass over the logits x[0..n): returns the index of the largest (the first, as numpy's argmax), and
 * writes out[0] = m = max_i x_i, out[1] = sum_i exp(x_i - m), out[2] = sum_i exp(x_i - m) * (x_i - m).
 * Block by block (1024 values, 4 KB: the block's max is read from memory, its sums from L1): the sums are
 * kept relative to the running max and rescaled when a block raises it, so the logits are fetched once.
 * Right after a decode that fetch is most of the cost (another core wrote them). Float lanes within a
 * block, doubles across blocks: ~1e-7 relative error however long the vocabulary (double lanes cost 2.5x
 * with GCC 12's conversions). */
VECTOR_CLONES
int64_t surprisegate_softmax_stats(const float *x, size_t n, double *out) {
    enum { BLOCK = 1024 };
    double total = 0.0, weighted = 0.0;
    float m = -INFINITY;
    size_t best_block = 0;
    for (size_t start = 0; start < n; start += BLOCK) {
        size_t len = n - start < BLOCK ? n - start : BLOCK, whole = len / 8 * 8;
        const float *b = x + start;
        f8 lane_max = (f8){0} - INFINITY;
        for (size_t i = 0; i < whole; i += 8) {
            f8 v;
            memcpy(&v, b + i, sizeof v);
            i8 more = v > lane_max;
            lane_max = (f8)(((i8)v & more) | ((i8)lane_max & ~more));
        }
        float block_max = -INFINITY;
        for (int j = 0; j < 8; j++) block_max = lane_max[j] > block_max ? lane_max[j] : block_max;
        for (size_t i = whole; i < len; i++) block_max = b[i] > block_max ? b[i] : block_max;
        if (block_max > m) { /* a new running max: what was summed relative to the old one is rescaled */
            if (m != -INFINITY) {
                double shift = (double)m - (double)block_max; /* < 0 */
                double scale = exp(shift);
                weighted = scale * (weighted + shift * total);
                total = scale * total;
            }
            m = block_max;
            best_block = start;
        }
        f8 lane_e = {0}, lane_ed = {0};
        for (size_t i = 0; i < whole; i += 8) {
            f8 v;
            memcpy(&v, b + i, sizeof v);
            f8 d = floor87(v - m);
            f8 e = exp8_nonpositive(d);
            lane_e += e;
            lane_ed += e * d;
        }
        for (int j = 0; j < 8; j++) {
            total += lane_e[j];
            weighted += lane_ed[j];
        }
        for (size_t i = whole; i < len; i++) { /* the tail, one at a time through the same vector code */
            f8 d = floor87((f8){0} + (b[i] - m));
            f8 e = exp8_nonpositive(d);
            total += e[0];
            weighted += (double)(e[0] * d[0]);
        }
    }
    size_t argmax = best_block; /* the first block that reached m holds its first occurrence */
    while (argmax < n && x[argmax] != m) {
        argmax++;
    }
    out[0] = m;
    out[1] = total;
    out[2] = weighted;
    return argmax < n ? (int64_t)argmax : 0; /* all NaN: no max; the caller's twin decides */
}
