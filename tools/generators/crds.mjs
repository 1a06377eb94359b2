#!/usr/bin/env node
// Writes the CustomResourceDefinitions of the chart from the schema model in @bis/crd-types, as a template
// (charts/backing-image-system/templates/crds.yaml) so that `helm upgrade` updates them.
//   node tools/generators/crds.mjs           write the template
//   node tools/generators/crds.mjs --check   exit 1 if the committed template differs from a fresh rendering
// It imports the built library (libs/crd-types/dist); `npx nx run @bis/crd-types:generate` builds it first.
import { existsSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { CRD_TEMPLATE_FILE, renderCrdTemplate } from '@bis/crd-types';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const chartDir = join(repoRoot, 'charts/backing-image-system');
const check = process.argv.includes('--check');

const text = renderCrdTemplate();
const path = join(chartDir, CRD_TEMPLATE_FILE);
const current = existsSync(path) ? readFileSync(path, 'utf8') : undefined;
// Helm never upgrades files under crds/: the chart must not have that directory (its CRDs would shadow the template's).
const legacyDir = join(chartDir, 'crds');
const legacy = existsSync(legacyDir) ? readdirSync(legacyDir) : [];
if (check) {
  const problems = [];
  if (current !== text) problems.push(current === undefined ? `missing ${CRD_TEMPLATE_FILE}` : `outdated ${CRD_TEMPLATE_FILE}`);
  if (legacy.length > 0) problems.push(`crds/ still holds ${legacy.join(', ')}`);
  if (problems.length > 0) {
    console.error(`CRD template is not up to date (${problems.join(', ')}); run: npx nx run @bis/crd-types:generate`);
    process.exit(1);
  }
  console.log(`${CRD_TEMPLATE_FILE} up to date`);
} else {
  if (current !== text) {
    writeFileSync(path, text);
    console.log(`wrote charts/backing-image-system/${CRD_TEMPLATE_FILE}`);
  }
  if (existsSync(legacyDir)) {
    rmSync(legacyDir, { recursive: true, force: true });
    console.log('removed charts/backing-image-system/crds/');
  }
}
