#!/usr/bin/env node
// Writes charts/backing-image-system/templates/role.yaml from API_RESOURCE_USES (needs `nx run @bis/kube:build`).
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { renderRoleTemplate, RBAC_TEMPLATE_FILE } from '../dist/index.js';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const out = path.join(repoRoot, 'charts/backing-image-system', RBAC_TEMPLATE_FILE);
writeFileSync(out, renderRoleTemplate());
console.log(`wrote ${path.relative(repoRoot, out)}`);
