#!/usr/bin/env node
// `npm test`: every check and every test suite of the workspace.
//   1. module boundaries (libs never import apps, no cycles)
//   2. Nx project references in sync
//   3. typecheck + jest for every project (nx run-many), two at a time
import { spawnSync } from 'node:child_process';

const env = { ...process.env, NX_NO_CLOUD: 'true', NX_DAEMON: 'false', NX_TUI: 'false' };
function run(cmd, args) {
  console.log(`\n$ ${cmd} ${args.join(' ')}`);
  const r = spawnSync(cmd, args, { stdio: 'inherit', env });
  if (r.status !== 0) {
    console.error(`\nfailed: ${cmd} ${args.join(' ')} (exit ${r.status ?? r.signal})`);
    process.exit(r.status ?? 1);
  }
}
const extra = process.argv.slice(2);
run('node', ['tools/scripts/check-boundaries.mjs']);
run('npx', ['--no-install', 'nx', 'sync:check']);
run('npx', ['--no-install', 'nx', 'run-many', '-t', 'typecheck', 'test', '--parallel=2', '--outputStyle=static', ...extra]);
