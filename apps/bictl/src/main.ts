import { readFileSync } from 'node:fs';
import { run } from './cli.js';

const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string };
const ac = new AbortController();
let signals = 0;
for (const sig of ['SIGINT', 'SIGTERM'] as const) {
  process.on(sig, () => {
    // First signal: cancel the running request cleanly (partial downloads are removed); second: exit at once.
    if (++signals > 1) process.exit(130);
    ac.abort(new Error(`received ${sig}`));
  });
}
process.stdout.on('error', (err: NodeJS.ErrnoException) => {
  if (err.code === 'EPIPE') process.exit(0);
});
const code = await run(process.argv.slice(2), { stdout: process.stdout, stderr: process.stderr, env: process.env, signal: ac.signal }, pkg.version);
process.exitCode = code;
