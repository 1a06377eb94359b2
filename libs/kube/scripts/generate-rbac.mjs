#!/usr/bin/env node
// Writes charts/backing-image-system/templates/role.yaml and clusterrole.yaml from API_RESOURCE_USES (needs `nx run @bis/kube:build`).
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { renderClusterRoleTemplate, renderRoleTemplate, CLUSTER_RBAC_TEMPLATE_FILE, RBAC_TEMPLATE_FILE } from '../dist/index.js';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
for (const [file, text] of [[RBAC_TEMPLATE_FILE, renderRoleTemplate()], [CLUSTER_RBAC_TEMPLATE_FILE, renderClusterRoleTemplate()]]) {
  const out = path.join(repoRoot, 'charts/backing-image-system', file);
  writeFileSync(out, text);
  console.log(`wrote ${path.relative(repoRoot, out)}`);
}
