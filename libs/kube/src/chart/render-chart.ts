import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { parse, parseAllDocuments } from 'yaml';
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
  const { t, files, root } = await loadChart(chartDir, values, release);
  const out = new Map<string, string>();
  for (const f of files) if (f.endsWith('.yaml')) out.set(f, t.render(f, root));
  return out;
}

/** Renders `templates/NOTES.txt`, the text `helm install` prints, with the same values and release. */
export async function renderNotes(chartDir: string, values: Json, release: ReleaseInfo): Promise<string> {
  const { t, root } = await loadChart(chartDir, values, release, ['NOTES.txt']);
  return t.render('NOTES.txt', root);
}

async function loadChart(chartDir: string, values: Json, release: ReleaseInfo, extra: string[] = []): Promise<{ t: ChartTemplates; files: string[]; root: Json }> {
  const chart = parse(await fsp.readFile(path.join(chartDir, 'Chart.yaml'), 'utf8')) as Json;
  const defaults = parse(await fsp.readFile(path.join(chartDir, 'values.yaml'), 'utf8')) as Json;
  const tdir = path.join(chartDir, 'templates');
  const files = (await fsp.readdir(tdir)).sort();
  const t = new ChartTemplates();
  for (const f of files) if (f.endsWith('.yaml') || f.endsWith('.tpl') || extra.includes(f)) t.add(f, await fsp.readFile(path.join(tdir, f), 'utf8'));
  const root = {
    Values: mergeValues(defaults, values),
    Release: { Name: release.name, Namespace: release.namespace, Service: 'Helm' },
    Chart: { Name: chart.name, Version: chart.version, AppVersion: chart.appVersion },
  };
  return { t, files, root };
}

/** A rendered Kubernetes object (enough to route and apply it). */
export interface ChartObject {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string>; annotations?: Record<string, string> };
  [k: string]: unknown;
}

/** Renders the chart and parses every document into objects (empty documents skipped); a YAML error names its template. */
export async function renderChartObjects(chartDir: string, values: Json, release: ReleaseInfo): Promise<ChartObject[]> {
  const out: ChartObject[] = [];
  for (const [file, text] of await renderChart(chartDir, values, release)) {
    for (const d of parseAllDocuments(text)) {
      if (d.errors.length) throw new Error(`${file}: ${d.errors.map((e) => e.message).join('; ')}`);
      const v = d.toJS() as ChartObject | null;
      if (v) out.push(v);
    }
  }
  return out;
}

/** The CustomResourceDefinitions the chart installs with the default values (templates/crds.yaml). */
export async function chartCrds(chartDir: string): Promise<ChartObject[]> {
  return (await renderChartObjects(chartDir, {}, { name: 'backing-image-system', namespace: 'longhorn-system' })).filter((o) => o.kind === 'CustomResourceDefinition');
}
