import { randomBytes, randomUUID } from 'node:crypto';
import { shareValue } from '../json-patch.js';
import { cloneObject, sameValue } from '../json-value.js';
import type { CreateOptions } from '../datastore.js';
import { AlreadyExistsError, InvalidError, StatusError } from '../errors.js';
import { compileSelector, isValidLabelKey, isValidLabelValue, LabelSelectorError, type CompiledSelector } from '../label-selector.js';
import { groupOf, type KubeObject, type ListOptions, type ResourceKind, type Stored } from '../types.js';

/**
 * Object rules of the embedded store: keys, validation, and how a create / update / status update turns the
 * caller's input and the current object into the next object. Pure functions: nothing here reads or writes state.
 */

export type AnyStored = Stored<KubeObject>;

/** What a write answers with: a copy of the stored object, or the committed object itself (not to be changed). */
export type WriteAnswer = 'copy' | 'shared';

const NAME_RE = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;

/** `<group>/<Kind>`: the kind part of an object key (and of a log record's `k`). */
export const kindKeyOf = (kind: ResourceKind): string => `${groupOf(kind.apiVersion)}/${kind.kind}`;
/** `<kindKey>|<namespace>|<name>`: the key of one object. */
export const objKey = (k: string, namespace: string | undefined, name: string): string => `${k}|${namespace ?? ''}|${name}`;
export const kindOfKey = (key: string): string => key.slice(0, key.indexOf('|'));
export const clone = <T>(v: T): T => cloneObject(v);
export const k8sTime = (d: Date): string => d.toISOString().replace(/\.\d{3}Z$/, 'Z');


/** Everything except metadata and (optionally) status. */
function bodyOf(o: KubeObject, withStatus: boolean): Record<string, unknown> {
  const { metadata: _m, status, ...rest } = o as KubeObject & Record<string, unknown>;
  return withStatus ? { ...rest, status } : rest;
}

/** Drops empty labels / annotations / finalizers / ownerReferences (like the API server). */
export function cleanMeta(o: KubeObject): void {
  const m = o.metadata as unknown as Record<string, unknown>;
  for (const f of ['labels', 'annotations', 'finalizers', 'ownerReferences']) {
    const v = m[f];
    if (v === undefined || v === null || (Array.isArray(v) && v.length === 0)) delete m[f];
  }
}

function randomSuffix(): string {
  const alphabet = 'bcdfghjklmnpqrstvwxz2456789';
  return [...randomBytes(5)].map((b) => alphabet[b % alphabet.length]).join('');
}

/** The compiled selector, or 400 BadRequest for a malformed one. */
export function selectorOrInvalid(kind: ResourceKind, sel: ListOptions['labelSelector']): CompiledSelector {
  try {
    return compileSelector(sel);
  } catch (err) {
    if (err instanceof LabelSelectorError) throw new StatusError('BadRequest', 400, err.message, { kind: kind.plural });
    throw err;
  }
}

/** The validation causes of an object of `kind` (empty when valid). */
export function validateCommon(kind: ResourceKind, obj: KubeObject): { field: string; message: string }[] {
  const causes: { field: string; message: string }[] = [];
  if (obj.apiVersion !== kind.apiVersion) causes.push({ field: 'apiVersion', message: `Invalid value: "${obj.apiVersion}": must be ${kind.apiVersion}` });
  if (obj.kind !== kind.kind) causes.push({ field: 'kind', message: `Invalid value: "${obj.kind}": must be ${kind.kind}` });
  const m = obj.metadata;
  if (!m || typeof m !== 'object') return [...causes, { field: 'metadata', message: 'Required value' }];
  if (!m.name) causes.push({ field: 'metadata.name', message: 'Required value: name or generateName is required' });
  else if (m.name.length > 253 || !NAME_RE.test(m.name)) {
    causes.push({
      field: 'metadata.name',
      message: `Invalid value: "${m.name}": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character`,
    });
  }
  if (kind.namespaced) {
    if (!m.namespace) causes.push({ field: 'metadata.namespace', message: 'Required value' });
    else if (m.namespace.length > 63 || !/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/.test(m.namespace)) {
      causes.push({ field: 'metadata.namespace', message: `Invalid value: "${m.namespace}": a lowercase RFC 1123 label` });
    }
  } else if (m.namespace) {
    causes.push({ field: 'metadata.namespace', message: `Forbidden: not allowed on this type` });
  }
  for (const [key, value] of Object.entries(m.labels ?? {})) {
    if (!isValidLabelKey(key)) causes.push({ field: 'metadata.labels', message: `Invalid value: "${key}": not a valid label key` });
    if (typeof value !== 'string' || !isValidLabelValue(value)) causes.push({ field: 'metadata.labels', message: `Invalid value: "${String(value)}": not a valid label value` });
  }
  for (const [key, value] of Object.entries(m.annotations ?? {})) {
    if (typeof value !== 'string') causes.push({ field: `metadata.annotations[${key}]`, message: 'Invalid value: must be a string' });
  }
  if (m.finalizers !== undefined && (!Array.isArray(m.finalizers) || m.finalizers.some((f) => typeof f !== 'string' || !f))) {
    causes.push({ field: 'metadata.finalizers', message: 'Invalid value: must be a list of non-empty strings' });
  }
  for (const [i, r] of (m.ownerReferences ?? []).entries()) {
    for (const f of ['apiVersion', 'kind', 'name', 'uid'] as const) {
      if (!r || typeof r[f] !== 'string' || !r[f]) causes.push({ field: `metadata.ownerReferences[${i}].${f}`, message: 'Required value' });
    }
  }
  return causes;
}

/** The key `input` names (undefined when it has no name). */
export function inputKeyOf(kind: ResourceKind, input: KubeObject | undefined): string | undefined {
  const m = input?.metadata;
  if (!m?.name) return undefined;
  return objKey(kindKeyOf(kind), kind.namespaced ? m.namespace : undefined, m.name);
}

/**
 * The object a create stores (not yet given a resourceVersion), validated; `exists` tells whether its key is taken
 * (then AlreadyExists). Defaults apiVersion/kind, resolves `generateName`, sets uid, generation 1 and the creation time.
 */
export function prepareCreate(
  kind: ResourceKind,
  input: KubeObject,
  opts: CreateOptions,
  now: Date,
  exists: (key: string) => boolean,
): { key: string; object: AnyStored } {
  const obj = clone(input);
  obj.apiVersion = obj.apiVersion || kind.apiVersion;
  obj.kind = obj.kind || kind.kind;
  obj.metadata = obj.metadata ?? ({ name: '' } as KubeObject['metadata']);
  const m = obj.metadata;
  if (!m.name && m.generateName) m.name = m.generateName + randomSuffix();
  const causes = validateCommon(kind, obj);
  if (causes.length) throw new InvalidError(kind, m.name ?? '', causes);
  if (!kind.namespaced) delete m.namespace;
  const key = objKey(kindKeyOf(kind), m.namespace, m.name);
  if (exists(key)) throw new AlreadyExistsError(kind, m.name);
  delete m.generateName;
  delete m.deletionTimestamp;
  delete m.resourceVersion;
  m.uid = randomUUID();
  m.generation = 1;
  m.creationTimestamp = k8sTime(now);
  if (kind.statusSubresource && !opts.keepStatus) delete obj.status;
  return { key, object: obj as AnyStored };
}

/**
 * The object an update of `cur` with `input` leads to, or undefined when nothing changes. Only the body (and the
 * status when the kind has no status subresource), labels, annotations, finalizers and ownerReferences are taken
 * from the input; a body change bumps the generation. No finalizer may be added once deletion has started.
 */
export function prepareUpdate(kind: ResourceKind, cur: AnyStored, input: KubeObject): AnyStored | undefined {
  // With a status subresource the input's status is ignored: it is not copied. What the input has unchanged is the
  // current version's (shared, see prepareStatusUpdate); the rest is copied.
  const { status: _ignored, ...inputRest } = input as KubeObject & { status?: unknown };
  const obj = shareValue(kind.statusSubresource ? (inputRest as KubeObject) : input, cur);
  const causes = validateCommon(kind, obj);
  if (causes.length) throw new InvalidError(kind, cur.metadata.name, causes);
  const next: AnyStored = {
    ...(bodyOf(obj, !kind.statusSubresource) as object),
    apiVersion: cur.apiVersion,
    kind: cur.kind,
    metadata: {
      ...cur.metadata,
      labels: obj.metadata.labels,
      annotations: obj.metadata.annotations,
      finalizers: obj.metadata.finalizers,
      ownerReferences: obj.metadata.ownerReferences,
    },
  } as AnyStored;
  // The committed objects are never changed (a write replaces them), so the next version shares the current status.
  if (kind.statusSubresource && cur.status !== undefined) next.status = cur.status;
  cleanMeta(next);
  if (cur.metadata.deletionTimestamp) {
    const added = (next.metadata.finalizers ?? []).filter((f) => !(cur.metadata.finalizers ?? []).includes(f));
    if (added.length) {
      throw new InvalidError(kind, cur.metadata.name, [
        { field: 'metadata.finalizers', message: `Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers ${JSON.stringify(added)}` },
      ]);
    }
  }
  const bodyChanged = !sameValue(bodyOf(cur, !kind.statusSubresource), bodyOf(next, !kind.statusSubresource));
  if (bodyChanged) next.metadata.generation = cur.metadata.generation + 1;
  if (!bodyChanged && sameValue(next.metadata, cur.metadata)) return undefined;
  return next;
}

/** The object a status update of `cur` leads to, or undefined when the status is the same. */
export function prepareStatusUpdate(cur: AnyStored, input: KubeObject): AnyStored | undefined {
  // The committed objects are never changed (a write replaces them), so the next version shares everything but its
  // metadata (which gets the new resourceVersion) with the current one, and of its status every part that did not
  // change (the rest is copied from the input).
  const status = shareValue(input.status, cur.status);
  if (status === cur.status) return undefined;
  const { status: _current, ...rest } = cur as AnyStored & { status?: unknown };
  const next = { ...rest, metadata: { ...cur.metadata } } as AnyStored;
  if (status !== undefined) next.status = status;
  return next;
}
