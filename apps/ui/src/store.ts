import { BisClient, type BackingImage, type BackupBackingImage, type BackupTarget, type Node } from '@bis/api-client';

/** Everything the pages show, kept current by the websocket streams (and a slow poll for targets and nodes). */
export interface AppState {
  images: BackingImage[];
  backups: BackupBackingImage[];
  targets: BackupTarget[];
  nodes: Node[];
  /** The websocket streams are connected. */
  live: boolean;
  /** Lists received at least once. */
  loaded: { images: boolean; backups: boolean };
  /** A message for the banner (connection problems). */
  banner: string;
}

export const client = new BisClient({ server: '' });

export const state: AppState = {
  images: [],
  backups: [],
  targets: [],
  nodes: [],
  live: false,
  loaded: { images: false, backups: false },
  banner: '',
};

const listeners = new Set<() => void>();
export function onChange(fn: () => void): void {
  listeners.add(fn);
}
let queued = false;
/** Schedules one re-render for any number of changes in the same tick. */
export function changed(): void {
  if (queued) return;
  queued = true;
  queueMicrotask(() => {
    queued = false;
    for (const fn of listeners) fn();
  });
}

/** Disk UUID → where it is, for the per-disk table. */
export function diskLocation(uuid: string): { node: string; disk: string; path: string } | undefined {
  for (const n of state.nodes) for (const [disk, d] of Object.entries(n.disks ?? {})) if (d.diskUUID === uuid) return { node: n.name, disk, path: d.path };
  return undefined;
}

async function refreshSlow(): Promise<void> {
  const [targets, nodes] = await Promise.allSettled([client.listBackupTargets(), client.listNodes()]);
  if (targets.status === 'fulfilled') state.targets = targets.value;
  if (nodes.status === 'fulfilled') state.nodes = nodes.value;
  changed();
}

export function startLiveUpdates(signal: AbortSignal): void {
  const connected = { images: false, backups: false };
  const setLive = (): void => {
    state.live = connected.images && connected.backups;
    state.banner = state.live ? '' : state.loaded.images ? 'Live updates disconnected; reconnecting…' : '';
    changed();
  };
  client.watch<BackingImage>(
    'backingimages',
    (items) => {
      state.images = items;
      state.loaded.images = true;
      changed();
    },
    { signal, period: '500ms', onConnection: (c) => ((connected.images = c), setLive()) },
  );
  client.watch<BackupBackingImage>(
    'backupbackingimages',
    (items) => {
      state.backups = items;
      state.loaded.backups = true;
      changed();
    },
    { signal, period: '500ms', onConnection: (c) => ((connected.backups = c), setLive()) },
  );
  void refreshSlow();
  const t = setInterval(() => void refreshSlow(), 5000);
  signal.addEventListener('abort', () => clearInterval(t), { once: true });
}

export function imageNamed(name: string): BackingImage | undefined {
  return state.images.find((i) => i.name === name);
}
