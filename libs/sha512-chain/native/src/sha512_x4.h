/*
 * sha512_x4: SHA-512 compression of four independent messages at once, one per 64-bit lane of AVX2 registers
 * (FIPS 180-4 §6.4.2, the same arithmetic as the scalar code, four times in parallel). It is the multi-buffer path of
 * CPUs that have AVX2 but not AVX-512 (most AMD EPYC and Ryzen before Zen 4, Intel client cores): AVX2 has no 64-bit
 * rotate, so each rotation is two shifts and an or, and the message words are loaded four at a time per lane and
 * transposed. Used only when the CPU and the OS support AVX2 (checked at run time); otherwise the addon uses OpenSSL.
 * As with sha512_x8, every result is a chain link that must equal the state recorded by OpenSSL, so a fault here shows
 * up as a mismatch, never as a false match.
 */
#ifndef SHA512_X4_H
#define SHA512_X4_H
#include <stdint.h>
#include <stddef.h>

#define SHA512_X4_LANES 4

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include "sha512_k.h"

#define SHA512_X4_TARGET __attribute__((target("avx2")))

#define X4_ROR(x, n) _mm256_or_si256(_mm256_srli_epi64((x), (n)), _mm256_slli_epi64((x), 64 - (n)))
#define X4_XOR3(a, b, c) _mm256_xor_si256(_mm256_xor_si256((a), (b)), (c))
/* Ch(e,f,g) = g ^ (e & (f ^ g)); Maj(a,b,c) = (a & b) | (c & (a | b)) */
#define X4_CH(e, f, g) _mm256_xor_si256((g), _mm256_and_si256((e), _mm256_xor_si256((f), (g))))
#define X4_MAJ(a, b, c) _mm256_or_si256(_mm256_and_si256((a), (b)), _mm256_and_si256((c), _mm256_or_si256((a), (b))))
#define X4_BSIG0(x) X4_XOR3(X4_ROR(x, 28), X4_ROR(x, 34), X4_ROR(x, 39))
#define X4_BSIG1(x) X4_XOR3(X4_ROR(x, 14), X4_ROR(x, 18), X4_ROR(x, 41))
#define X4_SSIG0(x) X4_XOR3(X4_ROR(x, 1), X4_ROR(x, 8), _mm256_srli_epi64(x, 7))
#define X4_SSIG1(x) X4_XOR3(X4_ROR(x, 19), X4_ROR(x, 61), _mm256_srli_epi64(x, 6))
#define X4_ADD(a, b) _mm256_add_epi64((a), (b))

#define X4_RND(a, b, c, d, e, f, g, h, kw) do { \
    __m256i t1_ = X4_ADD(X4_ADD(h, X4_BSIG1(e)), X4_ADD(X4_CH(e, f, g), kw)); \
    d = X4_ADD(d, t1_); \
    h = X4_ADD(t1_, X4_ADD(X4_BSIG0(a), X4_MAJ(a, b, c))); \
  } while (0)

/*
 * Compresses nblocks 128-byte blocks into 4 independent SHA-512 states at once (one per 64-bit lane).
 * st[l][0..7]: lane l's h0..h7 (host order). data[l]: lane l's bytes (nblocks * 128), or NULL for zero bytes. When
 * every lane is zeros the message schedule is skipped: all its words are zero.
 */
SHA512_X4_TARGET static void sha512_x4(uint64_t st[SHA512_X4_LANES][8], const uint8_t *const data[SHA512_X4_LANES], size_t nblocks) {
  static const uint8_t zero_block[128] __attribute__((aligned(32)));
  __m256i s[8];
  for (int i = 0; i < 8; i++) s[i] = _mm256_set_epi64x((long long)st[3][i], (long long)st[2][i], (long long)st[1][i], (long long)st[0][i]);
  int any_data = 0;
  const uint8_t *p[SHA512_X4_LANES];
  size_t step[SHA512_X4_LANES];
  for (int l = 0; l < SHA512_X4_LANES; l++) {
    if (data[l]) { any_data = 1; p[l] = data[l]; step[l] = 128; }
    else { p[l] = zero_block; step[l] = 0; }
  }
  /* big-endian 64-bit words: reverse the bytes of each 8-byte element (the shuffle works within 128-bit halves) */
  const __m256i bswap = _mm256_set_epi8(
      8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  for (size_t blk = 0; blk < nblocks; blk++) {
    __m256i a = s[0], b = s[1], c = s[2], d = s[3], e = s[4], f = s[5], g = s[6], h = s[7];
    if (any_data) {
      __m256i w[16];
      for (int j = 0; j < 16; j += 4) {
        /* r[l] = lane l's words j..j+3; transposed so that w[j+k] holds word j+k of every lane */
        __m256i r0 = _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)(p[0] + 8 * j)), bswap);
        __m256i r1 = _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)(p[1] + 8 * j)), bswap);
        __m256i r2 = _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)(p[2] + 8 * j)), bswap);
        __m256i r3 = _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)(p[3] + 8 * j)), bswap);
        __m256i t0 = _mm256_unpacklo_epi64(r0, r1), t1 = _mm256_unpackhi_epi64(r0, r1);
        __m256i t2 = _mm256_unpacklo_epi64(r2, r3), t3 = _mm256_unpackhi_epi64(r2, r3);
        w[j + 0] = _mm256_permute2x128_si256(t0, t2, 0x20);
        w[j + 1] = _mm256_permute2x128_si256(t1, t3, 0x20);
        w[j + 2] = _mm256_permute2x128_si256(t0, t2, 0x31);
        w[j + 3] = _mm256_permute2x128_si256(t1, t3, 0x31);
      }
      for (int l = 0; l < SHA512_X4_LANES; l++) p[l] += step[l];
#define X4_KW(t) X4_ADD(w[(t) & 15], _mm256_set1_epi64x((long long)SHA512_K[t]))
#define X4_SCHED(t) (w[(t) & 15] = X4_ADD(X4_ADD(w[(t) & 15], X4_SSIG1(w[((t) - 2) & 15])), X4_ADD(w[((t) - 7) & 15], X4_SSIG0(w[((t) - 15) & 15]))))
#define X4_R8(t, KWF) \
      X4_RND(a, b, c, d, e, f, g, h, KWF(t + 0)); X4_RND(h, a, b, c, d, e, f, g, KWF(t + 1)); \
      X4_RND(g, h, a, b, c, d, e, f, KWF(t + 2)); X4_RND(f, g, h, a, b, c, d, e, KWF(t + 3)); \
      X4_RND(e, f, g, h, a, b, c, d, KWF(t + 4)); X4_RND(d, e, f, g, h, a, b, c, KWF(t + 5)); \
      X4_RND(c, d, e, f, g, h, a, b, KWF(t + 6)); X4_RND(b, c, d, e, f, g, h, a, KWF(t + 7));
#define X4_KWS(t) (X4_SCHED(t), X4_KW(t))
      X4_R8(0, X4_KW) X4_R8(8, X4_KW)
      X4_R8(16, X4_KWS) X4_R8(24, X4_KWS) X4_R8(32, X4_KWS) X4_R8(40, X4_KWS) X4_R8(48, X4_KWS) X4_R8(56, X4_KWS) X4_R8(64, X4_KWS) X4_R8(72, X4_KWS)
    } else {
#define X4_K0(t) _mm256_set1_epi64x((long long)SHA512_K[t])
      X4_R8(0, X4_K0) X4_R8(8, X4_K0) X4_R8(16, X4_K0) X4_R8(24, X4_K0) X4_R8(32, X4_K0) X4_R8(40, X4_K0) X4_R8(48, X4_K0) X4_R8(56, X4_K0) X4_R8(64, X4_K0) X4_R8(72, X4_K0)
    }
    s[0] = X4_ADD(s[0], a); s[1] = X4_ADD(s[1], b); s[2] = X4_ADD(s[2], c); s[3] = X4_ADD(s[3], d);
    s[4] = X4_ADD(s[4], e); s[5] = X4_ADD(s[5], f); s[6] = X4_ADD(s[6], g); s[7] = X4_ADD(s[7], h);
  }
  for (int i = 0; i < 8; i++) {
    uint64_t v[SHA512_X4_LANES] __attribute__((aligned(32)));
    _mm256_store_si256((__m256i *)v, s[i]);
    for (int l = 0; l < SHA512_X4_LANES; l++) st[l][i] = v[l];
  }
}

/* Whether this CPU and OS can run sha512_x4 (libgcc checks the CPUID bits and that the OS saves the AVX state). */
static int sha512_x4_supported(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
}

#else
/* Not x86-64: no four-lane path; advanceMany runs OpenSSL message by message (on arm64, OpenSSL's own code uses the
 * ARMv8.2 SHA-512 instructions where the CPU has them). */
static int sha512_x4_supported(void) {
  return 0;
}

static void sha512_x4(uint64_t st[SHA512_X4_LANES][8], const uint8_t *const data[SHA512_X4_LANES], size_t nblocks) {
  (void)st;
  (void)data;
  (void)nblocks;
}
#endif

#endif
