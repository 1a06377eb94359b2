import { isManagerApiCompatible, type BackingImageResponse, type ListResponse, type ManagerClient } from '@bis/bimrpc';
import type { BackingImageFileInfo } from '@bis/crd-types';
import { FILE_MACHINE, transition } from '@bis/state-machine';
import type { ManagerApi } from './data-plane.js';

/** Adapts a `@bis/bimrpc` ManagerClient to the controllers' ManagerApi (the watch stream becomes callbacks). */
export function managerApiFromClient(client: ManagerClient): ManagerApi {
  return {
    list: () => client.list(),
    delete: (n, u) => client.delete(n, u),
    versionGet: () => client.versionGet(),
    fetch: (r) => client.fetch(r),
    sync: (r) => client.sync(r),
    prepareDownload: (n, u) => client.prepareDownload(n, u),
    backupCreate: (r) => client.backupCreate(r),
    backupStatus: (n) => client.backupStatus(n),
    watch(onChange, onEnd) {
      const stream = client.watch();
      let ended = false;
      const end = (err?: Error) => {
        if (ended) return;
        ended = true;
        onEnd(err);
      };
      stream.on('data', () => onChange());
      stream.on('error', (err: Error) => end(err));
      stream.on('end', () => end());
      return () => {
        ended = true;
        stream.cancel();
      };
    },
  };
}

export { isManagerApiCompatible };

/** A manager's List() as Longhorn's `backingImageFileMap`. */
export function fileMapFromList(list: ListResponse): Record<string, BackingImageFileInfo> {
  const out: Record<string, BackingImageFileInfo> = {};
  for (const [name, r] of Object.entries(list.backingImages)) out[name] = fileInfo(r);
  return out;
}

export function fileInfo(r: BackingImageResponse): BackingImageFileInfo {
  return {
    name: r.spec?.name ?? '',
    uuid: r.spec?.uuid ?? '',
    size: Number(r.spec?.size ?? 0),
    virtualSize: Number(r.spec?.virtualSize ?? 0),
    realSize: Number(r.spec?.realSize ?? 0),
    // The manager owns its files' states: the file map mirrors what it reports.
    state: transition(FILE_MACHINE, '', { reported: r.status?.state ?? '' }, `file ${r.spec?.name ?? ''}`),
    currentChecksum: r.status?.checksum ?? '',
    message: r.status?.errorMsg ?? '',
    sendingReference: r.status?.sendingReference ?? 0,
    senderManagerAddress: r.status?.senderManagerAddress ?? '',
    progress: r.status?.progress ?? 0,
  };
}
