/** Machine-readable name of the rule a value broke. */
export type ValidationRule =
  | 'required'
  | 'type'
  | 'nullable'
  | 'enum'
  | 'format'
  | 'minimum'
  | 'maximum'
  | 'unknown-field'
  | 'constant'
  | 'name'
  | 'checksum'
  | 'url'
  | 'immutable'
  | 'unsupported'
  | 'conflict'
  | 'reference';

/** One broken rule: where (`path`, e.g. `spec.minNumberOfCopies`), which rule, and a readable message. */
export interface ValidationIssue {
  readonly path: string;
  readonly rule: ValidationRule;
  /** `<path>: <detail>`, e.g. `spec.minNumberOfCopies: must be >= 1 (got 0)`. */
  readonly message: string;
}

export function issue(path: string, rule: ValidationRule, detail: string): ValidationIssue {
  return { path, rule, message: `${path}: ${detail}` };
}

/** Thrown by the `assert*` helpers; carries every issue found, not just the first. */
export class ValidationError extends Error {
  readonly issues: readonly ValidationIssue[];
  constructor(subject: string, issues: readonly ValidationIssue[]) {
    super(`invalid ${subject}: ${issues.map((i) => i.message).join('; ')}`);
    this.name = 'ValidationError';
    this.issues = issues;
  }
}

/** Appends a map key or array index to a field path the way Kubernetes field paths do (`spec.disks[uuid]`). */
export function childPath(parent: string, key: string | number): string {
  if (typeof key === 'number') return `${parent}[${key}]`;
  return parent === '' ? key : `${parent}.${key}`;
}

export function mapEntryPath(parent: string, key: string): string {
  return `${parent}[${key}]`;
}

export function describeValue(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'array';
  if (typeof value === 'string') return JSON.stringify(value);
  if (typeof value === 'object') return 'object';
  return String(value);
}
