import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse, parseAllDocuments } from 'yaml';
import { ControlPlane, envtestAssets, installCrds } from '../testing/envtest.js';
import { chartCrds as renderedCrds, renderChart } from './render-chart.js';
import { schemalessCrd } from '../testing/chart-rbac.js';

const chartCrds = async (): Promise<Obj[]> => (await renderedCrds(chartDir)) as Obj[];

/**
 * The chart against a real kube-apiserver (envtest): its CRDs install and enforce their schemas, `kubectl get lhbi`'s
 * printer columns come back as a Table, and every rendered object (default values and ci/full-values.yaml) is
 * accepted by server-side dry-run and then for real. Needs KUBEBUILDER_ASSETS; skipped otherwise.
 */
const assets = envtestAssets();
if (!assets.dir) console.warn(`chart.envtest.spec.ts skipped: ${assets.reason}`);
const describeEnv = assets.dir ? describe : describe.skip;

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../..');
const chartDir = path.join(repoRoot, 'charts/backing-image-system');
const msg = (body: unknown): string => String((body as { message?: string }).message);
type Obj = { apiVersion: string; kind: string; metadata: { name: string; namespace?: string }; [k: string]: unknown };

async function rendered(values: Record<string, unknown>, namespace: string): Promise<Obj[]> {
  const out: Obj[] = [];
  for (const text of (await renderChart(chartDir, values, { name: 'backing-image-system', namespace })).values()) {
    for (const d of parseAllDocuments(text)) {
      const v = d.toJS() as Obj | null;
      if (v) out.push(v);
    }
  }
  return out;
}

describeEnv('chart against a real API server (envtest)', () => {
  let cp: ControlPlane;
  const NS = 'longhorn-system';
  const bi = (name: string, spec: Record<string, unknown>): Obj => ({ apiVersion: 'longhorn.io/v1beta2', kind: 'BackingImage', metadata: { name }, spec });
  const biPath = `/apis/longhorn.io/v1beta2/namespaces/${NS}/backingimages`;

  beforeAll(async () => {
    cp = await ControlPlane.start();
    const ns = await cp.request('POST', '/api/v1/namespaces', { body: { apiVersion: 'v1', kind: 'Namespace', metadata: { name: NS } } });
    expect(ns.status).toBe(201);
  }, 180_000);
  afterAll(async () => {
    await cp?.stop();
  }, 60_000);

  it('installs every CRD of the chart (templates/crds.yaml) and each becomes Established', async () => {
    const crds = await chartCrds();
    expect(crds.length).toBeGreaterThanOrEqual(8);
    expect(crds.map((c) => c.metadata.name)).toContain('replicas.longhorn.io');
    await installCrds(cp, crds);
    const list = (await cp.request('GET', '/apis/apiextensions.k8s.io/v1/customresourcedefinitions')).body as { items: Obj[] };
    expect(list.items.map((c) => c.metadata.name).sort()).toEqual(crds.map((c) => c.metadata.name).sort());
  }, 120_000);

  it('rejects objects that break the schema (enum, type) and applies defaults; unknown fields are pruned', async () => {
    const badEnum = await cp.request('POST', biPath, { body: bi('bad-enum', { sourceType: 'ftp' }) });
    expect(badEnum.status).toBe(422);
    expect(msg(badEnum.body)).toMatch(/spec\.sourceType.*Unsupported value: "ftp"/);
    const badEngine = await cp.request('POST', biPath, { body: bi('bad-engine', { sourceType: 'download', dataEngine: 'v3' }) });
    expect(badEngine.status).toBe(422);
    expect(msg(badEngine.body)).toMatch(/spec\.dataEngine/);
    const badType = await cp.request('POST', biPath, { body: bi('bad-type', { sourceType: 'download', sourceParameters: { url: 42 } }) });
    expect(badType.status).toBe(422);
    expect(msg(badType.body)).toMatch(/spec\.sourceParameters\.url.*Invalid value.*string/);
    const ok = await cp.request('POST', biPath, { body: bi('good', { sourceType: 'download', sourceParameters: { url: 'http://x/y.img' }, bogus: 1 }) });
    expect(ok.status).toBe(201);
    const spec = (ok.body as { spec: Record<string, unknown> }).spec;
    expect(spec.dataEngine).toBe('v1'); // default from the schema
    expect(spec).not.toHaveProperty('bogus'); // structural schema: unknown fields pruned
  });

  it('serves the printer columns of `kubectl get lhbi` as a Table', async () => {
    const res = await cp.request('GET', biPath, { accept: 'application/json;as=Table;v=v1;g=meta.k8s.io' });
    expect(res.status).toBe(200);
    const table = res.body as { kind: string; columnDefinitions: { name: string }[]; rows: { cells: unknown[] }[] };
    expect(table.kind).toBe('Table');
    expect(table.columnDefinitions.map((c) => c.name)).toEqual(['Name', 'UUID', 'SourceType', 'Size', 'VirtualSize', 'Age']);
    const row = table.rows.find((r) => r.cells[0] === 'good');
    expect(row?.cells[2]).toBe('download');
    // The short name resolves through discovery, as kubectl does it.
    const disc = (await cp.request('GET', '/apis/longhorn.io/v1beta2')).body as { resources: { name: string; shortNames?: string[] }[] };
    expect(disc.resources.find((r) => r.name === 'backingimages')?.shortNames).toContain('lhbi');
  });

  /** Plural and scope of each kind, from discovery (as kubectl / helm resolve them). */
  async function resourcePath(o: Obj, ns: string): Promise<string> {
    const gv = o.apiVersion;
    const base = gv.includes('/') ? `/apis/${gv}` : `/api/${gv}`;
    const disc = await cp.request('GET', base);
    if (disc.status !== 200) throw new Error(`${o.kind} ${o.metadata.name}: the API server does not serve ${gv} (HTTP ${disc.status})`);
    const r = (disc.body as { resources: { name: string; kind: string; namespaced: boolean }[] }).resources.find((x) => x.kind === o.kind && !x.name.includes('/'));
    if (!r) throw new Error(`${o.kind} ${o.metadata.name}: ${gv} has no kind ${o.kind}`);
    return r.namespaced ? `${base}/namespaces/${o.metadata.namespace ?? ns}/${r.name}/${o.metadata.name}` : `${base}/${r.name}/${o.metadata.name}`;
  }

  async function applyAll(objs: Obj[], ns: string): Promise<void> {
    // Server-side apply (beta in 1.20): create or update, first as a dry run, then for real.
    for (const dryRun of [true, false]) {
      const failures: string[] = [];
      for (const o of objs) {
        const p = await resourcePath(o, ns);
        const res = await cp.request('PATCH', p, {
          body: o,
          contentType: 'application/apply-patch+yaml',
          query: { fieldManager: 'chart-test', force: 'true', ...(dryRun ? { dryRun: 'All' } : {}) },
        });
        if (res.status !== 200 && res.status !== 201) failures.push(`${o.kind} ${o.metadata.name} (dryRun=${dryRun}): HTTP ${res.status} ${JSON.stringify(res.body)}`);
      }
      expect(failures).toEqual([]);
    }
    for (const o of objs) {
      const got = await cp.request('GET', await resourcePath(o, ns));
      expect(`${o.kind}/${o.metadata.name}: ${got.status}`).toBe(`${o.kind}/${o.metadata.name}: 200`);
    }
  }

  it('accepts every object of the chart rendered with the default values (dry-run, then for real)', async () => {
    const objs = await rendered({}, NS);
    expect(objs.map((o) => o.kind)).toEqual(expect.arrayContaining(['DaemonSet', 'Service', 'ServiceAccount', 'Role', 'RoleBinding', 'ClusterRole', 'ClusterRoleBinding', 'ConfigMap']));
    await applyAll(objs, NS);
  }, 60_000);

  it('accepts every object of the chart rendered with ci/full-values.yaml (dry-run, then for real)', async () => {
    const values = parse(await fsp.readFile(path.join(chartDir, 'ci/full-values.yaml'), 'utf8')) as Record<string, unknown>;
    const objs = await rendered(values, NS);
    expect(objs.map((o) => o.kind)).toEqual(expect.arrayContaining(['PriorityClass', 'NetworkPolicy', 'ServiceMonitor']));
    // ServiceMonitor belongs to the Prometheus operator, which brings its CRD; a stand-in CRD (no schema) lets the
    // API server accept the object here. This checks its group, version, kind and scope, not its fields.
    await installCrds(cp, [schemalessCrd({ group: 'monitoring.coreos.com', version: 'v1', kind: 'ServiceMonitor', plural: 'servicemonitors' })]);
    await applyAll(objs, NS);
    const ds = (await cp.request('GET', `/apis/apps/v1/namespaces/${NS}/daemonsets/backing-image-system-manager`)).body as {
      spec: { template: { spec: { priorityClassName?: string; serviceAccountName?: string } } };
    };
    expect(ds.spec.template.spec.priorityClassName).toBe('custom-critical');
  }, 60_000);
});
