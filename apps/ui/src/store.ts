import { BisClient, isUnauthorized, type BackingImage, type BackupBackingImage, type BackupTarget, type DiskScrub, type Node } from '@bis/api-client';

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
  /** The API answered 401: the page asks for the REST token (`error`: why the last one was refused). */
  auth: { required: boolean; error: string };
}

/** Where the REST token is kept: for this browser tab's session only (it ends with the tab). */
export const TOKEN_STORAGE_KEY = 'bis.api-token';

function storedToken(): string | undefined {
  try {
    return sessionStorage.getItem(TOKEN_STORAGE_KEY) ?? undefined;
  } catch {
    return undefined; // storage disabled: the token is asked again after a reload
  }
}

/**
 * Every API call goes through this fetch: a 401 (no token, or a wrong one) shows the token form. The client adds
 * `authorization: Bearer <token>` itself, and `access_token` on the websocket streams.
 */
const fetchWatching401: typeof fetch = async (input, init) => {
  const res = await fetch(input, init);
  if (res.status === 401) unauthorized(new Headers(init?.headers).get('authorization') ?? undefined);
  return res;
};

export const client = new BisClient({ server: '', fetch: fetchWatching401, token: storedToken() });

export const state: AppState = {
  images: [],
  backups: [],
  targets: [],
  nodes: [],
  live: false,
  loaded: { images: false, backups: false },
  banner: '',
  auth: { required: false, error: '' },
};

/**
 * The API refused a request that carried `sent` (or no token): forget the token and ask for one. A refusal of a
 * request sent before the current token was set (e.g. a poll during sign-in) changes nothing.
 */
function unauthorized(sent: string | undefined): void {
  const current = client.requestHeaders()['authorization'];
  if (current !== undefined && sent !== current) return;
  const hadToken = client.hasToken;
  if (hadToken) {
    client.setToken(undefined);
    try {
      sessionStorage.removeItem(TOKEN_STORAGE_KEY);
    } catch {
      // storage disabled
    }
  }
  state.auth = { required: true, error: hadToken ? 'The token was refused. Check it and try again.' : state.auth.error };
  changed();
}

/**
 * Tries `token` with one API call; when the API accepts it, keeps it for the session and restarts the live updates
 * with it. A refused token shows the form again with an error.
 */
export async function signIn(token: string): Promise<void> {
  token = token.trim();
  if (!token) {
    state.auth = { required: true, error: 'Enter the API token.' };
    changed();
    return;
  }
  client.setToken(token);
  try {
    await client.listNodes();
  } catch (err) {
    if (!isUnauthorized(err)) {
      client.setToken(undefined);
      state.auth = { required: true, error: `The API could not be reached: ${(err as Error).message}` };
      changed();
    }
    return; // a 401 went through unauthorized()
  }
  try {
    sessionStorage.setItem(TOKEN_STORAGE_KEY, token);
  } catch {
    // storage disabled: the token lasts until a reload
  }
  state.auth = { required: false, error: '' };
  restartLiveUpdates();
  changed();
}

let live: AbortController | undefined;
/** (Re)starts the websocket streams and the slow poll with the client's current token. */
export function restartLiveUpdates(): void {
  live?.abort();
  live = new AbortController();
  startLiveUpdates(live.signal);
}

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

/** Disk UUID → its last background scrub, as the node list reports it (null before its manager reported one). */
export function diskScrub(uuid: string): DiskScrub | undefined {
  for (const n of state.nodes) for (const d of Object.values(n.disks ?? {})) if (d.diskUUID === uuid) return d.scrub ?? undefined;
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
  // refreshSlow() cannot reject (Promise.allSettled).
  void refreshSlow();
  // refreshSlow() cannot reject (Promise.allSettled).
  const t = setInterval(() => void refreshSlow(), 5000);
  signal.addEventListener('abort', () => clearInterval(t), { once: true });
}

export function imageNamed(name: string): BackingImage | undefined {
  return state.images.find((i) => i.name === name);
}
