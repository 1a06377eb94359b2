#!/usr/bin/env node
// Builds the block_mapping N-API addon with node-gyp (run by `npm install` through the package's `install` script,
// or by hand with `npm run build:native -w @bis/block-mapping`).
//
// - node-gyp: the one npm passes in npm_config_node_gyp, else npm's bundled copy next to the running node, else
//   `node-gyp` on PATH.
// - headers: `npm_config_nodedir` when set; otherwise, if the running node's install prefix has include/node/node_api.h
//   (Debian's nodejs package, official tarballs), that prefix, so the build never needs to download headers.
// - A failed build does not fail `npm install`: the library then falls back to its pure TypeScript `zero-scan` backend
//   and says so once at run time. Set BIS_REQUIRE_NATIVE=1 to make a failed build an error (CI does).
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
    `@bis/block-mapping: building the native SEEK_DATA/SEEK_HOLE/PUNCH_HOLE addon failed (${why}); ` +
    'the library will use its slower zero-scan backend.';
  if (process.env.BIS_REQUIRE_NATIVE === '1') {
    console.error(message);
    process.exit(1);
  }
  console.warn(message);
}
