/** Rendering of command results: aligned tables, JSON and YAML. */

export type OutputFormat = 'table' | 'json' | 'yaml';

/** Left-aligned columns separated by three spaces, with an upper-case header row (kubectl style). */
export function table(headers: string[], rows: string[][]): string {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: string[]): string => cells.map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i]))).join('   ').trimEnd();
  return [line(headers.map((h) => h.toUpperCase())), ...rows.map(line)].join('\n') + '\n';
}

const PLAIN = /^[A-Za-z0-9_./][A-Za-z0-9_./:@ -]*$/;
const RESERVED = /^(true|false|yes|no|on|off|null|~|y|n)$/i;

function scalar(v: unknown): string {
  if (v === null || v === undefined) return 'null';
  if (typeof v === 'number' || typeof v === 'boolean') return String(v);
  const s = String(v);
  if (s === '' || !PLAIN.test(s) || RESERVED.test(s) || /^[-+]?(\d|\.\d)/.test(s) || s.endsWith(' ') || s.includes(': ') || s.includes(' #')) return JSON.stringify(s);
  return s;
}

/** YAML for JSON data (block style; strings quoted whenever a plain scalar could be misread). */
export function yaml(v: unknown, indent = 0): string {
  const pad = ' '.repeat(indent);
  if (Array.isArray(v)) {
    if (v.length === 0) return `${pad}[]\n`;
    return v
      .map((item) => {
        if (item && typeof item === 'object' && Object.keys(item).length) {
          const inner = yaml(item, indent + 2);
          return `${pad}- ${inner.slice(indent + 2)}`;
        }
        return `${pad}- ${item && typeof item === 'object' ? (Array.isArray(item) ? '[]' : '{}') : scalar(item)}\n`;
      })
      .join('');
  }
  if (v && typeof v === 'object') {
    const entries = Object.entries(v as Record<string, unknown>);
    if (entries.length === 0) return `${pad}{}\n`;
    return entries
      .map(([k, val]) => {
        const key = scalar(k);
        if (val && typeof val === 'object' && (Array.isArray(val) ? val.length : Object.keys(val).length)) return `${pad}${key}:\n${yaml(val, Array.isArray(val) ? indent : indent + 2)}`;
        if (val && typeof val === 'object') return `${pad}${key}: ${Array.isArray(val) ? '[]' : '{}'}\n`;
        return `${pad}${key}: ${scalar(val)}\n`;
      })
      .join('');
  }
  return `${pad}${scalar(v)}\n`;
}

export function render(format: OutputFormat, data: unknown, asTable: () => string): string {
  if (format === 'json') return JSON.stringify(data, null, 2) + '\n';
  if (format === 'yaml') return yaml(data);
  return asTable();
}
