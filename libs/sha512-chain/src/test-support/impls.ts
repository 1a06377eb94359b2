import { readFileSync } from 'node:fs';
import { describe } from '@jest/globals';
import type { Sha512Impl } from '../native.js';

/** The CPU flags of the first processor in /proc/cpuinfo (empty where there is none, e.g. not Linux). */
function cpuFlags(): Set<string> {
  try {
    const line = readFileSync('/proc/cpuinfo', 'utf8')
      .split('\n')
      .find((l) => /^(flags|Features)\s*:/.test(l));
    return new Set((line?.split(':')[1] ?? '').trim().split(/\s+/));
  } catch {
    return new Set();
  }
}

const flags = cpuFlags();
/** Whether this CPU reports AVX-512F and AVX-512BW, the instructions of the eight-lane SHA-512. */
export const CPU_HAS_AVX512 = flags.has('avx512f') && flags.has('avx512bw');
/** Whether this CPU reports AVX2, the instructions of the four-lane SHA-512. */
export const CPU_HAS_AVX2 = flags.has('avx2');

/** Each implementation of `advanceMany`, with the reason its suite is skipped on this machine (if it is). */
export const IMPLS: Array<{ impl: Sha512Impl; skip: string | undefined }> = [
  { impl: 'openssl', skip: undefined },
  { impl: 'avx2', skip: CPU_HAS_AVX2 && process.arch === 'x64' ? undefined : 'this CPU has no AVX2 (/proc/cpuinfo), or this is not an x86-64 build' },
  { impl: 'avx512', skip: CPU_HAS_AVX512 && process.arch === 'x64' ? undefined : 'this CPU has no AVX-512F/BW (/proc/cpuinfo), or this is not an x86-64 build' },
];

/**
 * describe.each over the implementations, each forced with an explicit `impl`: every machine runs the OpenSSL suite,
 * the AVX2 one where the CPU has AVX2 (every x86-64 of the last decade, including those with AVX-512, so the AVX-512
 * machines run the AVX2 path too), and the AVX-512 one where the CPU has it; a skipped suite names why, and the title says which path ran.
 */
export function describeImpls(title: string, body: (impl: Sha512Impl) => void): void {
  for (const { impl, skip } of IMPLS) {
    if (skip) {
      console.warn(`${title} [${impl}]: skipped, ${skip}`);
      describe.skip(`${title} [${impl}: skipped, ${skip}]`, () => body(impl));
    } else describe(`${title} [${impl}]`, () => body(impl));
  }
}
