/*
 * sha512_x8: SHA-512 compression of eight independent messages at once, one per 64-bit lane of AVX-512 registers
 * (FIPS 180-4 §6.4.2, the same arithmetic as the scalar code, eight times in parallel). The chain verifier uses it to
 * check eight segments' links in one pass: on a core with AVX-512 this compresses about 4x (data) to 7x (zeros) more
 * bytes per second than one OpenSSL stream. Used only when the CPU and the OS support AVX-512F and AVX-512BW
 * (checked at run time); otherwise the addon uses OpenSSL for every segment. Every result is also a chain link that
 * must equal the state recorded by OpenSSL, so a fault here shows up as a mismatch, never as a false match.
 */
#ifndef SHA512_X8_H
#define SHA512_X8_H
#include <stdint.h>
#include <stddef.h>

#define SHA512_X8_LANES 8

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include "sha512_k.h"


#define SHA512_X8_TARGET __attribute__((target("avx512f,avx512bw")))

#define X8_ROR(x, n) _mm512_ror_epi64((x), (n))
/* xor of three: 0x96; Ch(e,f,g) = (e&f)^(~e&g): 0xCA; Maj: 0xE8 */
#define X8_XOR3(a, b, c) _mm512_ternarylogic_epi64((a), (b), (c), 0x96)
#define X8_CH(e, f, g) _mm512_ternarylogic_epi64((e), (f), (g), 0xCA)
#define X8_MAJ(a, b, c) _mm512_ternarylogic_epi64((a), (b), (c), 0xE8)
#define X8_BSIG0(x) X8_XOR3(X8_ROR(x, 28), X8_ROR(x, 34), X8_ROR(x, 39))
#define X8_BSIG1(x) X8_XOR3(X8_ROR(x, 14), X8_ROR(x, 18), X8_ROR(x, 41))
#define X8_SSIG0(x) X8_XOR3(X8_ROR(x, 1), X8_ROR(x, 8), _mm512_srli_epi64(x, 7))
#define X8_SSIG1(x) X8_XOR3(X8_ROR(x, 19), X8_ROR(x, 61), _mm512_srli_epi64(x, 6))
#define X8_ADD(a, b) _mm512_add_epi64((a), (b))

#define X8_RND(a, b, c, d, e, f, g, h, kw) do { \
    __m512i t1_ = X8_ADD(X8_ADD(h, X8_BSIG1(e)), X8_ADD(X8_CH(e, f, g), kw)); \
    d = X8_ADD(d, t1_); \
    h = X8_ADD(t1_, X8_ADD(X8_BSIG0(a), X8_MAJ(a, b, c))); \
  } while (0)

/*
 * Compresses nblocks 128-byte blocks into 8 independent SHA-512 states at once (one per 64-bit lane).
 * st[l][0..7]: lane l's h0..h7 (host order). data[l]: lane l's bytes (nblocks * 128), or NULL for zero bytes (read from
 * one static zero block). When every lane is zeros the message schedule is skipped: all its words are zero.
 */
SHA512_X8_TARGET static void sha512_x8(uint64_t st[SHA512_X8_LANES][8], const uint8_t *const data[SHA512_X8_LANES], size_t nblocks) {
  static const uint8_t zero_block[128] __attribute__((aligned(64)));
  __m512i idx = _mm512_set_epi64(56, 48, 40, 32, 24, 16, 8, 0);
  __m512i s[8];
  for (int i = 0; i < 8; i++) s[i] = _mm512_i64gather_epi64(_mm512_add_epi64(idx, _mm512_set1_epi64(i)), (const long long *)&st[0][0], 8);
  int any_data = 0;
  int64_t base[SHA512_X8_LANES], step[SHA512_X8_LANES];
  for (int l = 0; l < SHA512_X8_LANES; l++) {
    if (data[l]) { any_data = 1; base[l] = (int64_t)(uintptr_t)data[l]; step[l] = 128; }
    else { base[l] = (int64_t)(uintptr_t)zero_block; step[l] = 0; }
  }
  __m512i addr = _mm512_loadu_si512(base);
  const __m512i stepv = _mm512_loadu_si512(step);
  const __m512i bswap = _mm512_set_epi8(
      8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7,
      8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  for (size_t blk = 0; blk < nblocks; blk++) {
    __m512i a = s[0], b = s[1], c = s[2], d = s[3], e = s[4], f = s[5], g = s[6], h = s[7];
    if (any_data) {
      __m512i w[16];
      for (int j = 0; j < 16; j++) {
        w[j] = _mm512_shuffle_epi8(_mm512_i64gather_epi64(_mm512_add_epi64(addr, _mm512_set1_epi64(8 * j)), (const long long *)0, 1), bswap);
      }
      addr = _mm512_add_epi64(addr, stepv);
#define X8_KW(t) X8_ADD(w[(t) & 15], _mm512_set1_epi64((long long)SHA512_K[t]))
#define X8_SCHED(t) (w[(t) & 15] = X8_ADD(X8_ADD(w[(t) & 15], X8_SSIG1(w[((t) - 2) & 15])), X8_ADD(w[((t) - 7) & 15], X8_SSIG0(w[((t) - 15) & 15]))))
#define X8_R8(t, KWF) \
      X8_RND(a, b, c, d, e, f, g, h, KWF(t + 0)); X8_RND(h, a, b, c, d, e, f, g, KWF(t + 1)); \
      X8_RND(g, h, a, b, c, d, e, f, KWF(t + 2)); X8_RND(f, g, h, a, b, c, d, e, KWF(t + 3)); \
      X8_RND(e, f, g, h, a, b, c, d, KWF(t + 4)); X8_RND(d, e, f, g, h, a, b, c, KWF(t + 5)); \
      X8_RND(c, d, e, f, g, h, a, b, KWF(t + 6)); X8_RND(b, c, d, e, f, g, h, a, KWF(t + 7));
#define X8_KWS(t) (X8_SCHED(t), X8_KW(t))
      X8_R8(0, X8_KW) X8_R8(8, X8_KW)
      X8_R8(16, X8_KWS) X8_R8(24, X8_KWS) X8_R8(32, X8_KWS) X8_R8(40, X8_KWS) X8_R8(48, X8_KWS) X8_R8(56, X8_KWS) X8_R8(64, X8_KWS) X8_R8(72, X8_KWS)
    } else {
#define X8_K0(t) _mm512_set1_epi64((long long)SHA512_K[t])
      X8_R8(0, X8_K0) X8_R8(8, X8_K0) X8_R8(16, X8_K0) X8_R8(24, X8_K0) X8_R8(32, X8_K0) X8_R8(40, X8_K0) X8_R8(48, X8_K0) X8_R8(56, X8_K0) X8_R8(64, X8_K0) X8_R8(72, X8_K0)
    }
    s[0] = X8_ADD(s[0], a); s[1] = X8_ADD(s[1], b); s[2] = X8_ADD(s[2], c); s[3] = X8_ADD(s[3], d);
    s[4] = X8_ADD(s[4], e); s[5] = X8_ADD(s[5], f); s[6] = X8_ADD(s[6], g); s[7] = X8_ADD(s[7], h);
  }
  for (int i = 0; i < 8; i++) _mm512_i64scatter_epi64((long long *)&st[0][0], _mm512_add_epi64(idx, _mm512_set1_epi64(i)), s[i], 8);
}


/* Whether this CPU and OS can run sha512_x8 (libgcc checks the CPUID bits and that the OS saves the AVX-512 state). */
static int sha512_x8_supported(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
}

#else
/* Not x86-64 (arm64 nodes, for instance): no eight-lane path; advanceMany runs OpenSSL message by message. */
static int sha512_x8_supported(void) {
  return 0;
}

static void sha512_x8(uint64_t st[SHA512_X8_LANES][8], const uint8_t *const data[SHA512_X8_LANES], size_t nblocks) {
  (void)st;
  (void)data;
  (void)nblocks;
}
#endif

#endif
