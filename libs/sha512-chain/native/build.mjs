#!/usr/bin/env node
// Builds the sha512_chain N-API addon with node-gyp (run by `npm install` through the package's `install` script,
// or by hand with `npm run build:native -w @bis/sha512-chain`).
//
// - node-gyp: the one npm passes in npm_config_node_gyp, else npm's bundled copy next to the running node, else
//   `node-gyp` on PATH.
// - headers: `npm_config_nodedir` when set; otherwise, if the running node's install prefix has include/node/node_api.h
//   (Debian's nodejs package, official tarballs), that prefix, so the build never needs to download headers. The
//   addon also needs <nodedir>/include/node/openssl/sha.h: it calls the OpenSSL SHA-512 that the node binary exports.
// - A failed build does not fail `npm install`: nativeSha512ChainAvailable() then returns false and callers fall back
//   to a sequential createHash('sha512'). Set BIS_REQUIRE_NATIVE=1 to make a failed build an error (CI does).
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const nativeDir = dirname(fileURLToPath(import.meta.url));
const args = ['rebuild', '--directory', nativeDir];
const env = { ...process.env };
if (!env.npm_config_nodedir) {
  const prefix = resolve(dirname(process.execPath), '..');
  if (existsSync(join(prefix, 'include', 'node', 'node_api.h'))) env.npm_config_nodedir = prefix;
}
const bundledGyp = join(dirname(process.execPath), '..', 'lib', 'node_modules', 'npm', 'node_modules', 'node-gyp', 'bin', 'node-gyp.js');
const gyp = env.npm_config_node_gyp || (existsSync(bundledGyp) ? bundledGyp : undefined);
const result = gyp
  ? spawnSync(process.execPath, [gyp, ...args], { stdio: 'inherit', env })
  : spawnSync('node-gyp', args, { stdio: 'inherit', env });
const ok = result.status === 0;
if (!ok) {
  const why = result.error ? result.error.message : `node-gyp exited with ${result.status ?? result.signal}`;
  const message =
    `@bis/sha512-chain: building the native SHA-512 chain addon failed (${why}); ` +
    'nativeSha512ChainAvailable() will return false and callers fall back to a sequential SHA-512.';
  if (process.env.BIS_REQUIRE_NATIVE === '1') {
    console.error(message);
    process.exit(1);
  }
  console.warn(message);
}
