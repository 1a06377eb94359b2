import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { existsSync, promises as fsp } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { ManagerClient } from '@bis/bimrpc';
import { SyncClient } from '@bis/sync-service';

const APP_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const REPO_ROOT = path.resolve(APP_ROOT, '../..');
const BIN = path.join(APP_ROOT, 'bin/backing-image-manager.js');

/** Builds the daemon (tsc -b is incremental, so this is quick when it is up to date). */
export function buildDaemon(): void {
  execFileSync(process.execPath, [path.join(REPO_ROOT, 'node_modules/typescript/bin/tsc'), '-b', path.join(APP_ROOT, 'tsconfig.lib.json')], {
    cwd: REPO_ROOT,
    stdio: 'inherit',
  });
  if (!existsSync(path.join(APP_ROOT, 'dist/main.js'))) throw new Error('daemon build produced no dist/main.js');
}

export interface DaemonProcess {
  disk: string;
  grpcAddress: string;
  syncAddress: string;
  client: ManagerClient;
  sync: SyncClient;
  child: ChildProcess;
  stderr(): string;
  /** SIGTERM, then wait for exit; resolves the exit code. */
  stop(): Promise<number | null>;
}

// receive ports below the kernel's ephemeral range (32768+), spread so that parallel test runs rarely collide
let nextRange = 21000 + Math.floor(Math.random() * 110) * 100;

/** Creates a disk directory with `longhorn-disk.cfg`. */
export async function makeDisk(root: string, name: string, diskUUID = `disk-${name}`): Promise<string> {
  const disk = path.join(root, name);
  await fsp.mkdir(disk, { recursive: true });
  await fsp.writeFile(path.join(disk, 'longhorn-disk.cfg'), JSON.stringify({ diskUUID }));
  return disk;
}

/** Runs `backing-image-manager daemon` on loopback; rejects with its stderr when it exits before being ready. */
export async function startDaemonProcess(
  disk: string,
  extraArgs: string[] = [],
  env: Record<string, string> = {},
  opts: { token?: string; globalArgs?: string[] } = {},
): Promise<DaemonProcess> {
  const range = `${nextRange}-${nextRange + 9}`;
  nextRange += 10;
  const child = spawn(
    process.execPath,
    [
      BIN,
      ...(opts.globalArgs ?? []),
      'daemon',
      '--listen', '127.0.0.1:0',
      '--sync-listen', '127.0.0.1:0',
      '--disk-path', disk,
      '--port-range', range,
      '--advertise-address', '127.0.0.1',
      '--monitor-interval-ms', '500',
      ...extraArgs,
    ],
    { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env } },
  );
  let err = '';
  child.stderr!.on('data', (c: Buffer) => (err += c.toString()));
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  const lines = createInterface({ input: child.stdout! });
  const ready = await new Promise<{ grpcPort: number; syncPort: number }>((resolve, reject) => {
    lines.once('line', (l) => resolve(JSON.parse(l) as { grpcPort: number; syncPort: number }));
    void exited.then((code) => reject(new Error(`daemon exited with ${code}: ${err}`)));
  });
  const grpcAddress = `127.0.0.1:${ready.grpcPort}`;
  const syncAddress = `127.0.0.1:${ready.syncPort}`;
  const client = new ManagerClient(grpcAddress, { callTimeoutMs: 20_000, token: opts.token });
  const sync = new SyncClient(syncAddress, { token: opts.token });
  return {
    disk,
    grpcAddress,
    syncAddress,
    client,
    sync,
    child,
    stderr: () => err,
    stop: async () => {
      client.close();
      sync.close();
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      const t = setTimeout(() => child.kill('SIGKILL'), 10_000);
      const code = await exited;
      clearTimeout(t);
      return code;
    },
  };
}

/** Runs the daemon expecting it to refuse to start; resolves its exit code and stderr. */
export async function runDaemonExpectingFailure(args: string[]): Promise<{ code: number | null; stderr: string }> {
  const child = spawn(process.execPath, [BIN, 'daemon', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr!.on('data', (c: Buffer) => (stderr += c.toString()));
  const t = setTimeout(() => child.kill('SIGKILL'), 10_000);
  const code = await new Promise<number | null>((resolve) => child.once('exit', (c) => resolve(c)));
  clearTimeout(t);
  return { code, stderr };
}
