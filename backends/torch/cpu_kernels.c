/* Native CPU kernels for the torch runner: a whole decode-size forward in one call.
 *
 * Why this exists: a decode step reads every weight once, so its speed is set by how fast the
 * matrix-vector products stream the weights. torch's CPU kernels (MKL, oneDNN) read fp32 rows at
 * 10-17 GB/s per core on the project's machine, and the ~40 small torch ops per layer cost about
 * as much again in dispatch. Here every matrix is streamed row by row in one sequential pass per
 * thread, with all the tokens of the batch multiplied against a row while it is in L1, and the
 * rest of a layer (RMSNorm, RoPE, KV write, attention, SiLU) is done in the same OpenMP parallel
 * region between barriers: one call from Python per forward.
 *
 * Layouts (row-major, the torch runner's own tensors):
 *   x        [T, hidden]            float32 residual stream, updated in place
 *   matrices [out, in]              Hugging Face layout; q|k|v and gate|up fused; each matrix is
 *                                   float32 rows or GGUF block rows (li_mat, below)
 *   caches   [slots, kv_heads, max_ctx, head_dim] per layer
 *   cos/ssin [max_ctx, head_dim]    rotate-half RoPE with the sign folded into ssin
 * A token attends to its own slot's entries 0..position (or the last `window` of them), written
 * by this forward before attention runs, so any ragged mix of prefill chunks and decode steps
 * gives the same result as one token at a time.
 *
 * Built by native_build.py with -O3 and the machine's ISA (-march=native, or AVX-512 hidden for
 * an AVX2 build, or -mcpu=native on ARM); the vector type below becomes AVX-512, AVX2 or NEON
 * code, with hand-written AVX-512 and AVX2 paths where the compiler's own code was slow (block
 * decoding, SiLU, the lane reduction). Every path computes the same float operations in the same
 * order, so on any build with FMA results do not depend on the ISA level it was built for (a
 * baseline x86-64 build has no FMA: its products round each multiply-add twice). With OpenMP it links
 * the libgomp torch has already loaded, so torch's threads and these are one pool; a compiler
 * without OpenMP (Apple clang) builds it single-threaded.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#else
/* Single-threaded build: the pragmas are ignored, a "parallel region" is the calling thread. */
static inline int omp_get_num_threads(void) { return 1; }
static inline int omp_get_thread_num(void) { return 0; }
#endif

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#define LI_AVX2 1
#endif

/* Tokens multiplied against one weight row while it is in L1. AVX-512 has 32 vector registers:
 * 8 tokens' 16-lane accumulators fit. AVX2 has 16 registers and a 16-lane sum takes two: above
 * 4 tokens the accumulators spill (measured by scripts/bench-native-kernels, part 1). */
#ifndef MAX_TILE
#ifdef LI_AVX2
#define MAX_TILE 4
#else
#define MAX_TILE 8
#endif
#endif
#define TT(k) ((k) < MAX_TILE ? (k) : MAX_TILE)  /* a tile size case, capped (dead above) */
/* Above this many tokens, rows go in pairs: one x load feeds two FMAs. Measured over SmolLM2's
 * matrices, 2 threads, GB/s single rows vs pairs: 2 tokens 27.4 vs 26.1, 4: 28.5 vs 26.5,
 * 8: 21.8 vs 23.1, 16: 9.0 vs 13.6. */
#ifndef PAIR_ROWS_ABOVE
#define PAIR_ROWS_ABOVE 4
#endif
#ifndef PREFETCH_FLOATS
#define PREFETCH_FLOATS 1024   /* 4 KB ahead of the row stream */
#endif
#ifndef PREFETCH_LOCALITY
#define PREFETCH_LOCALITY 2    /* into L2 */
#endif
#define PREFETCH_BYTES (PREFETCH_FLOATS * 4)

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));

#define INLINE static inline __attribute__((always_inline))

INLINE v16 load16(const float *p) { return *(const v16u *)p; }

#if defined(__AVX512F__) || defined(__F16C__) || defined(LI_AVX2)
#include <immintrin.h>
#endif

/* The vector ISA this build's hand-written paths use: 512 (AVX-512), 256 (AVX2 + FMA), 0 (the
 * compiler's generic vectors). Backend choice and the calibration read it. */
int li_isa(void) {
#if defined(__AVX512F__)
    return 512;
#elif defined(LI_AVX2)
    return 256;
#else
    return 0;
#endif
}

#ifdef LI_AVX2
/* A 16-lane vector as two AVX2 halves (lanes 0-7, 8-15). */
typedef union { v16 v; __m256 h[2]; } v16_halves;
INLINE v16 join8(__m256 lo, __m256 hi) {
    v16_halves u;
    u.h[0] = lo;
    u.h[1] = hi;
    return u.v;
}
#endif

#ifdef __AVX512F__
/* A log-depth reduction (4 shuffle + add steps): a scalar loop over the 16 lanes cost ~30% of a
 * batched product's time, one reduction per (row, token) every 576-1536 multiply-adds. */
INLINE float hsum16(v16 v) { return _mm512_reduce_add_ps((__m512)v); }
#elif defined(LI_AVX2)
/* The same tree with AVX2 shuffles: lanes i + i+8, then i + i+4, i + i+2, 0 + 1. */
INLINE float hsum16(v16 v) {
    v16_halves u = {.v = v};
    __m256 s8 = _mm256_add_ps(u.h[0], u.h[1]);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    return _mm_cvtss_f32(s1);
}
#else
INLINE float hsum16(v16 v) {
    /* Pairwise halves, the same tree as above on every machine that has no AVX-512. */
    for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) v[i] += v[i + w];
    return v[0];
}
#endif

/* ---- GGUF legacy-quant block rows ---------------------------------------------------------
 * A row of `in` weights is in/32 consecutive blocks of 32 (llama.cpp's layouts):
 *   Q8_0 (34 bytes): f16 d, int8 q[32]             w[i] = q[i] * d
 *   Q4_0 (18 bytes): f16 d, u8 qs[16]              w[i] = d * (nibble - 8)
 *   Q4_1 (20 bytes): f16 d, f16 m, u8 qs[16]       w[i] = (d * nibble) + m
 * Byte j of qs holds element j in its low nibble and element j + 16 in its high nibble.
 * A block is decoded into two 16-lane vectors (elements 0-15, 16-31) with exactly the float32
 * operations of gguf-py's numpy dequantization (the torch runner's fp32 weights come from it),
 * and those go through the same FMA accumulation as a float32 row: a model's results on stored
 * blocks are bit for bit those on its dequantized float32 matrices. */
enum { LI_F32 = 0, LI_Q8_0 = 1, LI_Q4_0 = 2, LI_Q4_1 = 3 };
#define QK 32  /* weights per block */

typedef struct {
    const void *data;   /* F32: float [out, in]; blocks: uint8 [out, row_bytes] */
    int64_t row_bytes;  /* bytes from one row to the next */
    int32_t format;     /* LI_F32 or a block format */
} li_mat;

INLINE int block_bytes(int fmt) { return fmt == LI_Q8_0 ? 34 : fmt == LI_Q4_0 ? 18 : 20; }

/* IEEE half -> float, exact (F16C where the machine has it). */
INLINE float f16_to_f32(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
#ifdef __F16C__
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {  /* zero or subnormal: man * 2^-24 is exact in float */
        float f = (float)man * 0x1p-24f;
        memcpy(&bits, &f, 4);
        bits |= sign;
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float out;
    memcpy(&out, &bits, 4);
    return out;
#endif
}

/* Exactness: d is an f16 (at most 11 significant bits) and q (or q - 8) an integer of at most 8
 * bits, so every d * q is exact in float32 and only Q4_1's "+ m" rounds. The file is built with
 * -ffp-contract=fast: a fused (d * q) + m is therefore the same float as numpy's two separately
 * rounded operations, and no barrier against contraction is needed. */

/* Block -> (lo = elements 0-15, hi = elements 16-31). fmt is a constant after inlining. */
INLINE void decode_block(int fmt, const uint8_t *b, v16 *lo, v16 *hi) {
#ifdef __AVX512F__
    if (fmt == LI_Q8_0) {
        __m512 d = _mm512_set1_ps(f16_to_f32(b));
        __m128i b0 = _mm_loadu_si128((const __m128i *)(b + 2));
        __m128i b1 = _mm_loadu_si128((const __m128i *)(b + 18));
        __m512 q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b0));
        __m512 q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b1));
        *lo = (v16)_mm512_mul_ps(q0, d);
        *hi = (v16)_mm512_mul_ps(q1, d);
        return;
    }
    /* The 16 possible values of a 4-bit block, table[k] = w(k), computed as numpy does; each
     * weight is then one permute: vpermps reads only the low 4 bits of an index. */
    const __m512 k = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 d = _mm512_set1_ps(f16_to_f32(b)), table;
    const uint8_t *qs;
    if (fmt == LI_Q4_0) {
        table = _mm512_mul_ps(d, _mm512_sub_ps(k, _mm512_set1_ps(8.0f)));  /* q - 8 is exact */
        qs = b + 2;
    } else {
        table = _mm512_add_ps(_mm512_mul_ps(d, k), _mm512_set1_ps(f16_to_f32(b + 2)));
        qs = b + 4;
    }
    __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)qs));
    *lo = (v16)_mm512_permutexvar_ps(idx, table);
    *hi = (v16)_mm512_permutexvar_ps(_mm512_srli_epi32(idx, 4), table);
#elif defined(LI_AVX2)
    /* Eight weights per step: bytes widened to int32, converted, scaled (the same float
     * operations as the table above, element by element). */
    const __m256 d = _mm256_set1_ps(f16_to_f32(b));
    if (fmt == LI_Q8_0) {
        __m256 q[4];
        for (int j = 0; j < 4; j++)
            q[j] = _mm256_cvtepi32_ps(
                _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + 2 + 8 * j))));
        *lo = join8(_mm256_mul_ps(q[0], d), _mm256_mul_ps(q[1], d));
        *hi = join8(_mm256_mul_ps(q[2], d), _mm256_mul_ps(q[3], d));
        return;
    }
    const __m128i bytes = _mm_loadu_si128((const __m128i *)(b + (fmt == LI_Q4_0 ? 2 : 4)));
    const __m128i mask = _mm_set1_epi8(15);
    const __m128i nib_lo = _mm_and_si128(bytes, mask);                     /* elements 0-15 */
    const __m128i nib_hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);  /* 16-31 */
    __m256 e[4] = {
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(nib_lo)),
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(nib_lo, 8))),
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(nib_hi)),
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(nib_hi, 8))),
    };
    if (fmt == LI_Q4_0) {
        const __m256 eight = _mm256_set1_ps(8.0f);
        for (int j = 0; j < 4; j++) e[j] = _mm256_mul_ps(d, _mm256_sub_ps(e[j], eight));
    } else {
        const __m256 m = _mm256_set1_ps(f16_to_f32(b + 2));
        for (int j = 0; j < 4; j++) e[j] = _mm256_add_ps(_mm256_mul_ps(d, e[j]), m);
    }
    *lo = join8(e[0], e[1]);
    *hi = join8(e[2], e[3]);
#else
    v16 a, c;
    float d = f16_to_f32(b);
    if (fmt == LI_Q8_0) {
        for (int i = 0; i < 16; i++) {
            a[i] = (float)(int8_t)b[2 + i];
            c[i] = (float)(int8_t)b[18 + i];
        }
        *lo = a * d;
        *hi = c * d;
        return;
    }
    const uint8_t *qs = b + (fmt == LI_Q4_0 ? 2 : 4);
    int off = fmt == LI_Q4_0 ? 8 : 0;
    for (int i = 0; i < 16; i++) {
        a[i] = (float)((qs[i] & 15) - off);
        c[i] = (float)((qs[i] >> 4) - off);
    }
    a = d * a;
    c = d * c;
    if (fmt == LI_Q4_1) {
        float m = f16_to_f32(b + 2);
        a = a + m;
        c = c + m;
    }
    *lo = a;
    *hi = c;
#endif
}

/* One block row -> in floats. */
INLINE void decode_row(int fmt, const uint8_t *row, int64_t in, float *out) {
    const int bb = block_bytes(fmt);
    for (int64_t i = 0; i < in; i += QK, row += bb) {
        v16 lo, hi;
        decode_block(fmt, row, &lo, &hi);
        *(v16u *)(out + i) = lo;
        *(v16u *)(out + i + 16) = hi;
    }
}

typedef struct {
    int64_t hidden, n_heads, n_kv_heads, head_dim, ffn, max_ctx;
    float eps;
    float attn_scale;
} li_dims;

typedef struct {
    const float *input_norm;  /* [hidden] */
    li_mat qkv;               /* [(heads + 2 kv_heads) * head_dim, hidden] */
    const float *qkv_bias;    /* [(heads + 2 kv_heads) * head_dim] or NULL */
    const float *q_norm;      /* [head_dim] or NULL (qwen3) */
    const float *k_norm;      /* [head_dim] or NULL */
    li_mat o;                 /* [hidden, heads * head_dim] */
    const float *post_norm;   /* [hidden] */
    li_mat gate_up;           /* [2 ffn, hidden] */
    li_mat down;              /* [hidden, ffn] */
    float *kcache, *vcache;   /* [slots, kv_heads, max_ctx, head_dim] */
    int64_t window;           /* sliding window, 0 = full attention */
} li_layer;

/* Rows [a, b) of n split evenly over nt threads. */
INLINE void split(int64_t n, int nt, int t, int64_t *a, int64_t *b) {
    int64_t per = n / nt, rem = n % nt;
    *a = t * per + (t < rem ? t : rem);
    *b = *a + per + (t < rem ? 1 : 0);
}

/* res[t] = dot(w, x[t]) for tt tokens (tt a compile-time constant after inlining).
 * Every token's sum is accumulated in the same order whatever tt is, so a token's result does
 * not depend on what else is in the batch: batched = one at a time, bit for bit. (One
 * accumulator per token measured as fast as four for tt = 1: the row stream, not the FMA
 * latency, is the limit.) */
INLINE void dot_tile(const float *w, const float *x, int64_t xs, int64_t n, int tt, float *res) {
    int64_t i = 0;
    v16 acc[MAX_TILE];
    for (int t = 0; t < tt; t++) acc[t] = (v16){0};
    for (; i + 16 <= n; i += 16) {
        __builtin_prefetch(w + i + PREFETCH_FLOATS, 0, PREFETCH_LOCALITY);
        v16 wv = load16(w + i);
        for (int t = 0; t < tt; t++) acc[t] += wv * load16(x + t * xs + i);
    }
    for (int t = 0; t < tt; t++) {
        float s = hsum16(acc[t]);
        for (int64_t j = i; j < n; j++) s += w[j] * x[t * xs + j];
        res[t] = s;
    }
}

/* The same for two weight rows at once (ra from wa, rb from wb): each x load feeds two FMAs, so
 * a multi-token tile is no longer bound by loads. Every (row, token) sum runs in exactly the
 * order dot_tile uses, so pairing rows changes no result. */
INLINE void dot_tile2(const float *wa, const float *wb, const float *x, int64_t xs, int64_t n,
                      int tt, float *ra, float *rb) {
    int64_t i = 0;
    v16 acc_a[MAX_TILE], acc_b[MAX_TILE];
    for (int t = 0; t < tt; t++) acc_a[t] = acc_b[t] = (v16){0};
    for (; i + 16 <= n; i += 16) {
        __builtin_prefetch(wa + i + PREFETCH_FLOATS, 0, PREFETCH_LOCALITY);
        __builtin_prefetch(wb + i + PREFETCH_FLOATS, 0, PREFETCH_LOCALITY);
        v16 va = load16(wa + i), vb = load16(wb + i);
        for (int t = 0; t < tt; t++) {
            v16 xv = load16(x + t * xs + i);
            /* Keep xv in a register: left alone, GCC folds the load into both FMAs and the
             * loop issues twice the loads (it was load-bound). */
            acc_a[t] += va * xv;
            acc_b[t] += vb * xv;
        }
    }
    for (int t = 0; t < tt; t++) {
        float sa = hsum16(acc_a[t]), sb = hsum16(acc_b[t]);
        for (int64_t j = i; j < n; j++) {
            sa += wa[j] * x[t * xs + j];
            sb += wb[j] * x[t * xs + j];
        }
        ra[t] = sa;
        rb[t] = sb;
    }
}

static void dot_rows2(const float *wa, const float *wb, const float *x, int64_t xs, int64_t n,
                      int tt, float *ra, float *rb) {
    switch (tt) {
    case 1: dot_tile(wa, x, xs, n, 1, ra); dot_tile(wb, x, xs, n, 1, rb); break;
    case 2: dot_tile2(wa, wb, x, xs, n, TT(2), ra, rb); break;
    case 3: dot_tile2(wa, wb, x, xs, n, TT(3), ra, rb); break;
    case 4: dot_tile2(wa, wb, x, xs, n, TT(4), ra, rb); break;
    case 5: dot_tile2(wa, wb, x, xs, n, TT(5), ra, rb); break;
    case 6: dot_tile2(wa, wb, x, xs, n, TT(6), ra, rb); break;
    case 7: dot_tile2(wa, wb, x, xs, n, TT(7), ra, rb); break;
    default: dot_tile2(wa, wb, x, xs, n, MAX_TILE, ra, rb); break;
    }
}

/* Dispatch on the tile size so each case gets a fully unrolled dot_tile. */
static void dot_rows(const float *w, const float *x, int64_t xs, int64_t n, int tt, float *res) {
    switch (tt) {
    case 1: dot_tile(w, x, xs, n, 1, res); break;
    case 2: dot_tile(w, x, xs, n, TT(2), res); break;
    case 3: dot_tile(w, x, xs, n, TT(3), res); break;
    case 4: dot_tile(w, x, xs, n, TT(4), res); break;
    case 5: dot_tile(w, x, xs, n, TT(5), res); break;
    case 6: dot_tile(w, x, xs, n, TT(6), res); break;
    case 7: dot_tile(w, x, xs, n, TT(7), res); break;
    default: dot_tile(w, x, xs, n, MAX_TILE, res); break;
    }
}

/* dot_tile on a block row: each block is decoded once and multiplied by every token of the
 * tile. Token t's sum takes the same 16-wide steps in the same order as dot_tile's over the
 * dequantized row (in is a multiple of 32, so there is no scalar tail). */
INLINE void qdot_tile(int fmt, const uint8_t *w, const float *x, int64_t xs, int64_t n, int tt,
                      float *res) {
    const int bb = block_bytes(fmt);
    v16 acc[MAX_TILE];
    for (int t = 0; t < tt; t++) acc[t] = (v16){0};
    for (int64_t i = 0; i < n; i += QK, w += bb) {
        __builtin_prefetch(w + PREFETCH_BYTES, 0, PREFETCH_LOCALITY);
        v16 lo, hi;
        decode_block(fmt, w, &lo, &hi);
        for (int t = 0; t < tt; t++) acc[t] += lo * load16(x + t * xs + i);
        for (int t = 0; t < tt; t++) acc[t] += hi * load16(x + t * xs + i + 16);
    }
    for (int t = 0; t < tt; t++) res[t] = hsum16(acc[t]);
}

/* dot_tile2 on two block rows. */
INLINE void qdot_tile2(int fmt, const uint8_t *wa, const uint8_t *wb, const float *x, int64_t xs,
                       int64_t n, int tt, float *ra, float *rb) {
    const int bb = block_bytes(fmt);
    v16 acc_a[MAX_TILE], acc_b[MAX_TILE];
    for (int t = 0; t < tt; t++) acc_a[t] = acc_b[t] = (v16){0};
    for (int64_t i = 0; i < n; i += QK, wa += bb, wb += bb) {
        __builtin_prefetch(wa + PREFETCH_BYTES, 0, PREFETCH_LOCALITY);
        __builtin_prefetch(wb + PREFETCH_BYTES, 0, PREFETCH_LOCALITY);
        v16 alo, ahi, blo, bhi;
        decode_block(fmt, wa, &alo, &ahi);
        decode_block(fmt, wb, &blo, &bhi);
        for (int t = 0; t < tt; t++) {
            v16 xv = load16(x + t * xs + i);
            acc_a[t] += alo * xv;
            acc_b[t] += blo * xv;
        }
        for (int t = 0; t < tt; t++) {
            v16 xv = load16(x + t * xs + i + 16);
            acc_a[t] += ahi * xv;
            acc_b[t] += bhi * xv;
        }
    }
    for (int t = 0; t < tt; t++) {
        ra[t] = hsum16(acc_a[t]);
        rb[t] = hsum16(acc_b[t]);
    }
}

/* One case per (format, tile size) so every call is fully specialised. */
#define TILE_CASES(CALL) \
    switch (tt) { \
    case 1: CALL(1); break; case 2: CALL(TT(2)); break; case 3: CALL(TT(3)); break; \
    case 4: CALL(TT(4)); break; case 5: CALL(TT(5)); break; case 6: CALL(TT(6)); break; \
    case 7: CALL(TT(7)); break; default: CALL(MAX_TILE); break; \
    }

#define QDOT_FMT(F) \
    static void qdot_rows_##F(const uint8_t *w, const float *x, int64_t xs, int64_t n, int tt, \
                              float *res) { \
        TILE_CASES(QDOT_CALL1) \
    } \
    static void qdot_rows2_##F(const uint8_t *wa, const uint8_t *wb, const float *x, int64_t xs, \
                               int64_t n, int tt, float *ra, float *rb) { \
        TILE_CASES(QDOT_CALL2) \
    }
#define QDOT_CALL1(TT) qdot_tile(FMT_, w, x, xs, n, TT, res)
#define QDOT_CALL2(TT) qdot_tile2(FMT_, wa, wb, x, xs, n, TT, ra, rb)
#define FMT_ LI_Q8_0
QDOT_FMT(q8_0)
#undef FMT_
#define FMT_ LI_Q4_0
QDOT_FMT(q4_0)
#undef FMT_
#define FMT_ LI_Q4_1
QDOT_FMT(q4_1)
#undef FMT_

static void qdot_rows(int fmt, const uint8_t *w, const float *x, int64_t xs, int64_t n, int tt,
                      float *res) {
    if (fmt == LI_Q8_0) qdot_rows_q8_0(w, x, xs, n, tt, res);
    else if (fmt == LI_Q4_0) qdot_rows_q4_0(w, x, xs, n, tt, res);
    else qdot_rows_q4_1(w, x, xs, n, tt, res);
}

static void qdot_rows2(int fmt, const uint8_t *wa, const uint8_t *wb, const float *x, int64_t xs,
                       int64_t n, int tt, float *ra, float *rb) {
    if (fmt == LI_Q8_0) qdot_rows2_q8_0(wa, wb, x, xs, n, tt, ra, rb);
    else if (fmt == LI_Q4_0) qdot_rows2_q4_0(wa, wb, x, xs, n, tt, ra, rb);
    else qdot_rows2_q4_1(wa, wb, x, xs, n, tt, ra, rb);
}

static void decode_row_any(int fmt, const uint8_t *row, int64_t in, float *out) {
    if (fmt == LI_Q8_0) decode_row(LI_Q8_0, row, in, out);
    else if (fmt == LI_Q4_0) decode_row(LI_Q4_0, row, in, out);
    else decode_row(LI_Q4_1, row, in, out);
}

/* y[t, o] (+)= x[t] . w[o] (+ bias[o]) for rows o in [o0, o1): each weight row is read from
 * memory once and multiplied by every token while it sits in L1. */
INLINE void store_row(float *y, int64_t ys, int64_t t0, int tt, int64_t o, const float *res,
                      const float *bias, int accumulate) {
    for (int t = 0; t < tt; t++) {
        float v = res[t] + (bias ? bias[o] : 0.0f);
        float *dst = y + (t0 + t) * ys + o;
        *dst = accumulate ? *dst + v : v;
    }
}

static void linear_rows_f32(const float *x, int64_t T, int64_t in, const float *w,
                            const float *bias, float *y, int64_t ys, int64_t o0, int64_t o1,
                            int accumulate) {
    float ra[MAX_TILE], rb[MAX_TILE];
    int64_t o = o0;
    if (T > PAIR_ROWS_ABOVE) {  /* rows in pairs (dot_tile2) */
        for (; o + 2 <= o1; o += 2) {
            for (int64_t t0 = 0; t0 < T; t0 += MAX_TILE) {
                int tt = (int)(T - t0 < MAX_TILE ? T - t0 : MAX_TILE);
                dot_rows2(w + o * in, w + (o + 1) * in, x + t0 * in, in, in, tt, ra, rb);
                store_row(y, ys, t0, tt, o, ra, bias, accumulate);
                store_row(y, ys, t0, tt, o + 1, rb, bias, accumulate);
            }
        }
    }
    for (; o < o1; o++) {
        for (int64_t t0 = 0; t0 < T; t0 += MAX_TILE) {
            int tt = (int)(T - t0 < MAX_TILE ? T - t0 : MAX_TILE);
            dot_rows(w + o * in, x + t0 * in, in, in, tt, ra);
            store_row(y, ys, t0, tt, o, ra, bias, accumulate);
        }
    }
}

/* linear_rows on block rows, a token tile at a time: every block decoded once per tile (measured
 * faster, 9 to 256 tokens, than decoding each row once into a float32 buffer and running
 * linear_rows_f32 over it: 0.64-0.97x the time on SmolLM2's matrices, 2 threads). Rows
 * always go in pairs, unlike float32 rows: decoding makes a block row compute-bound, and with one
 * token the sum's chain of dependent FMAs is the limit (measured, 2 threads, one token: Q4_1
 * 22 -> 28 G weights/s paired); a pair runs two chains at once. Every sum keeps its own order,
 * so pairing changes no result. */
static void linear_rows_blocks(const float *x, int64_t T, int64_t in, const li_mat *w,
                               const float *bias, float *y, int64_t ys, int64_t o0, int64_t o1,
                               int accumulate) {
    float ra[MAX_TILE], rb[MAX_TILE];
    const uint8_t *base = (const uint8_t *)w->data;
    const int64_t rs = w->row_bytes;
    int64_t o = o0;
    for (; o + 2 <= o1; o += 2) {
        for (int64_t t0 = 0; t0 < T; t0 += MAX_TILE) {
            int tt = (int)(T - t0 < MAX_TILE ? T - t0 : MAX_TILE);
            qdot_rows2(w->format, base + o * rs, base + (o + 1) * rs, x + t0 * in, in, in, tt, ra,
                       rb);
            store_row(y, ys, t0, tt, o, ra, bias, accumulate);
            store_row(y, ys, t0, tt, o + 1, rb, bias, accumulate);
        }
    }
    for (; o < o1; o++) {
        for (int64_t t0 = 0; t0 < T; t0 += MAX_TILE) {
            int tt = (int)(T - t0 < MAX_TILE ? T - t0 : MAX_TILE);
            qdot_rows(w->format, base + o * rs, x + t0 * in, in, in, tt, ra);
            store_row(y, ys, t0, tt, o, ra, bias, accumulate);
        }
    }
}

static void linear_rows(const float *x, int64_t T, int64_t in, const li_mat *w, const float *bias,
                        float *y, int64_t ys, int64_t o0, int64_t o1, int accumulate) {
    if (w->format == LI_F32)
        linear_rows_f32(x, T, in, (const float *)w->data, bias, y, ys, o0, o1, accumulate);
    else
        linear_rows_blocks(x, T, in, w, bias, y, ys, o0, o1, accumulate);
}

INLINE float silu(float g) { return g / (1.0f + expf(-g)); }

/* e^-g as p * 2^k, the scaling by 2^k left to the caller (each width has its own way): -g
 * clamped to [-87, 88], a Cephes-style range reduction (k = round(-g / ln 2), r = -g - k ln 2 with
 * ln 2 in two parts) and degree-6 polynomial, p = e^r to about 1 ulp. Written once for both
 * widths: W is the intrinsics' prefix, T the vector type, ROUND the width's round-to-nearest. */
#define DEFINE_EXP_NEG(NAME, W, T, ROUND)                                                     \
    INLINE T NAME(T g, T *k) {                                                                \
        T x = W##_sub_ps(W##_setzero_ps(), g);                                                \
        x = W##_min_ps(W##_max_ps(x, W##_set1_ps(-87.0f)), W##_set1_ps(88.0f));               \
        *k = ROUND(W##_mul_ps(x, W##_set1_ps(1.44269504088896341f)),                          \
                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);                            \
        T r = W##_fnmadd_ps(*k, W##_set1_ps(0.693359375f), x);                                \
        r = W##_fnmadd_ps(*k, W##_set1_ps(-2.12194440e-4f), r);                               \
        T p = W##_set1_ps(1.9875691500e-4f);                                                  \
        p = W##_fmadd_ps(p, r, W##_set1_ps(1.3981999507e-3f));                                \
        p = W##_fmadd_ps(p, r, W##_set1_ps(8.3334519073e-3f));                                \
        p = W##_fmadd_ps(p, r, W##_set1_ps(4.1665795894e-2f));                                \
        p = W##_fmadd_ps(p, r, W##_set1_ps(1.6666665459e-1f));                                \
        p = W##_fmadd_ps(p, r, W##_set1_ps(5.0000001201e-1f));                                \
        return W##_fmadd_ps(W##_mul_ps(p, r), r, W##_add_ps(r, W##_set1_ps(1.0f)));           \
    }
#ifdef __AVX512F__
DEFINE_EXP_NEG(exp_neg16, _mm512, __m512, _mm512_roundscale_ps)
#elif defined(LI_AVX2)
DEFINE_EXP_NEG(exp_neg8, _mm256, __m256, _mm256_round_ps)
#endif

/* out[i] = silu(gate[i]) * up[i] for i in [0, n). With AVX-512 (or AVX2), exp is the polynomial
 * above on 16 (8) lanes; scalar expf cost about 1 ms of a 24 ms 8-slot decode step.
 * Elementwise, so no result depends on the batch. */
static void silu_mul(const float *gate, const float *up, float *out, int64_t n) {
    int64_t i = 0;
#ifdef __AVX512F__
    const __m512 one = _mm512_set1_ps(1.0f);
    for (; i + 16 <= n; i += 16) {
        __m512 g = _mm512_loadu_ps(gate + i), k;
        __m512 p = exp_neg16(g, &k);
        __m512 e = _mm512_scalef_ps(p, k);  /* p * 2^k */
        __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, e));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(s, _mm512_loadu_ps(up + i)));
    }
#elif defined(LI_AVX2)
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i), k;
        __m256 p = exp_neg8(g, &k);
        /* p * 2^k by adding k to the exponent field (k is within [-126, 127] after the clamp, so
         * this is the exact scaling scalef does). */
        __m256i ki = _mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127));
        __m256 e = _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(ki, 23)));
        __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, e));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
    }
#endif
    for (; i < n; i++) out[i] = silu(gate[i]) * up[i];
}

/* out = x * rsqrt(mean(x^2) + eps) * w over n elements (float accumulation in double-free
 * float, as torch's fp32 rms_norm). */
static void rms_norm_row(const float *x, const float *w, int64_t n, float eps, float *out) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * r * w[i];
}

/* Rotate-half RoPE of one head in place: x*cos + [x2, x1]*ssin. */
static void rope_head(float *x, const float *cos, const float *ssin, int64_t d) {
    float tmp[512];
    int64_t half = d / 2;
    for (int64_t i = 0; i < d; i++) tmp[i] = x[i];
    for (int64_t i = 0; i < d; i++) x[i] = tmp[i] * cos[i] + tmp[(i + half) % d] * ssin[i];
}

/* One query head of one token against its slot's cached keys [lo, hi]: softmax(q.k * scale) v. */
static void attend(const float *q, const float *keys, const float *values, int64_t lo, int64_t hi,
                   int64_t d, float scale, float *scores, float *out) {
    float mx = -INFINITY;
    for (int64_t j = lo; j <= hi; j++) {
        const float *k = keys + j * d;
        v16 acc = {0};
        int64_t i = 0;
        for (; i + 16 <= d; i += 16) acc += load16(q + i) * load16(k + i);
        float s = hsum16(acc);
        for (; i < d; i++) s += q[i] * k[i];
        s *= scale;
        scores[j - lo] = s;
        if (s > mx) mx = s;
    }
    float total = 0.0f;
    for (int64_t j = lo; j <= hi; j++) {
        float e = expf(scores[j - lo] - mx);
        scores[j - lo] = e;
        total += e;
    }
    for (int64_t i = 0; i < d; i++) out[i] = 0.0f;
    for (int64_t j = lo; j <= hi; j++) {
        const float *v = values + j * d;
        float p = scores[j - lo];
        for (int64_t i = 0; i < d; i++) out[i] += p * v[i];
    }
    float inv = 1.0f / total;
    for (int64_t i = 0; i < d; i++) out[i] *= inv;
}

/* Scratch floats li_forward needs for T tokens and nthreads threads. */
int64_t li_forward_scratch(const li_dims *d, int64_t T, int nthreads) {
    int64_t qkv = (d->n_heads + 2 * d->n_kv_heads) * d->head_dim;
    return T * (d->hidden + qkv + d->n_heads * d->head_dim + 3 * d->ffn) + (int64_t)nthreads * d->max_ctx;
}

/* Runs every layer over T tokens; x [T, hidden] holds the embeddings on entry and the final
 * residual stream (before the last norm) on return. slots/positions: [T]. Returns 0, or -1 for a
 * head_dim this file does not handle. */
int li_forward(const li_dims *d, const li_layer *layers, int64_t n_layers, float *x, int64_t T,
               const int64_t *slots, const int64_t *positions, const float *cos, const float *ssin,
               float *scratch, int nthreads) {
    const int64_t H = d->hidden, D = d->head_dim, NH = d->n_heads, NKV = d->n_kv_heads;
    const int64_t QKV = (NH + 2 * NKV) * D, F = d->ffn, CTX = d->max_ctx;
    if (D > 512) return -1;
    float *h = scratch;              /* [T, H] normed input */
    float *qkv = h + T * H;          /* [T, QKV] */
    float *attn = qkv + T * QKV;     /* [T, NH * D] */
    float *act = attn + T * NH * D;  /* [T, F] */
    float *scores = act + T * F;     /* [nthreads, CTX] */
    float *gu = scores + (int64_t)nthreads * CTX;  /* [T, 2F] gate|up before SiLU */
    const int64_t group = NH / NKV;

    #pragma omp parallel num_threads(nthreads)
    {
        const int nt = omp_get_num_threads(), tid = omp_get_thread_num();
        float *my_scores = scores + (int64_t)tid * CTX;
        int64_t a, b;
        for (int64_t li = 0; li < n_layers; li++) {
            const li_layer *L = layers + li;
            /* attention block */
            split(T, nt, tid, &a, &b);
            for (int64_t t = a; t < b; t++) rms_norm_row(x + t * H, L->input_norm, H, d->eps, h + t * H);
            #pragma omp barrier
            split(QKV, nt, tid, &a, &b);
            linear_rows(h, T, H, &L->qkv, L->qkv_bias, qkv, QKV, a, b, 0);
            #pragma omp barrier
            /* q and k heads: optional per-head norm, RoPE; k and v then go to the cache */
            split(T * (NH + NKV), nt, tid, &a, &b);
            for (int64_t r = a; r < b; r++) {
                int64_t t = r / (NH + NKV), head = r % (NH + NKV);
                float *v = qkv + t * QKV + head * D;
                const float *norm = head < NH ? L->q_norm : L->k_norm;
                if (norm) rms_norm_row(v, norm, D, d->eps, v);
                rope_head(v, cos + positions[t] * D, ssin + positions[t] * D, D);
                if (head >= NH) {
                    int64_t kvh = head - NH;
                    int64_t at = ((slots[t] * NKV + kvh) * CTX + positions[t]) * D;
                    memcpy(L->kcache + at, v, D * sizeof(float));
                    memcpy(L->vcache + at, v + NKV * D, D * sizeof(float));
                }
            }
            #pragma omp barrier
            split(T * NH, nt, tid, &a, &b);
            for (int64_t r = a; r < b; r++) {
                int64_t t = r / NH, head = r % NH, kvh = head / group;
                int64_t pos = positions[t];
                int64_t lo = L->window > 0 && pos - L->window + 1 > 0 ? pos - L->window + 1 : 0;
                int64_t base = (slots[t] * NKV + kvh) * CTX * D;
                attend(qkv + t * QKV + head * D, L->kcache + base, L->vcache + base, lo, pos, D,
                       d->attn_scale, my_scores, attn + t * NH * D + head * D);
            }
            #pragma omp barrier
            split(H, nt, tid, &a, &b);
            linear_rows(attn, T, NH * D, &L->o, NULL, x, H, a, b, 1);
            #pragma omp barrier
            /* MLP block */
            split(T, nt, tid, &a, &b);
            for (int64_t t = a; t < b; t++) rms_norm_row(x + t * H, L->post_norm, H, d->eps, h + t * H);
            #pragma omp barrier
            /* gate|up as one plain product (one sequential stream per thread: measured 4-11%
             * faster for the whole forward than computing gate and up rows in pairs with SiLU
             * fused, which reads two streams), then SiLU(gate) * up. */
            split(2 * F, nt, tid, &a, &b);
            linear_rows(h, T, H, &L->gate_up, NULL, gu, 2 * F, a, b, 0);
            #pragma omp barrier
            for (int64_t t = 0; t < T; t++) {  /* each thread a slice of every token's row */
                split(F, nt, tid, &a, &b);
                silu_mul(gu + t * 2 * F + a, gu + t * 2 * F + F + a, act + t * F + a, b - a);
            }
            #pragma omp barrier
            split(H, nt, tid, &a, &b);
            linear_rows(act, T, F, &L->down, NULL, x, H, a, b, 1);
            #pragma omp barrier
        }
    }
    return 0;
}

/* logits[t] = rms_norm(x[t]) . w (the final norm and the LM head); normed: [T, in] scratch. */
void li_norm_linear(const float *x, int64_t T, int64_t in, const float *norm, float eps,
                    float *normed, const li_mat *w, int64_t out, float *y, int nthreads) {
    for (int64_t t = 0; t < T; t++) rms_norm_row(x + t * in, norm, in, eps, normed + t * in);
    #pragma omp parallel num_threads(nthreads)
    {
        int64_t a, b;
        split(out, omp_get_num_threads(), omp_get_thread_num(), &a, &b);
        linear_rows(normed, T, in, w, NULL, y, out, a, b, 0);
    }
}

/* y = x . w^T (+ bias): the bare matrix product, for tests and benchmarks. */
void li_linear(const float *x, int64_t T, int64_t in, const li_mat *w, int64_t out,
               const float *bias, float *y, int nthreads) {
    #pragma omp parallel num_threads(nthreads)
    {
        int64_t a, b;
        split(out, omp_get_num_threads(), omp_get_thread_num(), &a, &b);
        linear_rows(x, T, in, w, bias, y, out, a, b, 0);
    }
}

/* out = every row of a block matrix [rows, in] dequantized, rows split over threads: a long
 * prefill chunk multiplies by it with torch's GEMM (torch ops beat the kernels' tiles there). */
void li_dequant_matrix(const li_mat *w, int64_t in, int64_t rows, float *out, int nthreads) {
    #pragma omp parallel num_threads(nthreads)
    {
        int64_t a, b;
        split(rows, omp_get_num_threads(), omp_get_thread_num(), &a, &b);
        for (int64_t r = a; r < b; r++)
            decode_row_any(w->format, (const uint8_t *)w->data + r * w->row_bytes, in,
                           out + r * in);
    }
}

/* out[r] = the dequantized row rows[r] of a block matrix (the embedding lookup of a table kept
 * as blocks): the same decode as the products, so equal to the float32 table's rows. */
void li_dequant_rows(const li_mat *w, int64_t in, const int64_t *rows, int64_t n, float *out) {
    for (int64_t r = 0; r < n; r++)
        decode_row_any(w->format, (const uint8_t *)w->data + rows[r] * w->row_bytes, in,
                       out + r * in);
}
