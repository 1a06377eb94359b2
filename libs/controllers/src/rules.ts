/**
 * The pure decision rules of the backing-image controllers, separate from I/O so they can be tested directly.
 * Each follows Longhorn's algorithm (control plane §2.5, §3.1, §3.3, §3.5); deviations are marked FIX.
 */
import type { BackingImageDiskFileSpec, BackingImageDiskFileStatus, BackingImageFileInfo } from '@bis/crd-types';
import type { DiskInfo, NodeInfo, Topology } from './topology.js';

type SpecMap = Record<string, BackingImageDiskFileSpec>;
type StatusMap = Record<string, BackingImageDiskFileStatus>;

// ---------------------------------------------------------------- disk selection

export interface SelectorPolicy {
  nodeSelector: readonly string[];
  diskSelector: readonly string[];
  allowEmptyNodeSelector: boolean;
  allowEmptyDiskSelector: boolean;
}

/** Tags ⊇ selector; with an empty selector, a tagged node/disk is accepted only when `allowEmpty`. */
export function tagsMatch(tags: readonly string[], selector: readonly string[], allowEmpty: boolean): boolean {
  if (selector.length === 0) return tags.length === 0 || allowEmpty;
  return selector.every((s) => tags.includes(s));
}

/** Whether a copy of the image may be placed on this disk (Longhorn's CanPutBackingImageOnDisk + disk rules). */
export function diskEligible(node: NodeInfo, disk: DiskInfo, policy: SelectorPolicy, dataEngine: 'v1' | 'v2' = 'v1'): boolean {
  return (
    tagsMatch(node.tags, policy.nodeSelector, policy.allowEmptyNodeSelector) &&
    node.allowScheduling &&
    node.schedulable &&
    tagsMatch(disk.tags, policy.diskSelector, policy.allowEmptyDiskSelector) &&
    disk.diskType === (dataEngine === 'v1' ? 'filesystem' : 'block') &&
    disk.allowScheduling &&
    disk.schedulable &&
    // FIX: Longhorn keeps placing copies on a disk that just failed with ENOSPC, EIO or a permission error.
    disk.healthy !== false
  );
}

/**
 * Longhorn's GetReadyNodeDiskForBackingImage: nodes in random order, the first eligible disk that is not already in
 * the spec map. `shuffle` is injectable for deterministic tests. FIX: Longhorn checks only the `Schedulable`
 * conditions, so a replacement copy could be placed on a node that is down (its `Ready` condition `False`, e.g. cut
 * off from the network), where it can never be synced while the node stays down; here the node and the disk must
 * also be `Ready`.
 */
export function pickDiskForCopy(
  topo: Topology,
  specMap: SpecMap,
  policy: SelectorPolicy,
  shuffle: <T>(a: T[]) => T[] = shuffleInPlace,
  preferred?: ReadonlySet<string>,
): { node: NodeInfo; disk: DiskInfo } | undefined {
  let other: { node: NodeInfo; disk: DiskInfo } | undefined;
  for (const c of freeEligibleDisks(shuffle([...topo.nodes]), specMap, policy)) {
    // EXTENSION: a disk in `preferred` (one whose manager already runs) wins over the random order.
    if (!preferred || preferred.has(c.disk.diskUUID)) return c;
    other ??= c;
  }
  return other;
}

/** The ready disks of ready nodes, in the nodes' order, that are not in the spec map and may take a copy. */
function* freeEligibleDisks(nodes: readonly NodeInfo[], specMap: SpecMap, policy: SelectorPolicy): Generator<{ node: NodeInfo; disk: DiskInfo }> {
  for (const node of nodes) {
    if (!node.ready) continue;
    for (const disk of node.disks) if (!specMap[disk.diskUUID] && disk.ready && diskEligible(node, disk, policy)) yield { node, disk };
  }
}

/**
 * EXTENSION: the disks whose managers are started while an image's first file is prepared, so that its next copies
 * are synced as soon as it is ready instead of after a manager start (seconds: a process, or a pod). `missing` disks
 * are wanted (minNumberOfCopies minus the disks in the spec map); disks in `withManager` count first (nothing to
 * start there), then eligible disks in a stable order (node name, then disk UUID), one per node before a second on
 * the same node. Returns the disks whose manager must be created.
 */
export function disksToPrestart(
  topo: Topology,
  specMap: SpecMap,
  policy: SelectorPolicy,
  missing: number,
  withManager: ReadonlySet<string>,
): string[] {
  if (missing <= 0) return [];
  const candidates = [...freeEligibleDisks(topo.nodes, specMap, policy)].map((c) => ({ node: c.node.name, disk: c.disk.diskUUID }));
  let covered = candidates.filter((c) => withManager.has(c.disk)).length;
  if (covered >= missing) return [];
  candidates.sort((a, b) => (a.node === b.node ? (a.disk < b.disk ? -1 : 1) : a.node < b.node ? -1 : 1));
  const usedNodes = new Set([...Object.keys(specMap).map((d) => topo.find(d)?.node.name ?? ''), ...candidates.filter((c) => withManager.has(c.disk)).map((c) => c.node)]);
  const out: string[] = [];
  for (const pass of [0, 1]) {
    for (const c of candidates) {
      if (covered >= missing) return out;
      if (withManager.has(c.disk) || out.includes(c.disk) || (pass === 0 && usedNodes.has(c.node))) continue;
      out.push(c.disk);
      usedNodes.add(c.node);
      covered++;
    }
  }
  return out;
}

/** Disks of the topology that may hold a copy (selectors, scheduling, disk type). */
export function eligibleDiskCount(topo: Topology, policy: SelectorPolicy): number {
  let n = 0;
  for (const node of topo.nodes) for (const disk of node.disks) if (diskEligible(node, disk, policy)) n++;
  return n;
}

/** The condition type set to `False` when `minNumberOfCopies` exceeds the disks that the selectors allow. */
export const MIN_COPIES_CONDITION = 'MinCopiesSatisfiable';

/**
 * The message of an unsatisfiable `minNumberOfCopies`, or undefined. Clients read the disk count from it
 * (`exceeds the N disk`), so the wording is part of the API (docs/rest-api.md).
 */
export function minCopiesShortfall(min: number, allowed: number): string | undefined {
  if (min <= allowed) return undefined;
  return `minNumberOfCopies ${min} exceeds the ${allowed} disk${allowed === 1 ? '' : 's'} that the selectors allow`;
}

export function shuffleInPlace<T>(a: T[]): T[] {
  for (let i = a.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [a[i], a[j]] = [a[j]!, a[i]!];
  }
  return a;
}

// ---------------------------------------------------------------- HA cleanup (REST action)

export type CleanupVerdict = { ok: true } | { ok: false; message: string };

/** The three groups Longhorn counts copies in. */
export function classify(state: string | undefined): 'ready' | 'failed' | 'handling' {
  if (state === 'ready' || state === 'ready-for-transfer') return 'ready';
  if (state === 'failed') return 'failed';
  return 'handling';
}

export const CLEANUP_NOT_ENOUGH_READY = 'failed to do cleanup since there will be no enough ready files for HA after the deletion';
export const CLEANUP_NOT_ENOUGH_HANDLING = 'failed to do cleanup since there will be no enough ready/in-progress/pending files for HA after the deletion';
export const CLEANUP_NOT_ENOUGH_FILES = 'cannot do cleanup since there are no enough files for HA';

export interface CleanupCounts {
  readyActive: number;
  handlingActive: number;
  failedActive: number;
  readyCleanup: number;
  handlingCleanup: number;
  failedCleanup: number;
}

/** Copies of the spec map by class, split into the ones that stay (active) and the ones being removed (cleanup). */
export function countCopies(specDisks: readonly string[], stateOf: (disk: string) => string | undefined, cleanup: ReadonlySet<string>): CleanupCounts {
  const c: CleanupCounts = { readyActive: 0, handlingActive: 0, failedActive: 0, readyCleanup: 0, handlingCleanup: 0, failedCleanup: 0 };
  for (const disk of specDisks) {
    const key = `${classify(stateOf(disk))}${cleanup.has(disk) ? 'Cleanup' : 'Active'}` as keyof CleanupCounts;
    c[key]++;
  }
  return c;
}

/**
 * The HA rule of the `backingImageCleanup` action (§2.5 step 5) with Longhorn's messages, and with Longhorn's counting
 * fault fixed: Longhorn compares `minNumberOfCopies` against `readyActive + handlingCleanup (+ failedCleanup)`, i.e. it
 * counts the copies being REMOVED as if they stayed, so removing the only pending copy of an image that needs two
 * copies was allowed. Here the copies that stay are counted: a cleanup is refused when fewer than `minCopies` copies
 * would remain in the best class the removed copies belong to.
 */
export function cleanupRefusal(c: CleanupCounts, minCopies: number): string | undefined {
  const m = minCopies;
  if (m <= c.readyActive) return undefined;
  if (c.readyCleanup > 0) return CLEANUP_NOT_ENOUGH_READY;
  if (m <= c.readyActive + c.handlingActive) return undefined;
  if (c.handlingCleanup > 0) return CLEANUP_NOT_ENOUGH_HANDLING;
  if (m <= c.readyActive + c.handlingActive + c.failedActive) return undefined;
  if (c.failedCleanup > 0) return CLEANUP_NOT_ENOUGH_FILES;
  return undefined;
}

/** `cleanupRefusal` over a BackingImage's spec and status maps. */
export function cleanupHaVerdict(originalSpec: SpecMap, statusMap: StatusMap, cleanup: ReadonlySet<string>, minCopies: number): CleanupVerdict {
  const why = cleanupRefusal(countCopies(Object.keys(originalSpec), (d) => statusMap[d]?.state, cleanup), minCopies);
  return why === undefined ? { ok: true } : { ok: false, message: why };
}

// ---------------------------------------------------------------- node-side cleanup of unused copies

/**
 * Longhorn's BackingImageDiskFileCleanup (§3.5): among `nodeDisks` (this node's disks), removes spec entries whose
 * last-reference time is older than `now - waitMs`, keeping at least `minCopies` — failed copies go first, then
 * handling ones, ready ones last. Returns the disks to remove.
 */
export function unusedCopiesToRemove(
  specMap: SpecMap,
  statusMap: StatusMap,
  lastRefAt: Record<string, string>,
  nodeDisks: readonly string[],
  minCopies: number,
  now: number,
  waitMs: number,
): string[] {
  const min = Math.max(1, minCopies);
  let ready = 0,
    failed = 0,
    handling = 0;
  for (const d of Object.keys(specMap)) {
    const g = classify(statusMap[d]?.state);
    if (g === 'ready') ready++;
    else if (g === 'failed') failed++;
    else handling++;
  }
  // Failed first, then handling, then ready: order the candidates so the preference does not depend on map order.
  const rank = (d: string) => ({ failed: 0, handling: 1, ready: 2 })[classify(statusMap[d]?.state)];
  const candidates = nodeDisks
    .filter((d) => specMap[d] && lastRefAt[d] && Date.parse(lastRefAt[d]!) < now - waitMs)
    .sort((a, b) => rank(a) - rank(b));
  const out: string[] = [];
  for (const d of candidates) {
    const g = classify(statusMap[d]?.state);
    if (g === 'failed') {
      if (min < ready + handling + failed) { out.push(d); failed--; }
    } else if (g === 'ready') {
      if (min < ready) { out.push(d); ready--; }
    } else if (min < ready + handling) { out.push(d); handling--; }
  }
  return out;
}

// ---------------------------------------------------------------- replenish and eviction

const UNHEALTHY = new Set(['failed', 'failed-and-cleanup', 'unknown']);

/** §3.1.4 steps 3–4: copies counted towards minNumberOfCopies (non-failed and not being evicted). */
export function healthyCopyCounts(specMap: SpecMap, statusMap: StatusMap): { nonFailed: number; nonEvicting: number } {
  let nonFailed = 0,
    evicting = 0;
  for (const [disk, spec] of Object.entries(specMap)) {
    const st = statusMap[disk];
    if (!st || !UNHEALTHY.has(st.state ?? '')) nonFailed++;
    if (spec.evictionRequested) evicting++;
  }
  return { nonFailed, nonEvicting: nonFailed - evicting };
}

/** Whether one more copy should be requested (the BackingImage controller places copies until this is false). */
export function needsReplenish(specMap: SpecMap, statusMap: StatusMap, minCopies: number, perNodeLimit: number): boolean {
  if (perNodeLimit === 0) return false;
  const { nonFailed, nonEvicting } = healthyCopyCounts(specMap, statusMap);
  if (nonFailed === 0) return false;
  return nonEvicting < minCopies;
}

export interface EvictionDecision {
  /** Spec entries to delete. */
  remove: string[];
  /** The evicting copy kept because it is the last healthy one (emit FailedDeleting). */
  keptLastHealthy?: string;
}

/**
 * §3.1.5: evicting entries are removed unless (a) no non-evicting ready copy exists and this is the kept evicting
 * ready copy, or (b) replicas on that disk use the image.
 */
export function evictionDecision(specMap: SpecMap, statusMap: StatusMap, disksInUse: ReadonlySet<string>): EvictionDecision {
  let hasHealthyNonEvicting = false;
  let keep: string | undefined;
  for (const [disk, spec] of Object.entries(specMap)) {
    const ready = statusMap[disk]?.state === 'ready';
    if (!ready) continue;
    if (spec.evictionRequested) keep = disk;
    else hasHealthyNonEvicting = true;
  }
  const out: EvictionDecision = { remove: [] };
  for (const [disk, spec] of Object.entries(specMap)) {
    if (!spec.evictionRequested) continue;
    if (!hasHealthyNonEvicting && disk === keep) {
      out.keptLastHealthy = disk;
      continue;
    }
    if (disksInUse.has(disk)) continue;
    out.remove.push(disk);
  }
  return out;
}

// ---------------------------------------------------------------- recovery

/**
 * §3.1.1 allFilesUnavailable: every spec disk (and every status entry) is `failed` for longer than `waitMs`.
 * FIX: Longhorn answers true for an empty spec map (and so re-downloads an image that lost every entry); here an
 * empty map answers false unless status entries exist and all of them qualify.
 */
export function allFilesUnavailable(specMap: SpecMap, statusMap: StatusMap, now: number, waitMs: number): boolean {
  const disks = new Set([...Object.keys(specMap), ...Object.keys(statusMap)]);
  if (disks.size === 0) return false;
  for (const d of disks) {
    const st = statusMap[d];
    if (!st || st.state !== 'failed' || !st.lastStateTransitionTime) return false;
    if (now - Date.parse(st.lastStateTransitionTime) <= waitMs) return false;
  }
  return true;
}

// ---------------------------------------------------------------- last-reference map

/** §3.1 step 11. Returns the new map. */
export function updatedLastRefMap(specMap: SpecMap, lastRef: Record<string, string>, disksInUse: ReadonlySet<string>, nowIso: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const disk of Object.keys(specMap)) {
    if (disksInUse.has(disk)) continue;
    out[disk] = lastRef[disk] ?? nowIso;
  }
  return out;
}

// ---------------------------------------------------------------- sender selection and per-node sync limit

export const SENDING_LIMIT = 3;

/** Sends of a copy still being received (the manager forwards its verified segments; see the sync service). */
export const FORWARDING_LIMIT = 1;

export interface SenderCandidate {
  name: string;
  running: boolean;
  defaultImage: boolean;
  file?: Pick<BackingImageFileInfo, 'state' | 'sendingReference'>;
  /**
   * Set for a copy being received from a peer (its status names the sender, or this controller just asked it to
   * Sync): the name of the manager it receives from ('' when unknown). Such a copy can forward what it has verified
   * while it receives.
   */
  receivesFrom?: string;
}

/**
 * §3.3 step 4.3: a running default manager holding a ready file with fewer than 3 outgoing transfers. Longhorn takes
 * the first one it finds in a Go map, whose iteration order is random, so receivers spread over the ready copies.
 * Here the least busy sender is taken, and among equally busy ones the receiver (`receiverKey`, e.g. its manager's
 * name) decides by a stable hash: receivers spread over the senders without randomness, and a receiver asks the same
 * sender again while nothing changed. (Taking the first candidate in list order, as this did before, sent every
 * receiver to one sender: the 4th and later were refused at its limit of 3.)
 * Beyond Longhorn: a copy still being received from a peer ({@link SenderCandidate.receivesFrom}) may be chosen when
 * no ready copy is idle; it forwards each segment once verified (pipelined, like Kraken's and Dragonfly's piece-level
 * distribution), to one receiver at a time ({@link FORWARDING_LIMIT}), never to a copy it receives from itself. The
 * alternatives named are the ready copies, so a receiver whose forwarder cannot send asks those.
 */
export function pickSender<T extends SenderCandidate>(candidates: readonly T[], receiverKey = ''): { sender?: T; alternatives?: T[]; anyReady: boolean } {
  const ready: { c: T; busy: number; rank: number }[] = [];
  const forwarders: { c: T; rank: number }[] = [];
  for (const c of candidates) {
    if (!c.running || !c.defaultImage) continue;
    const busy = c.file?.sendingReference ?? 0;
    const rank = stableHash(`${receiverKey}\u0000${c.name}`);
    if (c.file?.state === 'ready') ready.push({ c, busy, rank });
    else if (c.receivesFrom !== undefined && busy < FORWARDING_LIMIT && !receivesThrough(c, receiverKey, candidates)) {
      forwarders.push({ c, rank });
    }
  }
  // with no ready copy there is nothing to forward from (the first file is fetched instead)
  if (ready.length === 0) return { anyReady: false };
  ready.sort((a, b) => a.busy - b.busy || a.rank - b.rank);
  forwarders.sort((a, b) => a.rank - b.rank);
  const least = ready[0]!;
  // An idle ready copy first; else a copy being received that forwards nothing yet (a chain of copies each sends at
  // its link's full rate, where a ready copy's sends share it); else the least busy ready copy with room.
  const best = least.busy === 0 ? least : (forwarders[0] ?? (least.busy < SENDING_LIMIT ? least : undefined));
  if (!best) return { anyReady: true };
  // The other ready copies, least busy first (busy ones too: the counts are a status old), for a receiver whose sender
  // turns out to be at its limit by the time it asks (SyncRequest.alternative_from_addresses).
  const alternatives = ready.filter((r) => r !== best).slice(0, MAX_ALTERNATIVE_SENDERS).map((r) => r.c);
  return { sender: best.c, alternatives, anyReady: true };
}

/** Whether `c` receives, directly or through other copies being received, from `receiver` (a cycle if it sent to it). */
function receivesThrough(c: SenderCandidate, receiver: string, candidates: readonly SenderCandidate[]): boolean {
  let from = c.receivesFrom;
  for (let hops = 0; from && hops <= candidates.length; hops++) {
    if (from === receiver) return true;
    const up = candidates.find((x) => x.name === from);
    if (!up || up.file?.state === 'ready') return false;
    from = up.receivesFrom;
  }
  return from === receiver;
}

/** How many other senders a Sync names besides the chosen one. */
export const MAX_ALTERNATIVE_SENDERS = 4;

/** FNV-1a over the UTF-16 code units: a cheap hash that is the same in every process. */
function stableHash(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h;
}

/** The states of a copy being received (it names its sender in `senderManagerAddress`). */
export const IN_PROGRESS: ReadonlySet<string> = new Set(['in-progress', 'pending', 'starting']);

/** How long a granted sync is counted before its file shows up in a manager's status. */
export const SYNC_GRANT_GRACE_MS = 30_000;

/**
 * The per-node replenish limit (`canSyncCopy`). FIX: Longhorn builds the current key as `biName-diskUUID` but the
 * collected keys as `diskUUID-biName`, so its "already counted" shortcut rarely matches; here both use
 * `diskUUID/biName`. FIX: Longhorn prunes a granted key as soon as its file is not listed yet, so reconciles in
 * quick succession can exceed the limit; here a granted key counts until its file is reported and leaves the
 * in-progress states, or for {@link SYNC_GRANT_GRACE_MS} when it never shows up.
 */
export class NodeSyncLimiter {
  private readonly granted = new Map<string, Map<string, number>>();

  constructor(private readonly now: () => number = Date.now) {}

  /**
   * Brings the node's in-progress set up to date with the managers' file lists: grants whose file finished (or never
   * showed up within the grace period) are released, files reported in progress are counted. O(files); called once
   * per reconcile, before any number of {@link tryAcquire} calls.
   * @param files every (disk, bi, state) of the managers on the node
   */
  refresh(nodeID: string, files: readonly { diskUUID: string; biName: string; state: string }[]): void {
    const t = this.now();
    const listed = new Map(files.map((f) => [`${f.diskUUID}/${f.biName}`, f.state]));
    const set = this.granted.get(nodeID) ?? new Map<string, number>();
    for (const [k, at] of [...set]) {
      const state = listed.get(k);
      if (state === undefined ? t - at > SYNC_GRANT_GRACE_MS : !IN_PROGRESS.has(state)) set.delete(k);
    }
    for (const [k, state] of listed) if (IN_PROGRESS.has(state) && !set.has(k)) set.set(k, t);
    this.granted.set(nodeID, set);
  }

  /** Whether one more copy may sync on the node now (O(1)); records the grant. Call {@link refresh} first. */
  tryAcquire(nodeID: string, diskUUID: string, biName: string, limit: number): boolean {
    if (limit < 1) return true;
    const set = this.granted.get(nodeID) ?? new Map<string, number>();
    this.granted.set(nodeID, set);
    const key = `${diskUUID}/${biName}`;
    if (set.has(key)) return true;
    if (set.size >= limit) return false;
    set.set(key, this.now());
    return true;
  }

  /** Gives back a slot {@link tryAcquire} granted but no sync used (no sender was free). */
  release(nodeID: string, diskUUID: string, biName: string): void {
    this.granted.get(nodeID)?.delete(`${diskUUID}/${biName}`);
  }

  /** The `diskUUID/biName` keys counted against the node's limit now. */
  counted(nodeID: string): string[] {
    return [...(this.granted.get(nodeID)?.keys() ?? [])];
  }

  /** {@link refresh} then {@link tryAcquire}. */
  canSync(nodeID: string, diskUUID: string, biName: string, limit: number, files: readonly { diskUUID: string; biName: string; state: string }[]): boolean {
    if (limit < 1) return true;
    this.refresh(nodeID, files);
    return this.tryAcquire(nodeID, diskUUID, biName, limit);
  }

  dropDisk(diskUUID: string): void {
    for (const set of this.granted.values()) for (const k of [...set.keys()]) if (k.startsWith(`${diskUUID}/`)) set.delete(k);
  }
}

/**
 * The Syncs this controller asked for, per sender and image, counted until the receiving copy is received (or
 * fails), or for {@link SYNC_GRANT_GRACE_MS} while it is not listed. A sender's `sendingReference` is a status old:
 * the Syncs of one reconcile pass all saw the first copy idle, so seven receivers were sent to it at once, four were
 * refused at its limit of 3 and waited for it while other copies became ready. With the grants counted, a receiver
 * gets a Sync only when a sender has room, and the later ones choose among the copies ready by then.
 */
export class SenderGrants {
  /** `sender/biName` → receiving manager → when the Sync was asked for */
  private readonly grants = new Map<string, Map<string, number>>();

  /** `biName/receiver` → the sender of its latest grant and when. */
  private readonly byReceiver = new Map<string, { sender: string; at: number }>();
  /** `byReceiver`'s size at which its expired entries are swept next. */
  private sweepAt = 64;

  constructor(private readonly now: () => number = Date.now) {}

  grant(sender: string, biName: string, receiver: string): void {
    const key = `${sender}/${biName}`;
    let m = this.grants.get(key);
    if (!m) this.grants.set(key, (m = new Map()));
    const t = this.now();
    m.set(receiver, t);
    this.byReceiver.set(`${biName}/${receiver}`, { sender, at: t });
    if (this.byReceiver.size > this.sweepAt) {
      // expired grants go in amortized O(1) per grant
      for (const [k, g] of [...this.byReceiver]) if (t - g.at > SYNC_GRANT_GRACE_MS) this.byReceiver.delete(k);
      this.sweepAt = 2 * this.byReceiver.size + 64;
    }
  }

  /** The sender this controller last asked to send `biName` to `receiver`, within the grace period of a grant. */
  upstreamOf(biName: string, receiver: string): string | undefined {
    const key = `${biName}/${receiver}`;
    const g = this.byReceiver.get(key);
    if (!g) return undefined;
    if (this.now() - g.at > SYNC_GRANT_GRACE_MS) {
      this.byReceiver.delete(key);
      return undefined;
    }
    return g.sender;
  }

  /**
   * Sends from `sender` for `biName` still under way by this controller's account. `stateOf(receiver)` is the state
   * of the receiving manager's copy (`undefined` when it is not listed); finished grants are forgotten.
   */
  live(sender: string, biName: string, stateOf: (receiver: string) => string | undefined): number {
    const key = `${sender}/${biName}`;
    const m = this.grants.get(key);
    if (!m) return 0;
    const t = this.now();
    for (const [receiver, at] of [...m]) {
      const state = stateOf(receiver);
      if (state === undefined ? t - at > SYNC_GRANT_GRACE_MS : !IN_PROGRESS.has(state)) m.delete(receiver);
    }
    if (m.size === 0) this.grants.delete(key);
    return m.size;
  }

  /** Forgets the grants of a sender or receiver that is gone. */
  dropManager(name: string): void {
    for (const [key, g] of [...this.byReceiver]) if (g.sender === name || key.endsWith(`/${name}`)) this.byReceiver.delete(key);
    for (const [key, m] of [...this.grants]) {
      if (key.startsWith(`${name}/`)) this.grants.delete(key);
      else if (m.delete(name) && m.size === 0) this.grants.delete(key);
    }
  }
}

/**
 * How many copies of an image each sender (by manager address) has receivers for, from the managers' statuses: the
 * copies being received (`pending`, `starting`, `in-progress`) name their sender in `senderManagerAddress`. Unlike the
 * sender's own `sendingReference`, this counts a receiver from the moment its manager lists it, also one still
 * waiting for a slot, and the statuses are written by the controllers of every node.
 */
export function receiversBySender(files: Iterable<Pick<BackingImageFileInfo, 'state' | 'senderManagerAddress'> | undefined>): Map<string, number> {
  const counts = new Map<string, number>();
  for (const f of files) {
    const from = f?.senderManagerAddress;
    if (!from || !IN_PROGRESS.has(f.state ?? '')) continue;
    counts.set(from, (counts.get(from) ?? 0) + 1);
  }
  return counts;
}

/**
 * Whether the sender at `address` is sending to as many peers as it may, by the copies listed as being received
 * from it (`in-progress`: the sender took them; a copy still `pending` or `starting` may be waiting for it).
 */
export function senderIsFull(files: Iterable<Pick<BackingImageFileInfo, 'state' | 'senderManagerAddress'> | undefined>, address: string): boolean {
  let served = 0;
  for (const f of files) if (f?.state === 'in-progress' && f.senderManagerAddress === address) served++;
  return served >= SENDING_LIMIT;
}

