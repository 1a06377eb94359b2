import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseAllDocuments } from 'yaml';
import { chartCrds, renderChart } from '../chart/render-chart.js';
import { installCrds, type ControlPlane } from './envtest.js';

/** Test support for the envtest suites: the chart's CRDs and RBAC on a real API server, and a token of its account. */

export const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../..');
export const chartDir = path.join(repoRoot, 'charts/backing-image-system');

export type Obj = { apiVersion: string; kind: string; metadata: { name: string; namespace?: string }; [k: string]: unknown };
export type Rule = { apiGroups: string[]; resources: string[]; verbs: string[] };

const RBAC_KINDS = ['ServiceAccount', 'Role', 'RoleBinding', 'ClusterRole', 'ClusterRoleBinding'];

export function rbacPath(o: Obj, ns: string): string {
  const plural = { ServiceAccount: 'serviceaccounts', Role: 'roles', RoleBinding: 'rolebindings', ClusterRole: 'clusterroles', ClusterRoleBinding: 'clusterrolebindings' }[o.kind] as string;
  if (o.kind === 'ServiceAccount') return `/api/v1/namespaces/${ns}/serviceaccounts/${o.metadata.name}`;
  const base = '/apis/rbac.authorization.k8s.io/v1';
  return o.kind.startsWith('Cluster') ? `${base}/${plural}/${o.metadata.name}` : `${base}/namespaces/${ns}/${plural}/${o.metadata.name}`;
}

/** Server-side apply as admin. */
export async function applyObject(cp: ControlPlane, o: Obj, p: string): Promise<void> {
  const res = await cp.request('PATCH', p, { body: o, contentType: 'application/apply-patch+yaml', query: { fieldManager: 'envtest', force: 'true' } });
  if (res.status >= 300) throw new Error(`${o.kind} ${o.metadata.name}: HTTP ${res.status} ${JSON.stringify(res.body)}`);
}

/**
 * Installs the chart's CRDs, creates the namespace, applies the chart's rendered RBAC (ServiceAccount, Role,
 * RoleBinding, ClusterRole, ClusterRoleBinding) as admin, and returns those objects and a token of the account from
 * the TokenRequest API. Nothing else grants the account anything.
 */
export async function installChartIdentity(cp: ControlPlane, ns: string): Promise<{ rbac: Obj[]; serviceAccount: string; token: string }> {
  await installCrds(cp, (await chartCrds(chartDir)) as Obj[]);
  const nsRes = await cp.request('POST', '/api/v1/namespaces', { body: { apiVersion: 'v1', kind: 'Namespace', metadata: { name: ns } } });
  if (nsRes.status !== 201) throw new Error(`namespace ${ns}: HTTP ${nsRes.status}`);
  const rbac: Obj[] = [];
  for (const text of (await renderChart(chartDir, {}, { name: 'backing-image-system', namespace: ns })).values()) {
    for (const d of parseAllDocuments(text)) {
      const o = d.toJS() as Obj | null;
      if (o && RBAC_KINDS.includes(o.kind)) rbac.push(o);
    }
  }
  for (const o of rbac) await applyObject(cp, o, rbacPath(o, ns));
  const sa = rbac.find((o) => o.kind === 'ServiceAccount');
  if (!sa) throw new Error('the chart renders no ServiceAccount');
  const tr = await cp.request('POST', `/api/v1/namespaces/${ns}/serviceaccounts/${sa.metadata.name}/token`, {
    body: { apiVersion: 'authentication.k8s.io/v1', kind: 'TokenRequest', spec: { expirationSeconds: 3600 } },
  });
  if (tr.status !== 201) throw new Error(`TokenRequest: HTTP ${tr.status} ${JSON.stringify(tr.body)}`);
  return { rbac, serviceAccount: sa.metadata.name, token: (tr.body as { status: { token: string } }).status.token };
}

/** The Role with `verb` removed from the rule that grants `resource`. */
export function roleWithout(role: Obj & { rules: Rule[] }, resource: string, verb: string): Obj & { rules: Rule[] } {
  return { ...role, rules: role.rules.map((r) => (r.resources.includes(resource) ? { ...r, verbs: r.verbs.filter((v) => v !== verb) } : r)) };
}

/**
 * A stand-in CRD with no schema (any fields kept), for kinds another product installs: Longhorn's `Replica`, the
 * Prometheus operator's `ServiceMonitor`. It checks group, version, kind and scope, not fields.
 */
export function schemalessCrd(o: { group: string; version: string; kind: string; plural: string; statusSubresource?: boolean }): Obj {
  return {
    apiVersion: 'apiextensions.k8s.io/v1',
    kind: 'CustomResourceDefinition',
    metadata: { name: `${o.plural}.${o.group}` },
    spec: {
      group: o.group,
      scope: 'Namespaced',
      names: { plural: o.plural, singular: o.kind.toLowerCase(), kind: o.kind, listKind: `${o.kind}List` },
      versions: [
        {
          name: o.version,
          served: true,
          storage: true,
          ...(o.statusSubresource ? { subresources: { status: {} } } : {}),
          schema: { openAPIV3Schema: { type: 'object', 'x-kubernetes-preserve-unknown-fields': true } },
        },
      ],
    },
  };
}
