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

/* The SHA-512 round constants, one per round (the same table as sha512_x8.h's, kept here so either header stands alone). */
static const uint64_t SHA512_X4_K[80] = {
  0x428a2f98d728ae22ULL, 0x7137449123ef65cdULL, 0xb5c0fbcfec4d3b2fULL, 0xe9b5dba58189dbbcULL,
  0x3956c25bf348b538ULL, 0x59f111f1b605d019ULL, 0x923f82a4af194f9bULL, 0xab1c5ed5da6d8118ULL,
  0xd807aa98a3030242ULL, 0x12835b0145706fbeULL, 0x243185be4ee4b28cULL, 0x550c7dc3d5ffb4e2ULL,
  0x72be5d74f27b896fULL, 0x80deb1fe3b1696b1ULL, 0x9bdc06a725c71235ULL, 0xc19bf174cf692694ULL,
  0xe49b69c19ef14ad2ULL, 0xefbe4786384f25e3ULL, 0x0fc19dc68b8cd5b5ULL, 0x240ca1cc77ac9c65ULL,
  0x2de92c6f592b0275ULL, 0x4a7484aa6ea6e483ULL, 0x5cb0a9dcbd41fbd4ULL, 0x76f988da831153b5ULL,
  0x983e5152ee66dfabULL, 0xa831c66d2db43210ULL, 0xb00327c898fb213fULL, 0xbf597fc7beef0ee4ULL,
  0xc6e00bf33da88fc2ULL, 0xd5a79147930aa725ULL, 0x06ca6351e003826fULL, 0x142929670a0e6e70ULL,
  0x27b70a8546d22ffcULL, 0x2e1b21385c26c926ULL, 0x4d2c6dfc5ac42aedULL, 0x53380d139d95b3dfULL,
  0x650a73548baf63deULL, 0x766a0abb3c77b2a8ULL, 0x81c2c92e47edaee6ULL, 0x92722c851482353bULL,
  0xa2bfe8a14cf10364ULL, 0xa81a664bbc423001ULL, 0xc24b8b70d0f89791ULL, 0xc76c51a30654be30ULL,
  0xd192e819d6ef5218ULL, 0xd69906245565a910ULL, 0xf40e35855771202aULL, 0x106aa07032bbd1b8ULL,
  0x19a4c116b8d2d0c8ULL, 0x1e376c085141ab53ULL, 0x2748774cdf8eeb99ULL, 0x34b0bcb5e19b48a8ULL,
  0x391c0cb3c5c95a63ULL, 0x4ed8aa4ae3418acbULL, 0x5b9cca4f7763e373ULL, 0x682e6ff3d6b2b8a3ULL,
  0x748f82ee5defb2fcULL, 0x78a5636f43172f60ULL, 0x84c87814a1f0ab72ULL, 0x8cc702081a6439ecULL,
  0x90befffa23631e28ULL, 0xa4506cebde82bde9ULL, 0xbef9a3f7b2c67915ULL, 0xc67178f2e372532bULL,
  0xca273eceea26619cULL, 0xd186b8c721c0c207ULL, 0xeada7dd6cde0eb1eULL, 0xf57d4f7fee6ed178ULL,
  0x06f067aa72176fbaULL, 0x0a637dc5a2c898a6ULL, 0x113f9804bef90daeULL, 0x1b710b35131c471bULL,
  0x28db77f523047d84ULL, 0x32caab7b40c72493ULL, 0x3c9ebe0a15c9bebcULL, 0x431d67c49c100d4cULL,
  0x4cc5d4becb3e42b6ULL, 0x597f299cfc657e2aULL, 0x5fcb6fab3ad6faecULL, 0x6c44198c4a475817ULL,
};

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
#define X4_KW(t) X4_ADD(w[(t) & 15], _mm256_set1_epi64x((long long)SHA512_X4_K[t]))
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
#define X4_K0(t) _mm256_set1_epi64x((long long)SHA512_X4_K[t])
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
