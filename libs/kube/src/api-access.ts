import { KINDS, LONGHORN_API_VERSION } from '@bis/crd-types';

/** Kubernetes API verbs as RBAC names them. */
export type ApiVerb = 'get' | 'list' | 'watch' | 'create' | 'update' | 'patch' | 'delete';

/** One (group, resource) the system calls, with the verbs it uses and why. `resource` may be `pods/log`, `x/status`. */
export interface ApiResourceUse {
  readonly group: string;
  readonly version: string;
  readonly resource: string;
  readonly verbs: readonly ApiVerb[];
  /** Who makes these calls (documentation and RBAC comments). */
  readonly usedBy: string;
  /** `cluster` for cluster-scoped resources (granted by the chart's ClusterRole); default `namespace` (its Role). */
  readonly scope?: 'namespace' | 'cluster';
}

const LONGHORN_GROUP = LONGHORN_API_VERSION.split('/')[0];
const LONGHORN_VERSION = LONGHORN_API_VERSION.split('/')[1];

/** Verbs `KubeDatastore` issues on every kind it stores, and on their status subresource. */
export const DATASTORE_VERBS: readonly ApiVerb[] = ['get', 'list', 'watch', 'create', 'update', 'delete'];
export const DATASTORE_STATUS_VERBS: readonly ApiVerb[] = ['update'];

/**
 * Every Kubernetes API call the system makes, in one table. The Kubernetes datastore and pod runtime look their calls
 * up here before making them (`ApiAccess.require`) and fail if a call is missing, and the chart's RBAC rules are
 * generated from this table (`rbacRules`). A new call therefore cannot ship without its permission.
 */
/** Longhorn kinds the controllers read through the datastore besides the generated CRDs (Longhorn's own CRD). */
const LONGHORN_EXTRA_PLURALS = ['replicas'] as const;

export const API_RESOURCE_USES: readonly ApiResourceUse[] = [
  ...[...KINDS.map((k) => k.plural), ...LONGHORN_EXTRA_PLURALS].flatMap((plural): ApiResourceUse[] => [
    { group: LONGHORN_GROUP, version: LONGHORN_VERSION, resource: plural, verbs: DATASTORE_VERBS, usedBy: 'KubeDatastore' },
    { group: LONGHORN_GROUP, version: LONGHORN_VERSION, resource: `${plural}/status`, verbs: DATASTORE_STATUS_VERBS, usedBy: 'KubeDatastore' },
  ]),
  { group: '', version: 'v1', resource: 'pods', verbs: ['get', 'list', 'watch', 'create', 'delete'], usedBy: 'KubePodRuntime' },
  { group: '', version: 'v1', resource: 'pods/log', verbs: ['get'], usedBy: 'KubePodRuntime' },
  // Backup targets' credential secrets, read by name in the system's namespace (never listed, never watched).
  { group: '', version: 'v1', resource: 'secrets', verbs: ['get'], usedBy: 'KubeSecretStore' },
  // The internal token's Secret, created at start when missing (RBAC cannot restrict `create` by resourceNames: the
  // name is not known when the request is authorized). Its `get` is the one above.
  { group: '', version: 'v1', resource: 'secrets', verbs: ['create'], usedBy: 'ensureInternalTokenSecret' },
  // Each data source's credential Secret (backing-image-ds-<name>-credential): written before its pod, deleted with it.
  { group: '', version: 'v1', resource: 'secrets', verbs: ['create', 'update', 'delete'], usedBy: 'KubePodRuntime' },
  { group: '', version: 'v1', resource: 'pods', verbs: ['list', 'watch'], usedBy: 'NodeHealthMonitor' },
  // What the controllers record (Longhorn's recorder writes core/v1 Events on the involved object); the REST API's
  // `/v1/events` lists them. A repeat patches the count and lastTimestamp of the last event.
  { group: '', version: 'v1', resource: 'events', verbs: ['create', 'patch', 'list'], usedBy: 'KubeEventRecorder' },
  { group: '', version: 'v1', resource: 'nodes', verbs: ['get', 'list', 'watch'], usedBy: 'NodeHealthMonitor', scope: 'cluster' },
  // Longhorn's manager DaemonSet anywhere in the cluster: the daemon refuses to start beside Longhorn (one list at start).
  { group: 'apps', version: 'v1', resource: 'daemonsets', verbs: ['list'], usedBy: 'assertNoLonghorn', scope: 'cluster' },
];

/** Thrown when code tries a call that is not declared in `API_RESOURCE_USES` (a programming error, caught by tests). */
export class UndeclaredApiCallError extends Error {
  constructor(group: string, resource: string, verb: ApiVerb) {
    super(`Kubernetes API call ${verb} ${resource}${group ? '.' + group : ''} is not declared in API_RESOURCE_USES (and so not granted by the chart RBAC)`);
    this.name = 'UndeclaredApiCallError';
  }
}

/** Checks calls against the table; every Kubernetes call site goes through `require`. */
export class ApiAccess {
  private readonly allowed: Set<string>;
  constructor(readonly uses: readonly ApiResourceUse[] = API_RESOURCE_USES) {
    this.allowed = new Set(uses.flatMap((u) => u.verbs.map((v) => `${u.group}|${u.resource}|${v}`)));
  }
  require(group: string, resource: string, verb: ApiVerb): void {
    if (!this.allowed.has(`${group}|${resource}|${verb}`)) throw new UndeclaredApiCallError(group, resource, verb);
  }
  allows(group: string, resource: string, verb: ApiVerb): boolean {
    return this.allowed.has(`${group}|${resource}|${verb}`);
  }
}

/** An RBAC PolicyRule. */
export interface PolicyRule {
  apiGroups: string[];
  resources: string[];
  verbs: ApiVerb[];
}

const VERB_ORDER: readonly ApiVerb[] = ['get', 'list', 'watch', 'create', 'update', 'patch', 'delete'];

/**
 * RBAC rules granting exactly the table: resources with the same group and verb set are merged into one rule.
 * Stable order (group, then first resource) so the generated chart file is reproducible.
 */
export function rbacRules(uses: readonly ApiResourceUse[] = API_RESOURCE_USES, scope: 'namespace' | 'cluster' = 'namespace'): PolicyRule[] {
  uses = uses.filter((u) => (u.scope ?? 'namespace') === scope);
  const byKey = new Map<string, { group: string; verbs: ApiVerb[]; resources: Set<string> }>();
  const verbsOf = new Map<string, Set<ApiVerb>>();
  for (const u of uses) {
    const k = `${u.group}|${u.resource}`;
    const s = verbsOf.get(k) ?? new Set<ApiVerb>();
    for (const v of u.verbs) s.add(v);
    verbsOf.set(k, s);
  }
  for (const [k, set] of verbsOf) {
    const [group, resource] = k.split('|');
    const verbs = VERB_ORDER.filter((v) => set.has(v));
    const key = `${group}|${verbs.join(',')}`;
    const e = byKey.get(key) ?? { group, verbs, resources: new Set<string>() };
    e.resources.add(resource);
    byKey.set(key, e);
  }
  return [...byKey.values()]
    .map((e) => ({ apiGroups: [e.group], resources: [...e.resources].sort(), verbs: e.verbs }))
    .sort((a, b) => a.apiGroups[0].localeCompare(b.apiGroups[0]) || a.resources[0].localeCompare(b.resources[0]));
}
