import type { KubeObject, ResourceKind, Stored } from '@bis/datastore';
import { cloneObject, isNotFound, sameValue } from '@bis/datastore';
import type { ControllerContext } from './base-controller.js';
import { BackingImageKind, BackingImageManagerKind, NodeKind, ReplicaKind, type BackingImage, type Node, type Replica } from './kinds.js';
import { Label } from './names.js';
import { SettingName } from './settings.js';
import { isNodeDown, Topology } from './topology.js';
import type { SelectorPolicy } from './rules.js';

export { cloneObject as clone, sameValue };

/**
 * The backing image an event is about, by name: the cached object (with its uid, so `kubectl describe` finds the
 * event) or a reference by name when it is not cached.
 */
export function imageRef(ctx: ControllerContext, name: string): { kind: string; apiVersion?: string; metadata: { name: string; namespace?: string; uid?: string } } {
  // by name from the informer's cache (a scan of every cached image per event was O(images))
  const bi = ctx.informers.cachedGet(BackingImageKind, name);
  return bi ?? { kind: 'BackingImage', metadata: { name, namespace: ctx.namespace } };
}

export const changed = (a: unknown, b: unknown): boolean => !sameValue(a, b);

export async function getOrUndefined<T>(p: Promise<T>): Promise<T | undefined> {
  try {
    return await p;
  } catch (err) {
    if (isNotFound(err)) return undefined;
    throw err;
  }
}

/**
 * Every Node: the informer cache once it has synced (read-only, like Longhorn's node lister; a reconcile reads them
 * several times, so a store list would copy every node each time), else the store.
 */
async function listNodes(ctx: ControllerContext): Promise<readonly Node[]> {
  if (ctx.informers.hasSynced(NodeKind)) return ctx.informers.cached(NodeKind);
  return (await ctx.store.list(NodeKind, { namespace: ctx.namespace })).items;
}

export async function topology(ctx: ControllerContext): Promise<Topology> {
  return new Topology(await listNodes(ctx));
}

export async function nodeDownChecker(ctx: ControllerContext): Promise<(node: string) => boolean> {
  const byName = new Map((await listNodes(ctx)).map((n) => [n.metadata.name, n]));
  return (name: string) => isNodeDown(byName.get(name));
}

/** Replicas using a backing image (optionally on one disk), by Longhorn's labels. */
export async function replicasOf(ctx: ControllerContext, biName: string, diskUUID?: string): Promise<Stored<Replica>[]> {
  const sel: Record<string, string> = { [Label.BackingImage]: biName };
  if (diskUUID) sel[Label.LegacyDiskUUID] = diskUUID;
  return (await ctx.store.list(ReplicaKind, { namespace: ctx.namespace, labelSelector: { matchLabels: sel } })).items;
}

/**
 * Every BIM. Reads the informer cache once it has synced (like Longhorn's listers: no copy of every manager's file
 * map on each call; writes based on it may conflict and are retried), else the store.
 */
export async function listManagers(ctx: ControllerContext) {
  if (ctx.informers.hasSynced(BackingImageManagerKind)) return ctx.informers.cached(BackingImageManagerKind);
  return (await ctx.store.list(BackingImageManagerKind, { namespace: ctx.namespace })).items;
}

/** The backing images from the informer cache once synced (read-only: replace, never edit), else from the store. */
export async function listImages(ctx: ControllerContext) {
  if (ctx.informers.hasSynced(BackingImageKind)) return ctx.informers.cached(BackingImageKind);
  return (await ctx.store.list(BackingImageKind, { namespace: ctx.namespace })).items;
}

export async function selectorPolicy(ctx: ControllerContext, bi: BackingImage): Promise<SelectorPolicy> {
  return {
    nodeSelector: bi.spec?.nodeSelector ?? [],
    diskSelector: bi.spec?.diskSelector ?? [],
    allowEmptyNodeSelector: await ctx.settings.bool(SettingName.AllowEmptyNodeSelectorVolume),
    allowEmptyDiskSelector: await ctx.settings.bool(SettingName.AllowEmptyDiskSelectorVolume),
  };
}

export const defaultManagerImage = (ctx: ControllerContext): Promise<string> => ctx.settings.get(SettingName.DefaultBackingImageManagerImage);

export const errMessage = (err: unknown): string => (err instanceof Error ? ((err as { details?: string }).details ?? err.message) : String(err));

/**
 * An object by name from the informer cache once synced (read-only, possibly a little stale), else from the store.
 * For loops over many objects (a manager's files) where a store read per object would copy each one.
 */
export async function cachedOrGet<T extends KubeObject>(ctx: ControllerContext, kind: ResourceKind<T>, name: string): Promise<Stored<T> | undefined> {
  if (ctx.informers.hasSynced(kind)) return ctx.informers.cachedGet(kind, name);
  return getOrUndefined(ctx.store.get(kind, name, ctx.namespace));
}

/** Whether two file maps differ in nothing but the files' progress. */
export function onlyProgressDiffers(a: Record<string, { progress?: number }>, b: Record<string, { progress?: number }>): boolean {
  const keys = Object.keys(b);
  if (Object.keys(a).length !== keys.length) return false;
  for (const k of keys) {
    const x = a[k];
    const y = b[k];
    if (x === y) continue;
    if (!x || !y || changed({ ...x, progress: 0 }, { ...y, progress: 0 })) return false;
  }
  return true;
}
