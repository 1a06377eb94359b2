import { parseHostPort } from '@bis/net-address';
import { promises as fsp } from 'node:fs';
import { Server, ServerCredentials } from '@grpc/grpc-js';
import { BackingImageManagerServiceService, withInternalAuth } from '@bis/bimrpc';
import type { InternalAuth } from '@bis/internal-auth';
import { createFileSources } from '@bis/file-sources';
import { ManagerService, checkDiskConfig } from '@bis/manager';
import type { LockTiming } from '@bis/backupstore';
import { backupstoreRestore, backupstoreRunner } from './backup-runner.js';
import {
  PortAllocator,
  SyncService,
  backingImagesRoot,
  diskTmpDir,
  parsePortRange,
  startSyncServer,
  type ScrubOptions,
} from '@bis/sync-service';

export interface DaemonConfig {
  listen: string;
  syncListen: string;
  diskPath: string;
  diskUUID?: string;
  portRange: string;
  /** Address peers use to reach this daemon's receivers. */
  advertiseHost: string;
  /** Hosts download sources may reach although private/loopback. */
  allowSourceHosts: string[];
  watchIntervalMs: number;
  monitorIntervalMs: number;
  /** Background scrub of ready copies (`--scrub-interval`, `--scrub-bandwidth`); off when absent. */
  scrub?: ScrubOptions;
  /** Backupstore lock timing for BackupCreate (default Longhorn's). */
  backupLockTiming?: LockTiming;
  /** Token internal callers must send (gRPC, sync HTTP, peer receivers) and this daemon sends to its peers. */
  internalAuth?: InternalAuth;
  log: (message: string) => void;
}

export interface RunningDaemon {
  grpcPort: number;
  syncPort: number;
  stop(): Promise<void>;
}

/** Starts the sync HTTP service, then the gRPC service; stop() cancels transfers and removes temporary files. */
export async function startDaemon(cfg: DaemonConfig): Promise<RunningDaemon> {
  const diskUUID = await checkDiskConfig(cfg.diskPath, cfg.diskUUID);
  const ports = new PortAllocator(parsePortRange(cfg.portRange));
  const grpcAddr = parseHostPort(cfg.listen, { what: '--listen', defaultHost: '0.0.0.0' });
  const syncAddr = parseHostPort(cfg.syncListen, { what: '--sync-listen', defaultHost: '0.0.0.0' });
  await fsp.mkdir(backingImagesRoot(cfg.diskPath), { recursive: true });
  await fsp.mkdir(diskTmpDir(cfg.diskPath), { recursive: true });

  const sync = new SyncService({
    diskPath: cfg.diskPath,
    sources: createFileSources({
      allowSourceHosts: cfg.allowSourceHosts,
      restoreBackup: backupstoreRestore({ lockTiming: cfg.backupLockTiming, root: cfg.diskPath }),
    }),
    receiverHost: cfg.advertiseHost === '0.0.0.0' ? undefined : cfg.advertiseHost,
    monitorIntervalMs: cfg.monitorIntervalMs,
    scrub: cfg.scrub,
    internalAuth: cfg.internalAuth,
    log: cfg.log,
  });
  const http = await startSyncServer(sync, syncAddr, { auth: cfg.internalAuth });
  const syncPort = (http.server.address() as { port: number }).port;
  const manager = new ManagerService({
    diskPath: cfg.diskPath,
    diskUUID,
    sync,
    ports,
    syncAddress: `${cfg.advertiseHost}:${syncPort}`,
    receiverHost: cfg.advertiseHost,
    watchIntervalMs: cfg.watchIntervalMs,
    backup: backupstoreRunner({ lockTiming: cfg.backupLockTiming }),
    internalToken: cfg.internalAuth?.token,
    log: cfg.log,
  });
  const grpc = new Server();
  grpc.addService(
    BackingImageManagerServiceService,
    withInternalAuth(manager.implementation(), cfg.internalAuth, (method, reason) => cfg.log(`refused gRPC ${method}: ${reason}`)),
  );
  let grpcPort: number;
  try {
    grpcPort = await new Promise<number>((resolve, reject) =>
      grpc.bindAsync(`${grpcAddr.host}:${grpcAddr.port}`, ServerCredentials.createInsecure(), (err, port) =>
        err ? reject(err) : resolve(port),
      ),
    );
  } catch (err) {
    await sync.close();
    await http.close();
    throw err;
  }
  // peers reach this manager at the advertised host: it names itself there when it asks them to send
  if (cfg.advertiseHost !== '0.0.0.0') manager.setAddress(`${cfg.advertiseHost}:${grpcPort}`);
  cfg.log(`backing-image-manager: internal calls ${authMode(cfg.internalAuth)}`);
  cfg.log(`backing-image-manager: disk ${cfg.diskPath} (${diskUUID}), gRPC ${grpcAddr.host}:${grpcPort}, sync ${syncAddr.host}:${syncPort}`);
  let stopping: Promise<void> | undefined;
  return {
    grpcPort,
    syncPort,
    stop: () =>
      (stopping ??= (async () => {
        await sync.close();
        await manager.close();
        await new Promise<void>((resolve) => {
          const t = setTimeout(() => {
            grpc.forceShutdown();
            resolve();
          }, 2000);
          grpc.tryShutdown(() => {
            clearTimeout(t);
            resolve();
          });
        });
        await http.close();
      })()),
  };
}

/** How a daemon checks internal callers, for its start-up log line. */
export function authMode(auth: InternalAuth | undefined): string {
  if (!auth?.token) return 'are NOT authenticated (no --internal-token-file)';
  return auth.allowUnauthenticated
    ? 'need the token when they send one; calls without a token are admitted (--allow-unauthenticated-internal-calls)'
    : 'need the token (--internal-token-file)';
}
