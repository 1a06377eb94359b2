import { stringify } from 'yaml';
import { rbacRules, API_RESOURCE_USES, type ApiResourceUse } from '../api-access.js';

export const RBAC_TEMPLATE_FILE = 'templates/role.yaml';
export const RBAC_TEMPLATE_HEADER =
  '# Generated from API_RESOURCE_USES in @bis/kube by libs/kube/scripts/generate-rbac.mjs. Do not edit: run `npx nx run @bis/kube:generate`.';

/**
 * The chart's Role: exactly the namespaced calls in `API_RESOURCE_USES`, in the release namespace (cluster-scoped
 * calls are in `renderClusterRoleTemplate`).
 */
export function renderRoleTemplate(uses: readonly ApiResourceUse[] = API_RESOURCE_USES): string {
  const rules = stringify({ rules: rbacRules(uses) }, { lineWidth: 0 });
  return [
    RBAC_TEMPLATE_HEADER,
    'apiVersion: rbac.authorization.k8s.io/v1',
    'kind: Role',
    'metadata:',
    '  name: backing-image-system',
    '  namespace: {{ .Release.Namespace }}',
    '  labels:',
    '    {{- include "bis.labels" . | nindent 4 }}',
    rules.trimEnd(),
    '',
  ].join('\n');
}

export const CLUSTER_RBAC_TEMPLATE_FILE = 'templates/clusterrole.yaml';

/**
 * The chart's ClusterRole and its ClusterRoleBinding to the service account: the cluster-scoped calls in
 * `API_RESOURCE_USES` (Kubernetes `nodes`, read by the node-health monitor).
 */
export function renderClusterRoleTemplate(uses: readonly ApiResourceUse[] = API_RESOURCE_USES): string {
  const rules = stringify({ rules: rbacRules(uses, 'cluster') }, { lineWidth: 0 });
  return [
    RBAC_TEMPLATE_HEADER,
    'apiVersion: rbac.authorization.k8s.io/v1',
    'kind: ClusterRole',
    'metadata:',
    '  name: backing-image-system',
    '  labels:',
    '    {{- include "bis.labels" . | nindent 4 }}',
    rules.trimEnd(),
    '---',
    'apiVersion: rbac.authorization.k8s.io/v1',
    'kind: ClusterRoleBinding',
    'metadata:',
    '  name: backing-image-system',
    '  labels:',
    '    {{- include "bis.labels" . | nindent 4 }}',
    'roleRef:',
    '  apiGroup: rbac.authorization.k8s.io',
    '  kind: ClusterRole',
    '  name: backing-image-system',
    'subjects:',
    '  - kind: ServiceAccount',
    '    name: {{ include "bis.serviceAccountName" . }}',
    '    namespace: {{ .Release.Namespace }}',
    '',
  ].join('\n');
}
