import { describe, expect, it } from '@jest/globals';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse, parseAllDocuments } from 'yaml';
import { Ajv } from 'ajv';
import { CHART_CRD_KINDS, CRD_TEMPLATE_FILE, buildCustomResourceDefinition, renderCrdTemplate } from '@bis/crd-types';
import { rbacRules } from '../api-access.js';
import { ChartTemplates, TemplateError } from './go-template.js';
import { mergeValues, renderChart, renderNotes } from './render-chart.js';
import { CLUSTER_RBAC_TEMPLATE_FILE, RBAC_TEMPLATE_FILE, renderClusterRoleTemplate, renderRoleTemplate } from './rbac-template.js';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../..');
const chartDir = path.join(repoRoot, 'charts/backing-image-system');
const release = { name: 'bis', namespace: 'longhorn-system' };

type Doc = { apiVersion: string; kind: string; metadata: { name: string; namespace?: string; labels?: Record<string, string> }; [k: string]: unknown };

async function docs(values: Record<string, unknown>): Promise<Doc[]> {
  const out: Doc[] = [];
  for (const [file, text] of await renderChart(chartDir, values, release)) {
    for (const d of parseAllDocuments(text)) {
      if (d.errors.length) throw new Error(`${file}: ${d.errors.map((e) => e.message).join('; ')}\n${text}`);
      const v = d.toJS() as Doc | null;
      if (v === null) continue;
      expect(typeof v.apiVersion).toBe('string');
      expect(typeof v.kind).toBe('string');
      expect(v.metadata.name).toMatch(/^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/);
      out.push(v);
    }
  }
  return out;
}
const find = (all: Doc[], kind: string, name?: string): Doc => {
  const d = all.find((x) => x.kind === kind && (name === undefined || x.metadata.name === name));
  if (!d) throw new Error(`no ${kind} ${name ?? ''}`);
  return d;
};

describe('Go template subset renderer', () => {
  const render = (src: string, root: unknown, extra = ''): string => {
    const t = new ChartTemplates();
    if (extra) t.add('_helpers.tpl', extra);
    t.add('t.yaml', src);
    return t.render('t.yaml', root);
  };
  it('trims, branches, ranges maps in key order and pipes through functions', () => {
    const root = { Values: { a: { b: 'x' }, m: { zeta: 1, alpha: null, mid: 'v' }, off: false } };
    expect(render('k: {{ .Values.a.b | quote }}\n{{- if .Values.off }}\nno{{ else if .Values.a }}\nyes{{ else }}never{{ end }}', root)).toBe('k: "x"\nyes');
    expect(render('{{- range $k, $v := .Values.m }}\n{{- if not (kindIs "invalid" $v) }}\n{{ kebabcase $k }}={{ $v }}{{ end }}{{ end }}', root)).toBe('\nmid=v\nzeta=1');
    expect(render('x:{{ toYaml .Values.a | nindent 2 }}', root)).toBe('x:\n  b: x');
    expect(render('{{ include "h" . }}', root, '{{- define "h" -}}v={{ .Values.a.b }}{{- end -}}')).toBe('v=x');
    expect(render('{{ default "d" .Values.none }} {{ printf "%s-%s" "a" "b" }} {{ kebabcase "backingImageCleanupWaitInterval" }}', root)).toBe('d a-b backing-image-cleanup-wait-interval');
  });
  it('rejects constructs it does not implement instead of rendering them wrongly', () => {
    expect(() => render('{{ with .Values }}x{{ end }}', {})).toThrow(TemplateError);
    expect(() => render('{{ .Values.x | sha256sum }}', { Values: {} })).toThrow('function "sha256sum" is not supported');
    expect(() => render('{{ if .x }}', {})).toThrow('missing {{ end }}');
  });
});

describe('chart charts/backing-image-system', () => {
  it('renders valid YAML with the default values', async () => {
    const all = await docs({});
    expect(all.map((d) => `${d.kind}/${d.metadata.name}`).sort()).toEqual([
      'ClusterRole/backing-image-system',
      'ClusterRoleBinding/backing-image-system',
      'ConfigMap/backing-image-system-default-setting',
      ...CHART_CRD_KINDS.map((k) => `CustomResourceDefinition/${k.plural}.longhorn.io`),
      'DaemonSet/backing-image-system-manager',
      'NetworkPolicy/backing-image-data-source',
      'NetworkPolicy/backing-image-manager',
      'PriorityClass/backing-image-system-critical',
      'Role/backing-image-system',
      'RoleBinding/backing-image-system',
      'Service/backing-image-system-backend',
      'ServiceAccount/backing-image-system-service-account',
    ].sort());
    const cm = find(all, 'ConfigMap') as Doc & { data: Record<string, string> };
    expect(parse(cm.data['default-setting.yaml'])).toEqual({ 'priority-class': 'backing-image-system-critical' });
    const ds = find(all, 'DaemonSet') as Doc & { spec: { template: { spec: { containers: { command: string[]; image: string }[]; priorityClassName: string } } } };
    const c = ds.spec.template.spec.containers[0];
    expect(c.image).toBe('backing-image-system/controller-manager:0.1.0');
    expect(c.command[c.command.indexOf('--backing-image-manager-image') + 1]).toBe('backing-image-system/backing-image-manager:0.1.0');
    expect(c.command[c.command.indexOf('--service-account') + 1]).toBe('backing-image-system-service-account');
    // The node's default disk is the data path the DaemonSet mounts.
    expect(c.command[c.command.indexOf('--default-data-path') + 1]).toBe('/var/lib/longhorn/');
    expect(ds.spec.template.spec.priorityClassName).toBe('backing-image-system-critical');
    // Internal calls need the token by default: no opt-in flag.
    expect(c.command).not.toContain('--allow-unauthenticated-internal-calls');
    expect(c.command).not.toContain('--allow-source-hosts');
    expect(c.command).not.toContain('--default-backup-target');
    expect(c.command[c.command.indexOf('--default-backupstore-poll-interval') + 1]).toBe('300');
  });

  it('probes the controller-manager with GET /v1/healthz (readiness and liveness) and sets resources by default', async () => {
    type Probe = { httpGet?: { path: string; port: string | number }; tcpSocket?: unknown; periodSeconds: number; failureThreshold: number; timeoutSeconds: number };
    const ds = find(await docs({}), 'DaemonSet') as Doc & { spec: { template: { spec: { containers: { readinessProbe: Probe; livenessProbe: Probe; resources: unknown; ports: { name: string; containerPort: number }[] }[] } } } };
    const c = ds.spec.template.spec.containers[0];
    expect(c.ports).toEqual([{ name: 'manager', containerPort: 9500 }]);
    for (const probe of [c.readinessProbe, c.livenessProbe]) {
      expect(probe.httpGet).toEqual({ path: '/v1/healthz', port: 'manager' });
      expect(probe.tcpSocket).toBeUndefined();
      // The handler waits up to 5 s for a check: the probe's timeout must be longer.
      expect(probe.timeoutSeconds).toBeGreaterThan(5);
    }
    // Liveness gives up much later than readiness (an API server outage is not a reason to restart).
    expect(c.livenessProbe.periodSeconds * c.livenessProbe.failureThreshold).toBeGreaterThanOrEqual(4 * c.readinessProbe.periodSeconds * c.readinessProbe.failureThreshold);
    expect(c.resources).toEqual({ requests: { cpu: '100m', memory: '256Mi' }, limits: { memory: '1Gi' } });
  });

  it('NOTES.txt tells how to reach the API and UI, and about the CRDs and Longhorn', async () => {
    const notes = await renderNotes(chartDir, {}, release);
    expect(notes).toContain('namespace longhorn-system (release bis)');
    expect(notes).toContain('kubectl -n longhorn-system port-forward service/backing-image-system-backend 9500:9500');
    expect(notes).toContain('are kept on `helm uninstall`');
    expect(notes).toContain('must not run in a cluster where Longhorn is installed');
    const nodePort = await renderNotes(chartDir, { service: { manager: { type: 'NodePort', nodePort: 30950 } }, crds: { install: false } }, release);
    expect(nodePort).toContain('http://<any node address>:30950/');
    expect(nodePort).not.toContain('port-forward');
    expect(nodePort).toContain('crds.install is false');
    expect(nodePort).not.toContain('{{');
  });

  it('values.schema.json accepts the default and full values and rejects wrong ones', async () => {
    const schema = JSON.parse(await fsp.readFile(path.join(chartDir, 'values.schema.json'), 'utf8')) as Record<string, unknown>;
    const ajv = new Ajv({ allErrors: true, strict: true, allowUnionTypes: true });
    const validate = ajv.compile(schema);
    const defaults = parse(await fsp.readFile(path.join(chartDir, 'values.yaml'), 'utf8')) as Record<string, unknown>;
    const full = parse(await fsp.readFile(path.join(chartDir, 'ci/full-values.yaml'), 'utf8')) as Record<string, unknown>;
    // Helm validates the values after merging the user's over the chart's.
    const check = (over: Record<string, unknown>): string[] => (validate(mergeValues(defaults, over)) ? [] : (validate.errors ?? []).map((e) => `${e.instancePath} ${e.message}`));
    expect(check({})).toEqual([]);
    expect(check(full)).toEqual([]);
    // Every key of the full values is described by the schema (nothing passes only because it is unknown).
    const props = schema['properties'] as Record<string, { properties?: Record<string, unknown> }>;
    for (const [k, v] of Object.entries(full)) {
      expect(props).toHaveProperty([k]);
      if (v && typeof v === 'object' && !Array.isArray(v) && k !== 'defaultSettings') for (const sub of Object.keys(v)) expect(props[k]!.properties ?? {}).toHaveProperty([sub]);
    }
    expect(check({ longhornManagr: {} }).join()).toContain('must NOT have additional properties');
    expect(check({ service: { manager: { type: 'Ingress' } } }).join()).toContain('/service/manager/type must be equal to one of the allowed values');
    expect(check({ crds: { install: 'yes' } }).join()).toContain('/crds/install must be boolean');
    expect(check({ image: { pullPolicy: 'Sometimes' } }).join()).toContain('/image/pullPolicy');
    expect(check({ longhornManager: { log: { format: 'xml' } } }).join()).toContain('/longhornManager/log/format');
    expect(check({ dataPath: 'relative/path' }).join()).toContain('/dataPath must match pattern');
    expect(check({ longhornManager: { resources: { limits: { memory: '1 gig' } } } }).join()).toContain('/longhornManager/resources/limits/memory');
    expect(check({ defaultSettings: { backupCompressionMethod: 'zip' } }).join()).toContain('/defaultSettings/backupCompressionMethod');
    expect(check({ service: { manager: { type: 'NodePort', nodePort: 'abc' } } }).join()).toContain('/service/manager/nodePort');
  });

  type Policy = Doc & { spec: { podSelector: { matchLabels: Record<string, string> }; policyTypes: string[]; ingress: { from: { podSelector: { matchLabels: Record<string, string> } }[]; ports?: unknown }[] } };
  const SYSTEM_PEERS = [
    { app: 'backing-image-system-manager', 'app.kubernetes.io/instance': 'bis' },
    { 'longhorn.io/managed-by': 'longhorn-manager', 'longhorn.io/component': 'backing-image-manager' },
    { 'longhorn.io/managed-by': 'longhorn-manager', 'longhorn.io/component': 'backing-image-data-source' },
  ];

  it('admits to manager and data-source pods only the release controller and the data-plane pods (NetworkPolicy on by default)', async () => {
    const all = await docs({});
    for (const component of ['backing-image-manager', 'backing-image-data-source']) {
      const p = find(all, 'NetworkPolicy', component) as Policy;
      expect(p.metadata.namespace).toBe('longhorn-system');
      expect(p.spec.podSelector).toEqual({ matchLabels: { 'longhorn.io/component': component } });
      expect(p.spec.policyTypes).toEqual(['Ingress']);
      // One rule, over every port of the pod, from exactly the system's own pods (same namespace: no namespaceSelector).
      expect(p.spec.ingress).toHaveLength(1);
      expect(p.spec.ingress[0].ports).toBeUndefined();
      expect(p.spec.ingress[0].from.map((f) => f.podSelector.matchLabels)).toEqual(SYSTEM_PEERS);
      expect(p.spec.ingress[0].from.every((f) => Object.keys(f).length === 1)).toBe(true);
    }
    // Off on request.
    expect((await docs({ networkPolicies: { enabled: false } })).filter((d) => d.kind === 'NetworkPolicy')).toEqual([]);
  });

  it('internalAuth.allowUnauthenticated passes the opt-in flag and admits Longhorn components to the data plane', async () => {
    const all = await docs({ internalAuth: { allowUnauthenticated: true } });
    const ds = find(all, 'DaemonSet') as Doc & { spec: { template: { spec: { containers: { command: string[] }[] } } } };
    expect(ds.spec.template.spec.containers[0].command).toContain('--allow-unauthenticated-internal-calls');
    for (const component of ['backing-image-manager', 'backing-image-data-source']) {
      const p = find(all, 'NetworkPolicy', component) as Policy;
      expect(p.spec.ingress.map((r) => r.from.map((f) => f.podSelector.matchLabels))).toEqual([
        SYSTEM_PEERS,
        [{ app: 'longhorn-manager' }, { 'longhorn.io/component': 'instance-manager' }],
      ]);
    }
  });

  it('renders valid YAML with every option set (ci/full-values.yaml)', async () => {
    const values = parse(await fsp.readFile(path.join(chartDir, 'ci/full-values.yaml'), 'utf8')) as Record<string, unknown>;
    const all = await docs(values);
    expect(all.filter((d) => d.kind === 'NetworkPolicy').map((d) => d.metadata.name).sort()).toEqual(['backing-image-data-source', 'backing-image-manager']);
    const sm = find(all, 'ServiceMonitor') as Doc & { spec: { endpoints: { interval: string }[] } };
    expect(sm.metadata.labels?.release).toBe('prometheus');
    expect(sm.spec.endpoints[0].interval).toBe('30s');
    const ds = find(all, 'DaemonSet') as Doc & {
      spec: { template: { spec: { containers: { command: string[]; image: string; resources: unknown }[]; tolerations: unknown[]; nodeSelector: unknown; imagePullSecrets: unknown } } };
    };
    const pod = ds.spec.template.spec;
    expect(pod.containers[0].image).toBe('registry.example.com/bis/controller-manager:1.2.3');
    expect(pod.containers[0].command).toContain('registry.example.com/bis/backing-image-manager:1.2.3');
    const cmd = pod.containers[0].command;
    expect(cmd[cmd.indexOf('--allow-source-hosts') + 1]).toBe('images.internal.example,10.20.0.0/16');
    expect(cmd[cmd.indexOf('--default-backup-target') + 1]).toBe('s3://backups@us-east-1/cluster-a/');
    expect(cmd[cmd.indexOf('--default-backup-target-credential-secret') + 1]).toBe('s3-credentials');
    expect(cmd[cmd.indexOf('--default-backupstore-poll-interval') + 1]).toBe('600');
    expect(pod.tolerations).toHaveLength(2);
    expect(pod.nodeSelector).toEqual({ storage: 'true', role: 'storage' });
    expect(pod.containers[0].resources).toEqual({ requests: { cpu: '100m', memory: '256Mi' }, limits: { memory: '1Gi' } });
    const svc = find(all, 'Service') as Doc & { spec: { type: string; ports: { nodePort?: number }[] } };
    expect(svc.spec.type).toBe('NodePort');
    expect(svc.spec.ports[0].nodePort).toBe(30950);
    const cm = find(all, 'ConfigMap') as Doc & { data: Record<string, string> };
    const settings = parse(cm.data['default-setting.yaml']) as Record<string, string>;
    expect(settings['backing-image-cleanup-wait-interval']).toBe('30');
    expect(settings['default-min-number-of-backing-image-copies']).toBe('2');
    expect(settings['concurrent-backing-image-replenish-per-node-limit']).toBe('3');
    expect(settings['storage-network']).toBe('kube-system/storage-net');
    expect(Object.keys(settings)).toHaveLength(12);
  });

  it('ships every CRD generated from @bis/crd-types as a template (upgraded by helm upgrade), kept on uninstall by default', async () => {
    expect(await fsp.readFile(path.join(chartDir, CRD_TEMPLATE_FILE), 'utf8')).toBe(renderCrdTemplate());
    await expect(fsp.stat(path.join(chartDir, 'crds'))).rejects.toThrow(); // Helm never upgrades crds/
    const crds = (await docs({})).filter((d) => d.kind === 'CustomResourceDefinition');
    expect(crds).toHaveLength(CHART_CRD_KINDS.length);
    for (const def of CHART_CRD_KINDS) {
      const crd = crds.find((c) => c.metadata.name === `${def.plural}.longhorn.io`) as Doc & { metadata: { annotations?: Record<string, string> } };
      const { annotations, ...metadata } = crd.metadata;
      expect(annotations).toEqual({ 'helm.sh/resource-policy': 'keep' });
      expect({ ...crd, metadata }).toEqual(buildCustomResourceDefinition(def));
    }
    // crds.keep=false: no resource policy (an uninstall deletes the CRDs and every object); crds.install=false: none.
    const unkept = (await docs({ crds: { keep: false } })).filter((d) => d.kind === 'CustomResourceDefinition') as (Doc & { metadata: { annotations?: unknown } })[];
    expect(unkept).toHaveLength(CHART_CRD_KINDS.length);
    expect(unkept.every((c) => c.metadata.annotations === undefined)).toBe(true);
    expect((await docs({ crds: { install: false } })).filter((d) => d.kind === 'CustomResourceDefinition')).toEqual([]);
  });

  it('grants exactly the API calls the code declares (RBAC generated from API_RESOURCE_USES)', async () => {
    expect(await fsp.readFile(path.join(chartDir, RBAC_TEMPLATE_FILE), 'utf8')).toBe(renderRoleTemplate());
    const role = find(await docs({}), 'Role') as Doc & { rules: unknown };
    expect(role.rules).toEqual(rbacRules());
    expect(role.metadata.namespace).toBe('longhorn-system');
    // Cluster-scoped calls (Kubernetes nodes, read by the node-health monitor) go to the ClusterRole.
    expect(await fsp.readFile(path.join(chartDir, CLUSTER_RBAC_TEMPLATE_FILE), 'utf8')).toBe(renderClusterRoleTemplate());
    const all = await docs({});
    const cr = find(all, 'ClusterRole') as Doc & { rules: unknown };
    expect(cr.rules).toEqual(rbacRules(undefined, 'cluster'));
    expect(cr.rules).toEqual([
      { apiGroups: [''], resources: ['nodes'], verbs: ['get', 'list', 'watch'] },
      { apiGroups: ['apps'], resources: ['daemonsets'], verbs: ['list'] },
    ]);
    const crb = find(all, 'ClusterRoleBinding') as Doc & { roleRef: { name: string }; subjects: { name: string; namespace: string }[] };
    expect(crb.roleRef.name).toBe('backing-image-system');
    expect(crb.subjects).toEqual([{ kind: 'ServiceAccount', name: 'backing-image-system-service-account', namespace: 'longhorn-system' }]);
  });
});
