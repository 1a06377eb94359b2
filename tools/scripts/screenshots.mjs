#!/usr/bin/env node
// Refreshes docs/screenshots/*.png from the real system: builds the web UI and the apps of the standalone system,
// then runs the UI end-to-end test (apps/ui/src/ui.spec.ts), which starts `controller-manager standalone` with a
// fresh data directory, fills it with demo images (download, upload, bad checksum, backup, restore) and captures
// each page in headless Chromium: create.png, detail.png, list.png, backups.png.
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const env = { ...process.env, NX_NO_CLOUD: 'true', NX_DAEMON: 'false' };
const run = (cmd, args, extra = {}) => {
  const r = spawnSync(cmd, args, { cwd: root, stdio: 'inherit', env: { ...env, ...extra } });
  if (r.status !== 0) {
    console.error(`screenshots: ${cmd} ${args.join(' ')} failed (exit ${r.status ?? r.signal})`);
    process.exit(r.status ?? 1);
  }
};
const outDir = process.argv[2] ?? 'docs/screenshots';
run('npx', ['nx', 'run-many', '-t', 'build', '-p', 'ui', 'controller-manager', 'backing-image-manager', 'backing-image-data-source']);
run('npx', ['jest', '-c', 'apps/ui/jest.config.js'], {
  BIS_SCREENSHOTS: outDir,
  BIS_WORKSPACE_ROOT: root,
  NODE_OPTIONS: '--experimental-vm-modules --no-warnings',
});
console.log(`screenshots written to ${path.resolve(root, outDir)}`);
