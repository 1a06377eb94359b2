import type { LabelSelector, LabelSelectorRequirement } from './types.js';

/** A compiled selector: every requirement must hold. */
export interface CompiledSelector {
  readonly requirements: readonly LabelSelectorRequirement[];
  matches(labels: Record<string, string> | undefined): boolean;
}

const KEY_RE = /^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$/;
const VALUE_RE = /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/;

export function isValidLabelKey(key: string): boolean {
  if (!KEY_RE.test(key)) return false;
  const slash = key.indexOf('/');
  const prefix = slash >= 0 ? key.slice(0, slash) : '';
  const name = slash >= 0 ? key.slice(slash + 1) : key;
  return prefix.length <= 253 && name.length <= 63;
}
export function isValidLabelValue(value: string): boolean {
  return value.length <= 63 && VALUE_RE.test(value);
}

export class LabelSelectorError extends Error {
  constructor(selector: string, why: string) {
    super(`invalid label selector "${selector}": ${why}`);
    this.name = 'LabelSelectorError';
  }
}

/** Splits on commas that are not inside parentheses. */
function splitTerms(s: string): string[] {
  const out: string[] = [];
  let depth = 0;
  let cur = '';
  for (const ch of s) {
    if (ch === '(') depth++;
    if (ch === ')') depth--;
    if (ch === ',' && depth === 0) {
      out.push(cur);
      cur = '';
    } else cur += ch;
  }
  out.push(cur);
  return out.map((t) => t.trim()).filter((t) => t.length > 0);
}

export function parseLabelSelector(selector: string): LabelSelectorRequirement[] {
  const reqs: LabelSelectorRequirement[] = [];
  for (const term of splitTerms(selector)) {
    let m: RegExpMatchArray | null;
    if ((m = term.match(/^!\s*(\S+)$/))) {
      reqs.push({ key: m[1], operator: 'DoesNotExist' });
    } else if ((m = term.match(/^(\S+?)\s*(==|!=|=)\s*(\S*)$/))) {
      const [, key, op, value] = m;
      if (!isValidLabelValue(value)) throw new LabelSelectorError(selector, `invalid value "${value}"`);
      reqs.push({ key, operator: op === '!=' ? 'NotIn' : 'In', values: [value] });
    } else if ((m = term.match(/^(\S+)\s+(in|notin)\s*\(([^)]*)\)$/))) {
      const values = m[3].split(',').map((v) => v.trim()).filter((v) => v.length > 0);
      if (values.length === 0) throw new LabelSelectorError(selector, `empty value set for "${m[1]}"`);
      reqs.push({ key: m[1], operator: m[2] === 'in' ? 'In' : 'NotIn', values });
    } else if ((m = term.match(/^(\S+)$/))) {
      reqs.push({ key: m[1], operator: 'Exists' });
    } else {
      throw new LabelSelectorError(selector, `cannot parse "${term}"`);
    }
    const key = reqs[reqs.length - 1].key;
    if (!isValidLabelKey(key)) throw new LabelSelectorError(selector, `invalid label key "${key}"`);
  }
  return reqs;
}

export function compileSelector(selector: LabelSelector | undefined): CompiledSelector {
  let requirements: LabelSelectorRequirement[] = [];
  if (typeof selector === 'string') requirements = parseLabelSelector(selector);
  else if (selector) {
    for (const [key, value] of Object.entries(selector.matchLabels ?? {})) requirements.push({ key, operator: 'In', values: [value] });
    requirements.push(...(selector.matchExpressions ?? []));
  }
  return {
    requirements,
    matches(labels) {
      const l = labels ?? {};
      return requirements.every((r) => {
        const has = Object.prototype.hasOwnProperty.call(l, r.key);
        switch (r.operator) {
          case 'Exists':
            return has;
          case 'DoesNotExist':
            return !has;
          case 'In':
            return has && (r.values ?? []).includes(l[r.key]);
          case 'NotIn':
            return !has || !(r.values ?? []).includes(l[r.key]);
        }
      });
    },
  };
}
