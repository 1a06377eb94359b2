// A parent that starts children through the built runtime (dist/), prints their pids, then waits to be killed.
// argv: <pidDir> <logsDir> <child script> <count>
import path from 'node:path';
import { LocalProcessRuntime } from '../../dist/index.js';

const [pidDir, logsDir, childScript, count] = process.argv.slice(2);
const rt = new LocalProcessRuntime({ pidDir });
const pids = [];
for (let i = 0; i < Number(count); i++) {
  const s = await rt.start({ name: `child-${i}`, command: process.execPath, args: [childScript], env: { MARKER_FILE: path.join(logsDir, 'markers') }, logFile: path.join(logsDir, `child-${i}.log`) });
  pids.push(s.pid);
}
process.stdout.write(`${JSON.stringify({ pids })}\n`);
setInterval(() => undefined, 1 << 30);
