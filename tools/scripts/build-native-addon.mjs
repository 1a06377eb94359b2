// Builds one of the workspace's N-API addons with node-gyp. Each addon's `native/build.mjs` (run by `npm install`
// through its package's `install` script, or by hand with `npm run build:native -w <package>`) calls this.
//
// - node-gyp: the one npm passes in npm_config_node_gyp, else npm's bundled copy next to the running node, else
//   `node-gyp` on PATH.
// - headers: `npm_config_nodedir` when set; otherwise, if the running node's install prefix has include/node/node_api.h
//   (Debian's nodejs package, official tarballs), that prefix, so the build never needs to download headers.
// - A failed build does not fail `npm install` (the library has a fallback and says so at run time) unless
//   BIS_REQUIRE_NATIVE=1, which makes it an error (CI sets it).
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';

/**
 * @param {{ nativeDir: string, failure: (why: string) => string }} addon the directory holding binding.gyp, and the
 *   message printed when the build fails (given the reason).
 */
export function buildNativeAddon({ nativeDir, failure }) {
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
  if (result.status === 0) return;
  const message = failure(result.error ? result.error.message : `node-gyp exited with ${result.status ?? result.signal}`);
  if (process.env.BIS_REQUIRE_NATIVE === '1') {
    console.error(message);
    process.exit(1);
  }
  console.warn(message);
}
