/** Kubernetes object model shared by every datastore implementation. */

export interface OwnerReference {
  apiVersion: string;
  kind: string;
  name: string;
  uid: string;
  controller?: boolean;
  blockOwnerDeletion?: boolean;
}

export interface ObjectMeta {
  name: string;
  /** Only for creation: the store appends 5 random characters when `name` is empty. */
  generateName?: string;
  namespace?: string;
  uid?: string;
  resourceVersion?: string;
  generation?: number;
  creationTimestamp?: string;
  deletionTimestamp?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  finalizers?: string[];
  ownerReferences?: OwnerReference[];
}

/** Any object with Kubernetes metadata. `spec` and `status` are optional (a Longhorn Setting has a top-level `value`). */
export interface KubeObject {
  apiVersion: string;
  kind: string;
  metadata: ObjectMeta;
  spec?: unknown;
  status?: unknown;
}

/** An object as stored: the store fills in these metadata fields. */
export type Stored<T extends KubeObject> = T & {
  metadata: ObjectMeta & { uid: string; resourceVersion: string; generation: number; creationTimestamp: string };
};

/**
 * Describes one resource kind. `T` is a phantom type so that calls are typed by the descriptor.
 * `plural` and `group` form the Kubernetes resource name used in error messages (`backingimages.longhorn.io`).
 */
export interface ResourceKind<T extends KubeObject = KubeObject> {
  readonly apiVersion: string;
  readonly kind: string;
  readonly plural: string;
  readonly namespaced: boolean;
  /** When true (default), `update` ignores `status` and `updateStatus` changes only `status`. */
  readonly statusSubresource: boolean;
  /** Phantom marker, never set. */
  readonly __type?: T;
}

export function defineKind<T extends KubeObject>(k: {
  apiVersion: string;
  kind: string;
  plural: string;
  namespaced: boolean;
  statusSubresource?: boolean;
}): ResourceKind<T> {
  return { statusSubresource: true, ...k };
}

/** `group` of an apiVersion (`longhorn.io/v1beta2` -> `longhorn.io`, `v1` -> ``). */
export function groupOf(apiVersion: string): string {
  const i = apiVersion.indexOf('/');
  return i < 0 ? '' : apiVersion.slice(0, i);
}

/** Kubernetes "qualified resource" name, e.g. `backingimages.longhorn.io`. */
export function qualifiedResource(kind: ResourceKind): string {
  const g = groupOf(kind.apiVersion);
  return g ? `${kind.plural}.${g}` : kind.plural;
}

export type WatchEventType = 'ADDED' | 'MODIFIED' | 'DELETED' | 'BOOKMARK';

export interface WatchEvent<T extends KubeObject = KubeObject> {
  type: WatchEventType;
  /** For BOOKMARK only apiVersion, kind and metadata.resourceVersion are meaningful. */
  object: Stored<T>;
}

export interface LabelSelectorRequirement {
  key: string;
  operator: 'In' | 'NotIn' | 'Exists' | 'DoesNotExist';
  values?: string[];
}

export interface LabelSelectorObject {
  matchLabels?: Record<string, string>;
  matchExpressions?: LabelSelectorRequirement[];
}

/** Either the string syntax (`a=b,c!=d,e in (x,y),!f`) or the structured form. */
export type LabelSelector = string | LabelSelectorObject;

export interface ListOptions {
  /** Omit for all namespaces (or for cluster-scoped kinds). */
  namespace?: string;
  labelSelector?: LabelSelector;
}

export interface ListResult<T extends KubeObject> {
  items: Stored<T>[];
  /** The store's resourceVersion at the time of the list; start a watch from it to miss nothing. */
  resourceVersion: string;
}

export interface WatchOptions extends ListOptions {
  /**
   * Deliver events after this resourceVersion. Omitted or "0": the watch first sends a synthetic ADDED
   * for every matching object, then live events. A version older than the kept history fails with GoneError.
   */
  resourceVersion?: string;
  /** Send BOOKMARK events carrying the current resourceVersion at this interval (ms). */
  bookmarkIntervalMs?: number;
  /** Ends the watch (the iterator returns). */
  signal?: AbortSignal;
  /**
   * The watcher only reads the objects it gets (an informer's cache): a store that can (the embedded one) then hands
   * out its committed objects themselves instead of a copy per event and watcher (see {@link SharedReads}).
   */
  shared?: boolean;
}

export type PropagationPolicy = 'Foreground' | 'Background' | 'Orphan';

export interface DeleteOptions {
  /** Default Background: dependents are deleted after the owner is gone. */
  propagationPolicy?: PropagationPolicy;
  /** Fail with Conflict unless the object still has this uid / resourceVersion. */
  preconditions?: { uid?: string; resourceVersion?: string };
}

/** Finalizers the store itself manages for propagation (same names as Kubernetes). */
export const FOREGROUND_FINALIZER = 'foregroundDeletion';
export const ORPHAN_FINALIZER = 'orphan';
