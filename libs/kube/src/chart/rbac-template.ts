import { stringify } from 'yaml';
import { rbacRules, API_RESOURCE_USES, type ApiResourceUse } from '../api-access.js';

export const RBAC_TEMPLATE_FILE = 'templates/role.yaml';
export const RBAC_TEMPLATE_HEADER =
  '# Generated from API_RESOURCE_USES in @bis/kube by libs/kube/scripts/generate-rbac.mjs. Do not edit: run `npx nx run @bis/kube:generate`.';

/**
 * The chart's Role: exactly the calls in `API_RESOURCE_USES`, in the release namespace (every object the system
 * touches is namespaced there, so no ClusterRole is needed).
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
