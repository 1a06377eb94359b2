import { type ResourceKind, qualifiedResource } from './types.js';

export type StatusReason = 'NotFound' | 'AlreadyExists' | 'Conflict' | 'Gone' | 'Invalid' | 'BadRequest' | 'InternalError';

/** A Kubernetes `Status` body (kind Status, status Failure). */
export interface KubeStatus {
  apiVersion: 'v1';
  kind: 'Status';
  status: 'Failure';
  message: string;
  reason: StatusReason;
  code: number;
  details?: { name?: string; group?: string; kind?: string; causes?: { field: string; message: string }[] };
}

/** An API error with a Kubernetes reason, HTTP code and message. */
export class StatusError extends Error {
  readonly reason: StatusReason;
  readonly code: number;
  readonly details: KubeStatus['details'];
  constructor(reason: StatusReason, code: number, message: string, details?: KubeStatus['details']) {
    super(message);
    this.name = `${reason}Error`;
    this.reason = reason;
    this.code = code;
    this.details = details;
  }
  toStatus(): KubeStatus {
    return { apiVersion: 'v1', kind: 'Status', status: 'Failure', message: this.message, reason: this.reason, code: this.code, ...(this.details ? { details: this.details } : {}) };
  }
}

export class NotFoundError extends StatusError {
  constructor(kind: ResourceKind, name: string) {
    super('NotFound', 404, `${qualifiedResource(kind)} "${name}" not found`, { name, kind: kind.plural });
  }
}

export class AlreadyExistsError extends StatusError {
  constructor(kind: ResourceKind, name: string) {
    super('AlreadyExists', 409, `${qualifiedResource(kind)} "${name}" already exists`, { name, kind: kind.plural });
  }
}

export class ConflictError extends StatusError {
  constructor(kind: ResourceKind, name: string, why = 'the object has been modified; please apply your changes to the latest version and try again') {
    super('Conflict', 409, `Operation cannot be fulfilled on ${qualifiedResource(kind)} "${name}": ${why}`, { name, kind: kind.plural });
  }
}

export class GoneError extends StatusError {
  constructor(requested: string, oldest: string) {
    super('Gone', 410, `too old resource version: ${requested} (${oldest})`);
  }
}

export class InvalidError extends StatusError {
  readonly causes: { field: string; message: string }[];
  constructor(kind: ResourceKind, name: string, causes: { field: string; message: string }[]) {
    const group = kind.apiVersion.includes('/') ? kind.apiVersion.split('/')[0] : '';
    const what = group ? `${kind.kind}.${group}` : kind.kind;
    super('Invalid', 422, `${what} "${name}" is invalid: ${causes.map((c) => `${c.field}: ${c.message}`).join(', ')}`, {
      name,
      kind: kind.kind,
      group,
      causes,
    });
    this.causes = causes;
  }
}

function reasonOf(err: unknown): StatusReason | undefined {
  return err instanceof StatusError ? err.reason : undefined;
}
/** True when `err` (or any error in its `cause` chain) has the given reason. */
export function hasReason(err: unknown, reason: StatusReason): boolean {
  for (let e: unknown = err, depth = 0; e && depth < 20; e = (e as { cause?: unknown }).cause, depth++) {
    if (reasonOf(e) === reason) return true;
  }
  return false;
}
export const isNotFound = (err: unknown): boolean => hasReason(err, 'NotFound');
export const isAlreadyExists = (err: unknown): boolean => hasReason(err, 'AlreadyExists');
export const isConflict = (err: unknown): boolean => hasReason(err, 'Conflict');
export const isGone = (err: unknown): boolean => hasReason(err, 'Gone');
export const isInvalid = (err: unknown): boolean => hasReason(err, 'Invalid');
