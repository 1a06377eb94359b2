// What a benchmark ran on: the CPU model, the CPU flags that decide the SHA-512 path, the path @bis/sha512-chain takes
// (BIS_SHA512_CHAIN_IMPL, default auto: AVX-512, else AVX2, else OpenSSL) and the load average. Every benchmark prints
// this line first, so a figure is never quoted without the machine kind it was measured on.
import { readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const HASH_FLAGS = ['avx2', 'avx512f', 'avx512bw', 'sha_ni', 'sha512'];

/** `repo`: the checkout whose built @bis/sha512-chain decides the path. */
export async function describeMachine(repo) {
  let model = os.cpus()[0]?.model ?? 'unknown CPU';
  let flags = new Set();
  try {
    const info = readFileSync('/proc/cpuinfo', 'utf8');
    model = /^model name\s*:\s*(.*)$/m.exec(info)?.[1] ?? model;
    flags = new Set((/^(?:flags|Features)\s*:\s*(.*)$/m.exec(info)?.[1] ?? '').split(/\s+/));
  } catch {
    // not Linux: the model from os.cpus() and no flags
  }
  let impl;
  try {
    const chain = await import(path.join(repo, 'libs/sha512-chain/dist/index.js'));
    impl = `${chain.sha512ChainImpl()} (${chain.multiBufferLanes()} lane${chain.multiBufferLanes() === 1 ? '' : 's'})`;
  } catch (err) {
    impl = `unknown (${err instanceof Error ? err.message : String(err)})`;
  }
  const present = HASH_FLAGS.filter((f) => flags.has(f));
  return (
    `machine: ${model}, ${os.cpus().length} cores, ${process.arch}; flags: ${present.join(' ') || 'none of ' + HASH_FLAGS.join(' ')}; ` +
    `SHA-512 chain path: ${impl}${process.env.BIS_SHA512_CHAIN_IMPL ? ` (BIS_SHA512_CHAIN_IMPL=${process.env.BIS_SHA512_CHAIN_IMPL})` : ''}; ` +
    `load ${os.loadavg().map((x) => x.toFixed(2)).join(' ')}`
  );
}
