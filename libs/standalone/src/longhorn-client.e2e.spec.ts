import { spawn, spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { startStandalone, type StandaloneHandle } from './standalone.js';
import { BINARIES, binariesBuilt, REPO_ROOT, startImageServer, tempDir, writeImage, type ImageServer } from './test-support/e2e.js';

/*
 * Longhorn's own Python client (longhorn-tests' `longhorn.py`, unmodified, found through LONGHORN_CLIENT_PY) drives
 * the real standalone system through the scenarios of tools/longhorn-client-scenarios, built as longhorn-tests build
 * it: `longhorn.from_env(url=<api>/v1/schemas)`, no extra headers.
 */

const SCENARIOS = path.join(REPO_ROOT, 'tools/longhorn-client-scenarios');
const CLIENT = process.env['LONGHORN_CLIENT_PY'] ?? '';

function missingRequirement(): string | undefined {
  if (!CLIENT) return 'LONGHORN_CLIENT_PY is not set (the path of longhorn-tests\' longhorn.py)';
  if (!existsSync(CLIENT)) return `LONGHORN_CLIENT_PY=${CLIENT} does not exist`;
  const py = spawnSync('python3', ['-c', 'import requests, six'], { encoding: 'utf8' });
  if (py.error) return 'python3 is not installed';
  if (py.status !== 0) return `python3 cannot import requests and six (Debian: apt-get install python3-requests python3-six): ${py.stderr.trim().split('\n').pop()}`;
  return undefined;
}

const missing = missingRequirement();
const suite = missing ? describe.skip : describe;
const title = missing ? `Longhorn's Python client scenarios — SKIPPED: ${missing}` : "Longhorn's Python client scenarios";
if (missing) console.warn(title);

let tmp: { dir: string; remove(): Promise<void> };
let server: ImageServer;
let sum: string;
let sys: StandaloneHandle;

/** Runs one scenario script; resolves with its exit code and output. */
function runScenario(script: string, timeoutMs: number): Promise<{ code: number | null; output: string }> {
  return new Promise((resolve) => {
    const child = spawn('python3', ['-u', path.join(SCENARIOS, script)], {
      cwd: SCENARIOS,
      env: {
        PATH: process.env['PATH'] ?? '/usr/bin:/bin',
        HOME: tmp.dir,
        LONGHORN_CLIENT_PY: CLIENT,
        BIS_API: sys.url,
        BIS_IMAGE_URL: server.url('parrot.raw'),
        BIS_IMAGE_SHA512: sum,
        BIS_IMAGE_FILE: path.join(tmp.dir, 'parrot.raw'),
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    child.stdout.on('data', (b: Buffer) => (output += b.toString()));
    child.stderr.on('data', (b: Buffer) => (output += b.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, output });
    });
  });
}

suite(title, () => {
  beforeAll(async () => {
    if (!(await binariesBuilt())) throw new Error('build the data-plane apps first: npx nx run-many -t build -p backing-image-manager backing-image-data-source');
    tmp = await tempDir('bis-longhorn-client-');
    sum = await writeImage(path.join(tmp.dir, 'parrot.raw'), 2 * 1024 * 1024, 7);
    server = await startImageServer(tmp.dir);
    sys = await startStandalone({
      dataDir: path.join(tmp.dir, 'data'),
      listen: '127.0.0.1:0',
      disks: 3,
      allowSourceHosts: ['127.0.0.1'],
      binaries: BINARIES,
      controllerOptions: { resyncMs: 2000, timing: { dataSourcePollMs: 200, managerPollMs: 200, waitRequeueMs: 300 } },
    });
  }, 60_000);

  afterAll(async () => {
    await sys?.stop();
    await server?.close();
    await tmp?.remove();
  });

  for (const script of ['create_list_get_delete.py', 'errors.py', 'upload_clone_checksum.py', 'cleanup_min_copies_eviction.py', 'backups.py']) {
    it(script, async () => {
      const { code, output } = await runScenario(script, 170_000);
      expect({ script, code, output }).toEqual({ script, code: 0, output: expect.stringMatching(/\nok\n?$|^ok\n?$/) });
    }, 180_000);
  }
});
