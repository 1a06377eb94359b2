import type { ValidationIssue } from '@bis/crd-types';
import { ApiError } from '@bis/rest-api';

/** Longhorn's webhook names: rejections surface in the REST error message with these prefixes. */
export const VALIDATOR = 'validator.longhorn.io';
export const MUTATOR = 'mutator.longhorn.io';

/**
 * An admission rejection, rendered like the Kubernetes API server renders a webhook denial
 * (`admission webhook "validator.longhorn.io" denied the request: ...`). The REST API answers it with 500, like
 * Longhorn, whose apiserver's 422 is not a NotFound.
 */
export function admissionDenied(webhook: string, message: string): ApiError {
  return new ApiError(500, `admission webhook "${webhook}" denied the request: ${message}`);
}

/** The issues as one message: each issue's detail (the path prefix is dropped when the detail already says what it is). */
export function issuesMessage(issues: readonly ValidationIssue[]): string {
  return issues.map((i) => i.message).join('; ');
}

export function denyIfIssues(issues: readonly ValidationIssue[], webhook = VALIDATOR): void {
  if (issues.length > 0) throw admissionDenied(webhook, issuesMessage(issues));
}

/** A refused request with Longhorn's message (answered as 500). */
export const refused = (message: string): ApiError => new ApiError(500, message);

/** Go's `time.Time.String()` for a UTC time: `2006-01-02 15:04:05.999999999 +0000 UTC` (fraction without trailing zeros). */
export function goTimeString(iso: string): string {
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return iso;
  const p = (n: number, w = 2) => String(n).padStart(w, '0');
  const ms = d.getUTCMilliseconds();
  const frac = ms ? `.${p(ms, 3).replace(/0+$/, '')}` : '';
  return `${d.getUTCFullYear()}-${p(d.getUTCMonth() + 1)}-${p(d.getUTCDate())} ${p(d.getUTCHours())}:${p(d.getUTCMinutes())}:${p(d.getUTCSeconds())}${frac} +0000 UTC`;
}

/** Retries `fn` on a write conflict (someone else updated the object in between). */
export async function retryOnConflict<T>(fn: () => Promise<T>, attempts = 5): Promise<T> {
  for (let i = 0; ; i++) {
    try {
      return await fn();
    } catch (err) {
      if (i + 1 >= attempts || (err as { reason?: string }).reason !== 'Conflict') throw err;
    }
  }
}
