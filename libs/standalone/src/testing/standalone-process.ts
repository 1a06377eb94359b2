import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

/** Repository root (libs/standalone/{src,dist}/testing → ../../../..). */
const REPO_ROOT = resolve(import.meta.dirname, '../../../..');
/** The built controller-manager app (its `build` target writes dist/). */
export const CONTROLLER_MANAGER_BIN = join(REPO_ROOT, 'apps/controller-manager/bin/controller-manager.js');

export interface StandaloneProcess {
  /** `http://127.0.0.1:<port>`: the REST API under `/v1` (and the web UI at `/` when `uiDir` was given). */
  url: string;
  dataDir: string;
  child: ChildProcess;
  output(): string;
  stop(): Promise<void>;
}

/**
 * Runs the real system, `controller-manager standalone` (the built app: embedded store, controllers, manager and
 * data-source processes, REST API and, with `uiDir`, the web UI), as a child process with a fresh data directory on a
 * free loopback port, and waits until it prints where the API (and the UI) is. `stop` sends SIGTERM (the system stops its
 * data-plane processes), waits for the exit (SIGKILL after 20 s) and removes the data directory.
 */
export async function startStandaloneProcess(
  opts: { disks?: number; allowSourceHosts?: string; uiDir?: string; extraArgs?: readonly string[] } = {},
): Promise<StandaloneProcess> {
  const dataDir = await mkdtemp(join(tmpdir(), 'bis-standalone-process-'));
  const args = [
    CONTROLLER_MANAGER_BIN, 'standalone', '--data-dir', dataDir, '--listen', '127.0.0.1:0', '--disks', String(opts.disks ?? 3),
    '--allow-source-hosts', opts.allowSourceHosts ?? '127.0.0.1', ...(opts.uiDir ? ['--ui-dir', opts.uiDir] : []),
    ...(opts.extraArgs ?? []),
  ];
  const child = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, NODE_OPTIONS: '' } });
  let out = '';
  child.stdout!.on('data', (d: Buffer) => (out += d));
  child.stderr!.on('data', (d: Buffer) => (out += d));
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  const stop = async (): Promise<void> => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM');
      const t = setTimeout(() => child.kill('SIGKILL'), 20_000);
      await exited;
      clearTimeout(t);
    }
    await rm(dataDir, { recursive: true, force: true });
  };
  try {
    const url = await new Promise<string>((res, rej) => {
      const deadline = setTimeout(() => rej(new Error(`controller-manager did not start within 30 s:\n${out}`)), 30_000);
      const check = (): void => {
        if (opts.uiDir && /web UI:\s+not served/.test(out)) {
          clearTimeout(deadline);
          rej(new Error(`controller-manager does not serve the web UI (build it first: npx nx run ui:build):\n${out}`));
        }
        const m = opts.uiDir ? /web UI:\s+(http:\/\/\S+?)\/\s/.exec(out) : /REST API:\s+(http:\/\/\S+?)\/v1/.exec(out);
        if (m) {
          clearTimeout(deadline);
          res(m[1]!);
        }
      };
      child.stdout!.on('data', check);
      child.once('exit', (code) => {
        clearTimeout(deadline);
        rej(new Error(`controller-manager exited with ${code}:\n${out}`));
      });
    });
    return { url, dataDir, child, output: () => out, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}
