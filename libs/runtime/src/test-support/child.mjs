// A data-plane stand-in: watches its parent through the liveness pipe, starts a grandchild in its process group,
// prints both pids (on stdout, the parent's log) and stays up until told to stop (its SIGTERM handler takes a moment, like a real shutdown).
import { spawn } from 'node:child_process';
import { appendFileSync } from 'node:fs';
import { exitWithParent } from '../../dist/index.js';

const watching = exitWithParent({ graceMs: 5000 });
const grandchild = spawn('sleep', ['1000'], { stdio: 'ignore' });
process.stdout.write(`${JSON.stringify({ watching, pid: process.pid, grandchild: grandchild.pid })}\n`);
process.on('SIGTERM', () => {
  // stdout went to the parent, which is gone: the marker goes to a file.
  appendFileSync(process.env.MARKER_FILE, `${process.pid} SIGTERM: stopping\n`);
  setTimeout(() => process.exit(0), 100);
});
setInterval(() => undefined, 1 << 30);
