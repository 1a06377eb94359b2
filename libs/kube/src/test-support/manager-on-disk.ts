import { Server, ServerCredentials } from '@grpc/grpc-js';
import { BackingImageManagerServiceService, withInternalAuth } from '@bis/bimrpc';
import type { InternalAuth } from '@bis/internal-auth';
import { ManagerService, checkDiskConfig } from '@bis/manager';
import { PortAllocator, SyncService, startSyncServer } from '@bis/sync-service';

export interface ManagerOnDisk {
  grpcPort: number;
  syncPort: number;
  stop(): Promise<void>;
}

/**
 * A real backing-image manager (the `@bis/manager` gRPC service and the `@bis/sync-service` HTTP server) on a disk
 * directory, listening on 127.0.0.1 with ports of its own: what a manager pod runs, for tests that play the kubelet.
 */
export async function startManagerOnDisk(diskPath: string, auth?: InternalAuth): Promise<ManagerOnDisk> {
  const diskUUID = await checkDiskConfig(diskPath, undefined);
  const sync = new SyncService({ diskPath, receiverHost: '127.0.0.1', monitorIntervalMs: 0, internalAuth: auth });
  const http = await startSyncServer(sync, { host: '127.0.0.1', port: 0 }, { auth });
  const syncPort = (http.server.address() as { port: number }).port;
  const manager = new ManagerService({ diskPath, diskUUID, sync, ports: new PortAllocator({ min: 41000, max: 41049 }), syncAddress: `127.0.0.1:${syncPort}`, receiverHost: '127.0.0.1', watchIntervalMs: 100, internalToken: auth?.token });
  const grpc = new Server();
  // With `auth`: what a pod started with --internal-token-file runs (callers without the token are refused).
  grpc.addService(BackingImageManagerServiceService, withInternalAuth(manager.implementation(), auth));
  const grpcPort = await new Promise<number>((resolve, reject) => grpc.bindAsync('127.0.0.1:0', ServerCredentials.createInsecure(), (err, port) => (err ? reject(err) : resolve(port))));
  return {
    grpcPort,
    syncPort,
    async stop() {
      await sync.close();
      await manager.close();
      grpc.forceShutdown();
      await http.close();
    },
  };
}
