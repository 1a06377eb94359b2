import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { parse } from 'yaml';
import { ChartTemplates } from './go-template.js';

export interface ReleaseInfo {
  name: string;
  namespace: string;
}

type Json = Record<string, unknown>;

/** Helm's values merge: maps merge recursively, anything else (lists, scalars, null) replaces. */
export function mergeValues(base: unknown, override: unknown): unknown {
  if (override === undefined) return base;
  if (base && override && typeof base === 'object' && typeof override === 'object' && !Array.isArray(base) && !Array.isArray(override)) {
    const out: Json = { ...(base as Json) };
    for (const [k, v] of Object.entries(override as Json)) out[k] = mergeValues((base as Json)[k], v);
    return out;
  }
  return override;
}

/**
 * Renders every `templates/*.yaml` of a chart the way `helm template` would for the template subset the renderer
 * supports (see go-template.ts). Returns file name -> rendered text.
 */
export async function renderChart(chartDir: string, values: Json, release: ReleaseInfo): Promise<Map<string, string>> {
  const chart = parse(await fsp.readFile(path.join(chartDir, 'Chart.yaml'), 'utf8')) as Json;
  const defaults = parse(await fsp.readFile(path.join(chartDir, 'values.yaml'), 'utf8')) as Json;
  const tdir = path.join(chartDir, 'templates');
  const files = (await fsp.readdir(tdir)).sort();
  const t = new ChartTemplates();
  for (const f of files) if (f.endsWith('.yaml') || f.endsWith('.tpl')) t.add(f, await fsp.readFile(path.join(tdir, f), 'utf8'));
  const root = {
    Values: mergeValues(defaults, values),
    Release: { Name: release.name, Namespace: release.namespace, Service: 'Helm' },
    Chart: { Name: chart.name, Version: chart.version, AppVersion: chart.appVersion },
  };
  const out = new Map<string, string>();
  for (const f of files) if (f.endsWith('.yaml')) out.set(f, t.render(f, root));
  return out;
}
